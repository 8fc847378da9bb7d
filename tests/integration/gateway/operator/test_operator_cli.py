"""``effectgate ledger …`` and ``effectgate jobs …`` against a real ledger: output formats and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from effectgate.gateway import cli, exit_codes
from effectgate.gateway.operator import documents
from effectgate.gateway.operator.cli import command
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger.claims import claim_delivery
from effectgate.ledger.refusals import RefusedEvent, keep_refused
from tests.integration.in_process_cli import run_cli
from tests.integration.jobs_and_workers import connected
from tests.integration.ledger.maintenance.retention_rows import delivery
from tests.integration.reports_seed import NOW, seeded_database

WINDOW = ["--since", (NOW - timedelta(hours=24)).isoformat(), "--until", NOW.isoformat()]


@pytest.fixture
def ledger(seeded_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The module's seeded ledger as DATABASE_URL; tests using it only read."""
    monkeypatch.setenv("DATABASE_URL", seeded_url)
    return seeded_url


@pytest.fixture
def own_ledger(pg_server_url: str, template_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A seeded ledger of this test's own, for commands that change it."""
    with seeded_database(pg_server_url, template_db) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        yield url


def test_duplicates_as_a_table_with_totals(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "ledger", "duplicates", *WINDOW)
    assert code == exit_codes.EXIT_OK
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("LAST SEEN"))
    assert "order-paid:1234" in lines[header + 1] and "2025-03-04T11:00:00Z" in lines[header + 1]
    assert "ship:9" in lines[header + 2]
    assert "totals over the window:" in out
    assert any(line.split()[:4] == ["stripe", "payment_intent.succeeded", "1", "3"] for line in lines)


def test_duplicates_as_json_is_the_api_document(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "ledger", "duplicates", *WINDOW, "--source", "shopify", "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert set(document) == {"since", "until", "sort", "items", "next_cursor", "totals"}
    assert [i["effect_key"] for i in document["items"]] == ["ship:9"]
    assert document["items"][0]["tenant"] == "acme"


def test_duplicates_as_csv_and_pages(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "ledger", "duplicates", *WINDOW, "--format", "csv", "--limit", "1")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0]) == documents.DUPLICATE_FIELDS
    assert [r["effect_key"] for r in rows] == ["order-paid:1234"]
    code, out, _ = run_cli(capsys, "ledger", "duplicates", *WINDOW, "--limit", "1")
    cursor = out.split("--cursor ")[1].split()[0]
    code, out, _ = run_cli(
        capsys, "ledger", "duplicates", *WINDOW, "--limit", "1", "--cursor", cursor, "--format", "csv"
    )
    assert [r["effect_key"] for r in csv.DictReader(io.StringIO(out))] == ["ship:9"]


@pytest.mark.parametrize(
    ("argv", "flag", "code"),
    [
        (["ledger", "duplicates", "--since", "yesterday"], "--since", "invalid_since"),
        (["ledger", "duplicates", "--limit", "0"], "--limit", "invalid_limit"),
        (["ledger", "duplicates", "--event-type", ""], "--event-type", "invalid_event_type"),
        (["ledger", "rejects", "--format", "csv"], "--kind", "invalid_kind"),
        (["ledger", "rejects", "--kind", "auth", "--tenant", "acme"], "--kind", "invalid_kind"),
        (["jobs", "list", "--state", "done"], "--state", "invalid_state"),
        (["jobs", "show", "abc"], "JOB_ID", "invalid_job_id"),
        (["jobs", "redrive", "0"], "JOB_ID", "invalid_job_id"),
    ],
)
def test_usage_mistakes_exit_2_naming_the_flag(
    ledger: str, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, code: str
) -> None:
    exit_code, out, err = run_cli(capsys, *argv)
    assert exit_code == 2
    assert err.startswith(f"effectgate: {flag}: ") and f"[{code}]" in err
    assert out == ""


def test_a_bad_choice_is_refused_by_the_parser(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli(capsys, "ledger", "duplicates", "--format", "xml")
    assert info.value.code == 2
    assert "--format" in capsys.readouterr().err


def test_rejects_show_conflicts_with_their_diff_and_auth_failures(
    ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "ledger", "rejects", *WINDOW)
    assert code == 0
    assert "evt_forged" in out and "/data/object/amount: 1000 → 999" in out and "/coupon: added" in out
    assert "signature_invalid" in out and "signature_missing" in out
    code, out, _ = run_cli(capsys, "ledger", "rejects", *WINDOW, "--format", "json")
    assert set(json.loads(out)) == {"conflicts", "refused", "auth"}
    code, out, _ = run_cli(capsys, "ledger", "rejects", *WINDOW, "--kind", "auth", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["source"], r["reason"], r["count"]) for r in rows] == [
        ("stripe", "signature_invalid", "1"),
        ("shopify", "signature_missing", "1"),
        ("stripe", "signature_invalid", "3"),
    ]


