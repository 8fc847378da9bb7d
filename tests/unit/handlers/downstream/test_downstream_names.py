"""A handler asking for ``ctx.downstream(NAME)`` with a NAME the configuration lacks is refused at start,
at the handler's own line, all such names at once."""

from __future__ import annotations

import inspect
from typing import Any

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.downstream.names import check_downstream_names
from effectgate.handlers.registry import EffectKind, Registry


async def ships(ctx: EffectContext, ev: Event) -> None:
    carrier = ctx.downstream("carier")  # the typo the check is for
    await ctx.step("label", lambda key: carrier.request("POST", "/labels", idempotency_key=key))

    async def find(key: str) -> dict[str, Any] | None:
        return await ctx.downstream("labels").request("GET", "/labels", params={"reference": key})

    await ctx.step(
        "pay", lambda key: ctx.downstream("payments").request("POST", "/p", idempotency_key=key), find=find
    )


async def dynamic(ctx: EffectContext, ev: Event) -> None:
    await ctx.downstream(ev.payload["provider"]).request("POST", "/x")


def registry(*fns: Any) -> Registry:
    reg = Registry()
    for fn in fns:
        reg.register(EffectKind(name=fn.__name__, source="shop", events=("*",), fn=fn))
    return reg


def line_of(fn: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_each_unconfigured_literal_name_is_named_at_the_handlers_own_line() -> None:
    problems = check_downstream_names(registry(ships, dynamic), {"payments", "shipping"})
    carier, labels = line_of(ships, 'downstream("carier")'), line_of(ships, 'downstream("labels")')
    assert problems == [
        f"{__file__}:{carier}: effect 'ships' asks for ctx.downstream('carier'), which is not "
        "configured: add [downstream.carier] (configured: payments, shipping)",
        f"{__file__}:{labels}: effect 'ships' asks for ctx.downstream('labels'), which is not "
        "configured: add [downstream.labels] (configured: payments, shipping)",
    ]


def test_configured_names_and_names_computed_at_run_time_pass() -> None:
    assert check_downstream_names(registry(ships, dynamic), {"carier", "labels", "payments"}) == []
    assert "(configured: none)" in check_downstream_names(registry(ships), set())[0]


def test_effects_of_a_skipped_source_are_not_checked() -> None:
    # [handlers] skip_sources: this deployment does not take the source, so its effects never run here.
    assert check_downstream_names(registry(ships), {"payments"}, skip_sources={"shop"}) == []
    assert len(check_downstream_names(registry(ships), {"payments"}, skip_sources={"other"})) == 2
