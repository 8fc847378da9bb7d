"""A record an auditor can read (issue 38, item 4), through every face against a real ledger: a redrive that
would replay a recorded card decline is refused without force and warns with it; every operator action is in
the effect's timeline with who, when and why; an attempt keeps the provider's HTTP status, request id and
decline code; a step recovered by find= says so; the dashboard shows a redriven job's history truthfully."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from effectgate.handlers import EffectContext, Event, TransientError
from effectgate.handlers.actions import bulk as bulk_actions
from effectgate.handlers.downstream import classify_response
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.jobs import audit
from effectgate.ledger.jobs import filters as ledger_filters
from effectgate.ledger.vocabulary import RefusalCode
from tests.integration.gateway.operator.operator_app import (
    OPERATE,
    OPERATE_TOKEN,
    check,
    dashboard,
    gateway,
    text,
)
from tests.integration.in_process_cli import run_cli
from tests.integration.jobs_and_workers import claim, connected, kind, make_worker, registry

REQUEST_ID = "req_8f2cA1"
FACTS = {
    "code": "card_declined",
    "http_status": 402,
    "request_id": REQUEST_ID,
    "decline_code": "insufficient_funds",
}
FACTS_TEXT = f"HTTP 402, decline insufficient_funds, request {REQUEST_ID}"


def decline() -> httpx.Response:
    """Stripe's answer to a capture of a declined card, as it sends it."""
    return httpx.Response(
        402,
        json={
            "error": {
                "type": "card_error",
                "code": "card_declined",
                "decline_code": "insufficient_funds",
                "message": "Your card was declined.",
            }
        },
        headers={"Request-Id": REQUEST_ID},
        request=httpx.Request("POST", "https://api.stripe.com/v1/payment_intents/pi_1/capture"),
    )


def declining(calls: list[str]) -> Registry:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def capture(key: str) -> dict[str, Any]:
            calls.append(key)
            return classify_response(decline())

        await ctx.step("capture", capture)

    return registry(kind(handler))


async def declined_job(p: db.Pool, calls: list[str], key: str = "order:1") -> int:
    """A job whose capture step recorded a terminal card decline, run by a real worker."""
    async with p.connection() as conn:
        job_id = await claim(conn, key)
    await make_worker(p, declining(calls)).run_until_idle()
    return job_id


@pytest.mark.anyio
async def test_a_redrive_that_would_replay_a_recorded_decline_needs_force_and_says_so(pool: db.Pool) -> None:
    calls: list[str] = []
    job_id = await declined_job(pool, calls)
    async with pool.connection() as conn:
        view = await reports.job_view(conn, job_id)
        assert view is not None and view.job["state"] == "failed"
        # The attempt and the step keep what Stripe said.
        [attempt] = view.attempts
        assert attempt["error_facts"] == FACTS
        [step] = view.steps
        assert {k: step["error"][k] for k in FACTS} == FACTS
        assert view.job["last_error"] is not None and view.job["last_error"]["request_id"] == REQUEST_ID

        refused = await jobs.redrive(conn, job_id, by="cli:alice")
        assert refused is not None and refused.code == RefusalCode.RECORDED_FAILURE_REQUIRES_FORCE
        assert (
            "capture (card_declined: " in refused.detail and "without calling the provider" in refused.detail
        )

        # The bulk dry run counts such jobs: refused without force, "replaying" with it; nothing changes.
        where = ledger_filters.JobFilter(states=("failed",), kind="k")
        dry = await bulk_actions.run(conn, Registry(), "redrive", where, by="cli:alice", dry_run=True)
        assert dry.refused == {"recorded_failure_requires_force": [job_id]} and dry.done == []
        forced = await bulk_actions.run(
            conn, Registry(), "redrive", where, by="cli:alice", force=True, dry_run=True
        )
        assert forced.summary()["replaying_recorded_failure"] == 1 and forced.done == [job_id]
        assert (await jobs.get(conn, job_id) or {}).get("state") == "failed"
        assert await audit.for_job(conn, job_id, kind="k", since=view.job["created_at"], until=None) == []

        assert (
            await jobs.redrive(conn, job_id, by="cli:alice", reason="customer re-authorized", force=True)
            is None
        )
        [action] = [a for a in (await reports.job_view(conn, job_id) or view).actions]
        assert (action["action"], action["acted_by"], action["reason"]) == (
            "redrive",
            "cli:alice",
            "customer re-authorized",
        )
        assert action["detail"] == {
            "force": True,
            "replays": [{"step": "capture", "code": "card_declined", "message": step["error"]["message"]}],
        }

    # As warned: the next run replays the decline, without calling Stripe, and still names its request id.
    await make_worker(pool, declining(calls)).run_until_idle()
    assert len(calls) == 1
    async with pool.connection() as conn:
        view = await reports.job_view(conn, job_id)
    assert view is not None and view.job["state"] == "failed"
    assert [a["error_facts"] for a in view.attempts] == [FACTS, FACTS]