def test_show_answers_did_the_capture_happen_with_which_key(
    ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "ledger", "show", "order-paid:1234")
    assert code == 0
    assert "job      1 succeeded — done" in out
    [step] = [line for line in out.splitlines() if line.startswith("capture")]
    assert step.split()[:3] == ["capture", "succeeded", "eg_capture_key"]
    assert '{"id":"pi_1234","status":"succeeded"}' in step
    code, out, _ = run_cli(capsys, "ledger", "show", "order-paid:1234", "--format", "csv")
    timeline = list(csv.DictReader(io.StringIO(out)))
    assert [t["what"] for t in timeline] == [
        "delivery accepted",
        "attempt 1 started",
        "step capture succeeded",
        "attempt 1 ended",
        "job succeeded",
        "delivery duplicate",
        "delivery duplicate",
        "delivery rejected",
        "reject (key conflict)",
    ]
    code, out, _ = run_cli(capsys, "ledger", "show", "ship:9", "--format", "json")
    assert json.loads(out)["effect"]["tenant"] == "acme"


def test_not_found_exits_3(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "ledger", "show", "order-paid:404")
    assert (code, out) == (3, "")
    assert "not found" in err
    code, out, _ = run_cli(capsys, "jobs", "show", "99999", "--format", "json")
    assert code == 3
    assert json.loads(out)["error"] == "not_found"


def test_jobs_list_and_show(ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "jobs", "list", "--state", "failed,parked")
    assert code == 0
    [row] = [line for line in out.splitlines() if "order-paid:1" in line]
    assert row.split()[1:5] == ["failed", "fulfil_order", "stripe", "order-paid:1"]
    assert "card declined" in row
    code, out, _ = run_cli(capsys, "jobs", "list", "--kind", "ship_order", "--format", "csv")
    assert [r["effect_key"] for r in csv.DictReader(io.StringIO(out))] == ["ship:9"]
    job_id = row.split()[0]
    code, out, _ = run_cli(capsys, "jobs", "show", job_id)
    assert code == 0
    assert "TransientError: 502 from provider" in out and "TerminalError: card declined" in out


def test_redrive_and_cancel_with_exit_codes_for_refusals(
    own_ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "jobs", "list", "--format", "json")
    ids = {j["effect_key"]: j["id"] for j in json.loads(out)["items"]}
    failed, done, pending = ids["order-paid:1"], ids["order-paid:1234"], ids["ship:9"]

    assert run_cli(capsys, "jobs", "redrive", str(failed)) == (
        0,
        f"job {failed}: redriven, now pending\n",
        "",
    )
    code, out, err = run_cli(capsys, "jobs", "redrive", str(failed))
    assert code == exit_codes.EXIT_REFUSED
    assert err.startswith("effectgate: refused: not_redrivable: ")
    code, out, _ = run_cli(capsys, "jobs", "redrive", str(done), "--format", "json")
    assert (code, json.loads(out)["error"]) == (4, "not_redrivable")
    assert run_cli(capsys, "jobs", "redrive", "99999")[0] == exit_codes.EXIT_NOT_FOUND

    # An operator's reason on every command that takes one (ledger.jobs.audit.check_note), refused before the
    # action: the cancel and the pause stored any text before issue 52.
    for argv in (
        ("jobs", "cancel", str(pending), "--reason", "x" * 501),
        ("jobs", "cancel", "--state", "pending", "--reason", "x" * 501),
        ("jobs", "pause", "--kind", "ship_order", "--reason", "line\nbreak"),
        ("jobs", "redrive", str(done), "--reason", "\x01"),
    ):
        code, _, err = run_cli(capsys, *argv)
        assert (code, "invalid_reason" in err) == (exit_codes.EXIT_USAGE, True), argv
    code, out, _ = run_cli(capsys, "jobs", "paused", "--format", "json")
    assert json.loads(out)["paused"] == []
    assert run_cli(capsys, "jobs", "cancel", str(pending), "--reason", "customer asked")[:2] == (
        0,
        f"job {pending}: cancelled\n",
    )
    code, _, err = run_cli(capsys, "jobs", "cancel", str(done))
    assert code == 4 and "not_cancellable" in err
    code, out, _ = run_cli(capsys, "jobs", "show", str(pending), "--format", "json")
    job = json.loads(out)["job"]
    assert (job["state"], job["terminal_reason"]) == ("cancelled", "customer asked")
    assert job["terminal_by"].startswith("cli")


