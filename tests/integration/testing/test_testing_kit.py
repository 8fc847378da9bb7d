"""``effectgate.testing`` against the real thing: the in-memory twin records what a real worker records
on real Postgres (keys, answers, terminal errors, started markers), and the pytest plugin's
``effectgate_ledger`` claims as the ingress does and runs jobs through the worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.ledger.claims import Accepted, Duplicate
from effectgate.ledger.jobs.steps import RecordedStep
from effectgate.testing import MemoryContext, TestLedger, context_for, example_event, run_handler

pytestmark = pytest.mark.anyio


def _registry(fn: Any) -> Registry:
    reg = Registry()
    reg.register(
        EffectKind(
            name="fulfil",
            source="shop",
            events=("payment_intent.succeeded",),
            fn=fn,
            key=lambda ev: f"order:{ev.payload['data']['object']['metadata']['order_id']}",
        )
    )
    return reg


def _seen(recorded: dict[str, RecordedStep] | Any) -> dict[str, tuple[str, str, Any, Any]]:
    return {n: (s.idempotency_key, str(s.status), s.result, s.error) for n, s in recorded.items()}


# Objects "created" downstream by reference, shared by the real run and the twin's.
CREATED: dict[str, dict[str, str]] = {}


def make_fulfil(*, declined: bool) -> Any:
    async def fulfil(ctx: EffectContext, ev: Event) -> None:
        await _fulfil(ctx, ev, declined=declined)

    return fulfil


async def _fulfil(ctx: EffectContext, ev: Event, *, declined: bool) -> None:
    intent = ev.payload["data"]["object"]["id"]

    async def capture(idem: str) -> dict[str, Any]:
        return {"id": intent, "status": "succeeded", "amounts": (4200,)}

    async def create(idem: str) -> dict[str, str]:
        CREATED[idem] = {"reference": idem}
        if ctx.attempt == 1:
            raise TransientError("the answer was lost")
        return CREATED[idem]

    async def find(idem: str) -> dict[str, str] | None:
        return CREATED.get(idem)

    await ctx.step("capture", capture)
    await ctx.step("label", create, find=find)
    if declined:
        await ctx.step("ship", _declined)


async def _declined(idem: str) -> None:
    raise TerminalError("address refused", code="bad_address")


@pytest.mark.parametrize("declined", [False, True])
async def test_the_twin_records_what_the_real_worker_records(
    effectgate_ledger: TestLedger, declined: bool
) -> None:
    reg = _registry(make_fulfil(declined=declined))
    event_id = f"evt_twin_{declined}"
    ev = example_event("stripe", event_id=event_id, source="shop", tenant="acme")
    [claimed] = await effectgate_ledger.deliver(ev, registry=reg)
    assert isinstance(claimed, Accepted)
    twin: MemoryContext = context_for(ev, registry=reg)
    assert twin.effect_key == claimed.effect_key and twin.tenant == "acme"

    attempts = []
    for _ in range(2):
        real = await effectgate_ledger.run_job("fulfil", registry=reg)
        try:
            await run_handler(twin, registry=reg)
            twin_outcome = "succeeded"
        except TransientError:
            twin_outcome = "pending"
        except TerminalError:
            twin_outcome = "failed"
        attempts.append((real.state, twin_outcome))
        # Same keys, same answers (after the jsonb round trip), same terminal errors, same started marker.
        assert _seen(real.steps) == _seen(twin.steps)
        twin = twin.rerun()
    terminal = "failed" if declined else "succeeded"
    assert attempts == [("pending", "pending"), (terminal, terminal)]


async def test_a_second_delivery_of_the_event_is_a_duplicate(effectgate_ledger: TestLedger) -> None:
    reg = _registry(make_fulfil(declined=False))
    ev = example_event("stripe", event_id="evt_dup", source="shop")
    assert [type(o) for o in await effectgate_ledger.deliver(ev, registry=reg)] == [Accepted]
    assert [type(o) for o in await effectgate_ledger.deliver(ev, registry=reg)] == [Duplicate]
    with pytest.raises(LookupError, match="no handler named 'nope'"):
        await effectgate_ledger.run_job("nope", registry=reg)


def test_the_plugins_database_names_take_the_configured_prefix(
    effectgate_server_url: str, tmp_path: Path
) -> None:
    # A user's suite on a shared server whose naming rule is "shop_ci_*": the ini option, then the variable.
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["effectgate.testing.pytest_plugin"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\neffectgate_database_prefix = shop_ci\n")
    (tmp_path / "test_user.py").write_text(
        "from psycopg.conninfo import conninfo_to_dict\n"
        "def test_named(effectgate_ledger, effectgate_template_db):\n"
        "    import os\n"
        "    expected = os.environ.get('EXPECTED')\n"
        "    assert conninfo_to_dict(effectgate_ledger.url)['dbname'].startswith(expected + '_')\n"
        "    assert effectgate_template_db.startswith(expected + '_tpl_')\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    base["TEST_DATABASE_URL"] = effectgate_server_url

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
            cwd=tmp_path,
            env={**base, **env},
            capture_output=True,
            text=True,
        )

    assert run(EXPECTED="shop_ci").returncode == 0
    assert run(EXPECTED="nightly", EFFECTGATE_TEST_DATABASE_PREFIX="nightly").returncode == 0