@pytest.mark.anyio
async def test_a_step_recovered_by_find_is_recorded_as_found_and_shown_so(pool: db.Pool) -> None:
    made: list[str] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def create(key: str) -> dict[str, Any]:
            made.append(key)
            raise TransientError("read timeout")  # made downstream; the answer was lost

        async def find(key: str) -> dict[str, Any] | None:
            return {"id": "obj_1", "reference": key} if key in made else None

        await ctx.step("ship", create, find=find)
        await ctx.step("note", lambda key: _answer({"ok": True}))

    async with pool.connection() as conn:
        await claim(conn, "order:9")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        view = await reports.effect_view(conn, "order:9")
    assert view is not None and view.job is not None and view.job["state"] == "succeeded"
    assert {s["name"]: s["found"] for s in view.steps} == {"ship": True, "note": False}
    from effectgate.gateway.operator import documents, timeline

    events = timeline.events(documents.effect(view))
    assert any(e["what"] == "step ship succeeded (found by find=, not called)" for e in events)
    assert any(e["what"] == "step note succeeded" for e in events)


async def _answer(value: dict[str, Any]) -> dict[str, Any]:
    return value


def declined_in(url: str, calls: list[str]) -> int:
    async def go() -> int:
        p = db.make_pool(url, min_size=1, max_size=4, name="effectgate-test")
        await p.open(wait=True)
        try:
            return await declined_job(p, calls)
        finally:
            await p.close()

    return asyncio.run(go())