def test_resolve_by_hand_with_who_why_and_exit_codes_for_refusals(
    own_ledger: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(capsys, "jobs", "list", "--format", "json")
    ids = {j["effect_key"]: j["id"] for j in json.loads(out)["items"]}
    failed, done, pending = ids["order-paid:1"], ids["order-paid:1234"], ids["ship:9"]

    # --reason is required: argparse names the flag; an empty one names it too.
    with pytest.raises(SystemExit) as usage:
        run_cli(capsys, "jobs", "resolve", str(failed))
    assert usage.value.code == exit_codes.EXIT_USAGE
    assert "the following arguments are required: --reason" in capsys.readouterr().err
    code, _, err = run_cli(capsys, "jobs", "resolve", str(failed), "--reason", "  ")
    assert code == exit_codes.EXIT_USAGE and "invalid_reason" in err

    monkeypatch.setattr(command.getpass, "getuser", lambda: "alice")
    code, out, _ = run_cli(capsys, "jobs", "resolve", str(failed), "--reason", "refunded in Stripe")
    assert code == 0
    assert out.startswith(f"job {failed}: resolved by hand (was failed) by cli:alice at ")
    assert out.endswith(": refunded in Stripe\n")
    code, out, _ = run_cli(
        capsys, "jobs", "resolve", str(failed), "--reason", "refunded in Stripe", "--format", "json"
    )
    answer = json.loads(out)
    assert (code, answer["already"], answer["resolved_by"], answer["state"]) == (
        0,
        True,
        "cli:alice",
        "resolved",
    )
    code, _, err = run_cli(capsys, "jobs", "resolve", str(failed), "--reason", "other", "--by", "bob")
    assert code == exit_codes.EXIT_REFUSED and err.startswith("effectgate: refused: already_resolved: ")
    assert "cli:alice" in err
    code, _, err = run_cli(capsys, "jobs", "resolve", str(pending), "--reason", "x")
    assert code == exit_codes.EXIT_REFUSED and "not_resolvable" in err and "cancel it instead" in err
    code, _, err = run_cli(capsys, "jobs", "resolve", str(done), "--reason", "x")
    assert code == exit_codes.EXIT_REFUSED and "not_resolvable" in err
    assert run_cli(capsys, "jobs", "resolve", "99999", "--reason", "x")[0] == exit_codes.EXIT_NOT_FOUND
    code, _, err = run_cli(capsys, "jobs", "redrive", str(failed), "--force")
    assert code == exit_codes.EXIT_REFUSED and "not_redrivable" in err

    # Every face shows who and why: jobs show, jobs list, ledger show (job line and timeline).
    code, out, _ = run_cli(capsys, "jobs", "show", str(failed))
    assert "resolved_by" in out and "cli:alice" in out and "refunded in Stripe" in out
    code, out, _ = run_cli(capsys, "jobs", "list", "--state", "resolved")
    [row] = [line for line in out.splitlines() if line.startswith(str(failed))]
    assert "resolved" in row and "resolved by cli:alice: refunded in Stripe" in row
    code, out, _ = run_cli(capsys, "jobs", "list", "--state", "failed,parked", "--format", "json")
    assert failed not in [j["id"] for j in json.loads(out)["items"]]
    code, out, _ = run_cli(capsys, "ledger", "show", "order-paid:1")
    assert "resolved by hand from failed by cli:alice" in out
    assert "job resolved by hand" in out and "refunded in Stripe (by cli:alice)" in out


def test_bulk_resolve_uses_the_shared_filter(own_ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "jobs", "resolve", "--reason", "outage handled")
    assert code == exit_codes.EXIT_USAGE and "give a JOB_ID, or a filter" in err
    code, out, _ = run_cli(
        capsys, "jobs", "resolve", "--state", "failed,pending", "--reason", "outage handled", "--dry-run"
    )
    assert code == 0 and "would be resolved by hand: 1" in out and "would be refused not_resolvable" in out
    code, out, err = run_cli(
        capsys, "jobs", "resolve", "--state", "failed,pending", "--reason", "outage handled", "--by", "ops"
    )
    assert code == exit_codes.EXIT_REFUSED and "some_refused" in err
    assert "resolved by hand: 1" in out
    code, out, _ = run_cli(capsys, "jobs", "list", "--state", "resolved", "--format", "json")
    [job] = json.loads(out)["items"]
    assert (job["effect_key"], job["resolved_by"], job["resolved_reason"]) == (
        "order-paid:1",
        "cli:ops",
        "outage handled",
    )


def test_ledger_retention_reports_windows_purges_and_tombstones(
    own_ledger: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    from datetime import UTC, datetime

    from effectgate.ledger import db
    from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper

    async def purge() -> None:
        conn = await db.connect(own_ledger)
        async with conn:
            config = RetentionConfig(payloads=1 * DAY, history=2 * DAY)
            await RetentionKeeper(config).run_once(conn, now=datetime(2032, 1, 1, tzinfo=UTC))

    asyncio.run(purge())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EFFECTGATE_CONFIG", raising=False)
    code, out, _ = run_cli(capsys, "ledger", "retention")
    assert code == exit_codes.EXIT_OK
    assert "windows from: the defaults" in out
    [deliveries] = [line for line in out.splitlines() if line.startswith("deliveries ")]
    assert deliveries.split()[1] == "90"  # the default history window, in days
    code, out, _ = run_cli(capsys, "ledger", "retention", "--format", "json")
    document = json.loads(out)
    by = {t["what"]: t for t in document["tables"]}
    assert by["deliveries"]["purged_total"] > 0 and by["deliveries"]["oldest_held"] is None
    assert by["effects"]["window_days"] is None and document["tombstones"] > 0
    # A configuration file's windows apply; a broken one is a usage mistake naming the key.
    (tmp_path / "eg.toml").write_text(
        '[sources.s]\nscheme = "stripe"\nsecrets = ["S"]\n[retention]\nhistory_days = "x"\n'
    )
    monkeypatch.setenv("S", "whsec_x")
    code, _, err = run_cli(capsys, "ledger", "retention", "--config", str(tmp_path / "eg.toml"))
    assert code == exit_codes.EXIT_USAGE and "retention.history_days" in err


def test_every_report_is_a_ledger_command_from_its_spec(
    ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "ledger", "delivery-outcomes", *WINDOW)
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("SOURCE"))
    assert lines[header].split()[:3] == ["SOURCE", "DELIVERIES", "ACCEPTED"]
    assert lines[header + 1].split()[:5] == ["stripe", "5", "2", "2", "1"]
    code, out, _ = run_cli(
        capsys, "ledger", "delivery-outcomes", *WINDOW, "--sort", "source", "--format", "json"
    )
    assert [(r["source"], r["duplicate_rate"]) for r in json.loads(out)["items"]] == [
        ("shopify", 0.5),
        ("stripe", 0.4),
    ]
    code, _, err = run_cli(capsys, "ledger", "delivery-outcomes", "--sort", "amount")
    assert code == 2 and err.startswith("effectgate: --sort: ") and "[invalid_sort]" in err


# -- every command's table output, on real rows ----------------------------------------------------

REPLAY_HANDLERS = """\
from effectgate import effect


@effect(source="stripe", events=["thing.*"], key=lambda ev: f"order:{ev.payload['key']}", name="replayed")
async def replayed(ctx, ev):
    return None
"""


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf command under ``parser``, as its words."""
    found: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= _commands(child, (*prefix, name)) or {(*prefix, name)}
    return found


def _operator_commands() -> set[tuple[str, ...]]:
    return {c for c in _commands(cli.build_parser()) if c[0] in ("ledger", "jobs")}


def _prepare(
    command: tuple[str, ...], url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: Any
) -> tuple[list[str], list[str]]:
    """What to run after getting the ledger ready for ``command``, and what its output must show (words
    only a real row of the seeded ledger has)."""
    _, out, _ = run_cli(capsys, "jobs", "list", "--format", "json")
    ids = {j["effect_key"]: str(j["id"]) for j in json.loads(out)["items"]}
    match command:
        case ("ledger", "duplicates"):
            return WINDOW, ["order-paid:1234", "stripe"]
        case ("ledger", "key-conflicts"):
            return WINDOW, ["order-paid:1234"]
        case ("ledger", "auth-failures"):
            return WINDOW, ["signature_invalid"]
        case ("ledger", "jobs"):
            return WINDOW, ["fulfil_order", "failed"]
        case ("ledger", "refused-deliveries"):
            asyncio.run(_refused(url))
            return WINDOW, ["evt_refused_table", "effect_key_failed", "shop.capture", "KeyError: 'order_id'"]
        case ("ledger", "delivery-outcomes"):
            return WINDOW, ["DUPLICATES", "shopify  2           1         1"]
        case ("ledger", "rejects"):
            return WINDOW, ["order-paid:1234", "signature_invalid"]
        case ("ledger", "show"):
            return ["order-paid:1234"], ["order-paid:1234", "succeeded"]
        case ("ledger", "replay"):
            asyncio.run(_unmatched(url))
            (tmp_path / "replay_table_mod.py").write_text(REPLAY_HANDLERS)
            (tmp_path / "eg.toml").write_text(
                '[handlers]\nmodules = ["replay_table_mod"]\n'
                '[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n'
            )
            monkeypatch.syspath_prepend(str(tmp_path))
            monkeypatch.setattr(REGISTRY, "_kinds", {})
            monkeypatch.setenv("S", "whsec_x")
            args = [
                "--unmatched",
                "--source",
                "stripe",
                "--since",
                "1h",
                "--config",
                str(tmp_path / "eg.toml"),
            ]
            return args, ["2 unmatched deliveries of stripe replayed", "effects accepted: 2"]
        case ("ledger", "retention"):
            monkeypatch.chdir(tmp_path)
            monkeypatch.delenv("EFFECTGATE_CONFIG", raising=False)
            return [], ["deliveries", "effects"]
        case ("jobs", "list"):
            return [], ["order-paid:1", "card declined"]
        case ("jobs", "show"):
            return [ids["order-paid:1"]], ["TerminalError: card declined"]
        case ("jobs", "redrive"):
            return [ids["order-paid:1"]], [f"job {ids['order-paid:1']}: redriven"]
        case ("jobs", "cancel"):
            return [ids["ship:9"]], [f"job {ids['ship:9']}: cancelled"]
        case ("jobs", "resolve"):
            job_id = ids["order-paid:1"]
            return [job_id, "--reason", "refunded by phone"], [
                f"job {job_id}: resolved by hand (was failed)",
                "refunded by phone",
            ]
        case ("jobs", "pause"):
            return ["--kind", "ship_order"], ["kind ship_order: paused"]
        case ("jobs", "resume"):
            assert run_cli(capsys, "jobs", "pause", "--kind", "ship_order")[0] == 0
            return ["--kind", "ship_order"], ["kind ship_order: resumed"]
        case ("jobs", "paused"):
            assert (
                run_cli(capsys, "jobs", "pause", "--kind", "ship_order", "--reason", "carrier down")[0] == 0
            )
            return [], ["ship_order", "carrier down"]
    raise AssertionError(f"no table test for `effectgate {' '.join(command)}`: add one here")


async def _unmatched(url: str) -> None:
    async with connected(url) as conn:
        for n in range(2):
            await claim_delivery(conn, delivery(f"table{n}"), [])


async def _refused(url: str) -> None:
    async with connected(url) as conn:
        await keep_refused(
            conn,
            request_id="req_refused_table",
            source="stripe",
            secret_index=0,
            events=[RefusedEvent("evt_refused_table", "charge.succeeded", "default", '{"id": 1}', "f" * 64)],
            refusal={
                "reason": "effect_key_failed",
                "handler": "shop.capture",
                "error": "KeyError: 'order_id'",
                "event_id": "evt_refused_table",
            },
            body=b'{"id": 1}',
            now=NOW - timedelta(minutes=5),
        )


# Read from the parser: a command added without a case in _prepare fails its own parametrised test.
TABLE_COMMANDS = sorted(_operator_commands())


@pytest.mark.parametrize("command", TABLE_COMMANDS, ids=" ".join)
def test_every_operator_commands_table_output_shows_real_rows(
    command: tuple[str, ...],
    own_ledger: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args, shown = _prepare(command, own_ledger, capsys, tmp_path, monkeypatch)
    code, out, err = run_cli(capsys, *command, *args)
    assert (code, err) == (exit_codes.EXIT_OK, ""), err
    for words in shown:
        assert words in out, f"{words!r} not in:\n{out}"