def test_the_cli_refuses_warns_and_every_action_is_in_the_timeline(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    job_id = declined_in(db_url, [])

    code, out, err = run_cli(capsys, "jobs", "redrive", str(job_id), "--format", "json")
    assert code == 4 and "refused: recorded_failure_requires_force: " in err
    assert json.loads(out)["error"] == "recorded_failure_requires_force"
    code, out, _ = run_cli(capsys, "jobs", "redrive", "--kind", "k", "--state", "failed", "--dry-run")
    assert code == 0 and "would be refused recorded_failure_requires_force: 1" in out
    code, out, _ = run_cli(
        capsys, "jobs", "redrive", "--kind", "k", "--dry-run", "--force", "--state", "failed"
    )
    assert "replays without calling the provider: 1" in re.sub(r"\s+", " ", out)

    code, out, _ = run_cli(
        capsys, "jobs", "redrive", str(job_id), "--force", "--reason", "customer re-authorized"
    )
    assert code == 0 and out.startswith(f"job {job_id}: redriven, now pending")
    assert "warning: step capture (card_declined: " in out and "the provider will not be called" in out
    code, _, _ = run_cli(capsys, "jobs", "pause", "--kind", "k", "--reason", "stripe outage")
    code, _, _ = run_cli(capsys, "jobs", "resume", "--kind", "k", "--reason", "stripe is back")
    code, _, _ = run_cli(capsys, "jobs", "cancel", str(job_id), "--reason", "duplicate order")
    assert code == 0

    code, out, _ = run_cli(capsys, "ledger", "show", "order:1")
    assert code == 0
    timeline = out.split("\ntimeline:\n")[1]
    lines = [line for line in timeline.splitlines() if "  job " in line or "  kind " in line]
    whats = [re.split(r"\s{2,}", line)[1] for line in lines]
    # The job row says how it stands (cancelled); the attempt's end and the actions say how it got there.
    assert whats[:3] == ["job redriven", "kind k paused", "kind k resumed"]
    assert whats[3:] == ["job cancelled", "job cancelled"]  # how it ended, and the operator's action
    assert f"failed [{FACTS_TEXT}]" in timeline  # a table cuts long cells: the facts come first
    assert "customer re-authorized (by cli:" in timeline
    # In full (a table cuts long cells; CSV and JSON do not):
    code, out, _ = run_cli(capsys, "ledger", "show", "order:1", "--format", "csv")
    [redrive] = [line for line in out.splitlines() if ",job redriven," in line]
    assert "customer re-authorized (by cli:" in redrive
    assert "; force; step capture replays card_declined: the provider will not be called" in redrive
    assert FACTS_TEXT in out
    assert "stripe outage (by cli:" in timeline and "duplicate order (by cli:" in timeline

    code, out, _ = run_cli(capsys, "jobs", "show", str(job_id))
    assert FACTS_TEXT in out
    assert "redriven by cli:" in out and "(customer re-authorized), with force" in out
    assert "operator actions" in out and "kind k paused" in out
    code, out, _ = run_cli(capsys, "jobs", "show", str(job_id), "--format", "json")
    document = json.loads(out)
    assert [a["action"] for a in document["actions"]] == ["redrive", "pause", "resume", "cancel"]
    assert document["attempts"][0]["error_facts"] == FACTS


@pytest.mark.anyio
async def test_the_api_needs_force_counts_dry_runs_and_answers_actions_in_the_lineage(
    pool: db.Pool, db_url: str
) -> None:
    job_id = await declined_job(pool, [])
    async with gateway(db_url) as client:
        refused = await client.post(f"/api/jobs/{job_id}/redrive", headers=OPERATE)
        assert refused.status_code == 409
        assert (
            check(refused, "/api/jobs/{job_id}/redrive", "post")["error"] == "recorded_failure_requires_force"
        )
        dry = await client.post("/api/jobs/redrive?kind=k&state=failed&dry_run=true", headers=OPERATE)
        assert check(dry, "/api/jobs/redrive", "post")["refused"] == {"recorded_failure_requires_force": 1}
        dry = await client.post(
            "/api/jobs/redrive?kind=k&state=failed&dry_run=true&force=true", headers=OPERATE
        )
        assert check(dry, "/api/jobs/redrive", "post")["replaying_recorded_failure"] == 1

        done = await client.post(
            f"/api/jobs/{job_id}/redrive?force=true&reason=card+updated", headers=OPERATE
        )
        body = check(done, "/api/jobs/{job_id}/redrive", "post")
        assert body["state"] == "pending" and [r["step"] for r in body["replays"]] == ["capture"]
        paused = await client.post("/api/kinds/k/pause?reason=outage", headers=OPERATE)
        assert paused.status_code == 200
        resumed = await client.post("/api/kinds/k/resume?reason=over", headers=OPERATE)
        assert check(resumed, "/api/kinds/{kind}/resume", "post") == {"kind": "k", "paused": False}

        lineage = check(await client.get("/api/effects/order:1", headers=OPERATE), "/api/effects/{key}")
        assert [(a["action"], a["acted_by"], a["reason"]) for a in lineage["actions"]] == [
            ("redrive", "operator:admin", "card updated"),
            ("pause", "operator:admin", "outage"),
            ("resume", "operator:admin", "over"),
        ]
        assert lineage["attempts"][0]["error_facts"] == FACTS
        job = check(await client.get(f"/api/jobs/{job_id}", headers=OPERATE), "/api/jobs/{job_id}")
        assert job["actions"] == lineage["actions"]


@pytest.mark.anyio
async def test_the_dashboard_confirms_a_replaying_redrive_and_shows_a_redriven_job_truthfully(
    pool: db.Pool, db_url: str
) -> None:
    job_id = await declined_job(pool, [])
    async with dashboard(db_url, OPERATE_TOKEN) as operator:
        page = (await operator.get(f"/ui/jobs/{job_id}")).text
        assert 'id="last-error"' in page and 'id="earlier-error"' not in page
        assert FACTS_TEXT in text(page)
        confirm = re.search(r'<label class="warning" id="replay-confirm">.*?</label>', page)
        assert confirm is not None and "required" in confirm[0]
        assert "step capture replays its recorded error (card_declined)" in confirm[0]
        assert "the provider will not be called" in confirm[0]
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None

        unconfirmed = await operator.post(f"/ui/jobs/{job_id}/redrive", data={"csrf": csrf[1]})
        assert unconfirmed.headers["location"] == f"/ui/jobs/{job_id}?refused=recorded_failure_requires_force"
        confirmed = await operator.post(
            f"/ui/jobs/{job_id}/redrive",
            data={"csrf": csrf[1], "force": "true", "reason": "customer re-authorized"},
        )
        assert confirmed.headers["location"] == f"/ui/jobs/{job_id}?done=redriven_replaying"
        notice = text((await operator.get(confirmed.headers["location"])).text)
        assert "without calling the provider" in notice

        # The handler was changed to take the decline in its stride: the second run succeeds.
        async with pool.connection() as conn:
            [lease] = await jobs.fetch_and_lease(conn, owner="worker-2", kinds={"k": 30}, limit=1)
            await jobs.finish(
                conn, job_id, lease.lease_token, state="succeeded", by="worker-2", reason="done"
            )

        page = (await operator.get(f"/ui/jobs/{job_id}")).text
        # No red "Last error" box on a succeeded job: the earlier error, in a neutral box.
        assert 'id="last-error"' not in page and "errorbox" not in page
        assert 'id="earlier-error"' in page and "the job is succeeded now" in text(page)
        # Attempts numbered across the redrive, with who, when and why between them.
        history = re.search(r'<table id="attempts">.*?</table>', page, re.S)
        assert history is not None
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", history[0], re.S)[1:]
        assert len(rows) == 3
        assert text(rows[0]).split()[:2] == ["1", "1"]
        assert (
            "redriven by operator:admin at " in rows[1] and "(customer re-authorized), with force" in rows[1]
        )
        assert text(rows[2]).split()[:2] == ["2", "1"]  # the job's own count restarted; the history's did not

        effect = (await operator.get("/ui/effects/order:1")).text
        timeline = re.search(r'<table id="timeline">.*?</table>', effect, re.S)
        assert timeline is not None
        assert "job redriven" in timeline[0] and "customer re-authorized" in timeline[0]
        assert "step capture failed" in timeline[0]


@pytest.mark.anyio
async def test_replay_records_who_claimed_the_job(db_url: str) -> None:
    from effectgate.handlers.actions.replay import replay_unmatched
    from tests.integration.handlers.actions.fulfil_registry import fulfil_registry
    from tests.integration.ledger.maintenance.retention_rows import day, delivery

    async with connected(db_url) as conn:
        from effectgate.ledger.claims import claim_delivery

        assert await claim_delivery(conn, delivery("k0"), [], now=day(0)) == []
        result = await replay_unmatched(
            conn, by="cli:alice", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(1)
        )
        assert dict(result.outcomes) == {"accepted": 1}
        view = await reports.effect_view(conn, "order:k0")
        assert view is not None
        [action] = view.actions
        assert (action["action"], action["acted_by"]) == ("replay", "cli:alice")
        assert action["detail"] is not None and action["detail"]["source"] == "unmatched"
