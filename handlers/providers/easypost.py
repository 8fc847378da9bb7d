"""A shipping label through EasyPost's own SDK (`easypost` 10.x), as a recorded step with `find`.

EasyPost documents no idempotency key, and its SDK sends none: two `shipment.create` calls buy two labels.
So the step runs with `find=`. Its key is stamped into the shipment's `reference`, which EasyPost lets
stand in for the shipment id when retrieving it (https://docs.easypost.com/docs/easypost-objects): an attempt
that finds the step started but unrecorded retrieves `/shipments/{key}` before buying again.

The label is bought in the create call itself ("one-call buy": `service` and `carrier_accounts` in the
shipment), so there is no window in which a shipment exists unbought and a `find` would return it.

What already happened counts as done (`already_done`). EasyPost has no "already bought" answer for a
create — a second create buys a second label — so before buying, the step looks its reference up: a label
bought already with the step's key as `reference` (by hand in EasyPost's dashboard while the job waited, by
another process with the same key) is its outcome, recorded with `recovered: "already_bought"`. A label
found refunded (`refund_status` `submitted` or `refunded`) is a `TerminalError` naming it: the step does not
buy a label someone returned. One `GET /v2/shipments/{reference}` per label buys that.

The SDK is synchronous (requests); each call runs in a worker thread, bounded by the client's `timeout`.
Its errors become handler outcomes:

    HttpError (no answer), TimeoutError, RateLimitError,
    InternalServerError, ServiceUnavailableError, GatewayTimeoutError   → TransientError
    NotFoundError from `find`                                           → not found (None)
    any other EasyPostError (400, 401, 402, 403, 404, 422, …)           → TerminalError, code = EasyPost's
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from effectgate.handlers.context import EffectContext
from effectgate.handlers.downstream import DownstreamConfig, Pace
from effectgate.handlers.errors import HandlerError, TerminalError, TransientError
from effectgate.handlers.providers.already_done import ALREADY_BOUGHT, recovered

if TYPE_CHECKING:
    from easypost.easypost_client import EasyPostClient
    from easypost.errors.general.easypost_error import EasyPostError

__all__ = ["buy_label", "easypost_client", "easypost_for", "outcome_of"]

T = TypeVar("T")

# One SDK client per configured downstream and process (each holds a requests session).
_CLIENTS: dict[tuple[str, DownstreamConfig], EasyPostClient] = {}
# A label's refund_status once it is being or has been returned ("rejected" leaves it valid).
_REFUNDED = ("submitted", "refunded")


def _require_sdk() -> None:
    """EasyPost's SDK is an optional extra: say how to get it where it is first needed."""
    try:
        import easypost  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "effectgate.handlers.providers.easypost needs EasyPost's SDK: pip install 'effectgate[easypost]'"
        ) from exc


def easypost_client(api_key: str, *, base_url: str | None = None, timeout: int = 30) -> EasyPostClient:
    """An `EasyPostClient`; `base_url` (EasyPost's `api_base`, without `/v2`) points it at a fake."""
    _require_sdk()
    from easypost.easypost_client import EasyPostClient

    if not isinstance(api_key, str) or not api_key or api_key != api_key.strip():
        raise ValueError("api_key must be a non-empty string without surrounding whitespace")
    if base_url is None:
        client = EasyPostClient(api_key, timeout=timeout)
    else:
        client = EasyPostClient(api_key, api_base=base_url.rstrip("/") + "/v2", timeout=timeout)
    return client


def easypost_for(ctx: EffectContext, name: str = "easypost") -> EasyPostClient:
    """An `EasyPostClient` configured by `[downstream.NAME]` (`base_url` without `/v2`, key, `timeout`)."""
    config = ctx.downstream(name).config
    client = _CLIENTS.get((name, config))
    if client is None:
        if config.api_key is None:
            raise TerminalError(f"[downstream.{name}] has no api key for EasyPost", code="no_api_key")
        timeout = max(1, round(config.timeout))
        client = _CLIENTS[(name, config)] = easypost_client(
            config.api_key, base_url=config.base_url, timeout=timeout
        )
    return client


async def buy_label(
    ctx: EffectContext,
    client: EasyPostClient,
    *,
    to_address: Mapping[str, Any],
    from_address: Mapping[str, Any],
    parcel: Mapping[str, Any],
    service: str,
    carrier_accounts: Sequence[str],
    options: Mapping[str, Any] | None = None,
    step: str = "label",
    downstream: str | None = "easypost",
) -> dict[str, Any]:
    """Buy one label per (effect, `step`) and return the shipment (`id`, `tracking_code`, `postage_label`).

    The shipment's `reference` is the step's key; nothing else may be written there. A label bought
    already under that reference is returned, marked `recovered: "already_bought"`, instead of a second.
    Each call takes its turn by the `Pace` of `[downstream.NAME]` `downstream` (the name `easypost_for`
    was given; None, or a name not configured, as for a client from `easypost_client`: not paced).
    """
    if not service or not carrier_accounts:
        raise ValueError("service and carrier_accounts are required: the label is bought in the create call")
    pace = _pace_of(ctx, downstream)

    async def by_reference(key: str) -> dict[str, Any] | None:
        from easypost.errors.api.not_found_error import NotFoundError

        try:
            return _plain(await _call(partial(client.shipment.retrieve, key), pace))
        except TerminalError as exc:
            if isinstance(exc.__cause__, NotFoundError):
                return None
            raise

    async def create(key: str) -> dict[str, Any]:
        existing = await by_reference(key)
        if existing is not None and existing.get("postage_label"):
            refund = existing.get("refund_status")
            if refund in _REFUNDED:
                message = (
                    f"easypost: the label of shipment {existing.get('id')} (reference {key}) is refunded "
                    f"(refund_status {refund}), not bought"
                )
                raise TerminalError(message, code="label_refunded")
            return recovered(existing, ALREADY_BOUGHT)
        shipment = await _call(
            partial(
                client.shipment.create,
                to_address=dict(to_address),
                from_address=dict(from_address),
                parcel=dict(parcel),
                service=service,
                carrier_accounts=list(carrier_accounts),
                options=dict(options or {}),
                reference=key,
            ),
            pace,
        )
        return _plain(shipment)

    async def find(key: str) -> dict[str, Any] | None:
        shipment = await by_reference(key)
        # A shipment found by reference but never bought (created some other way) is not our label.
        return shipment if shipment is not None and shipment.get("postage_label") else None

    return await ctx.step(step, create, find=find)


def outcome_of(exc: EasyPostError) -> HandlerError:
    """The handler outcome an EasyPost SDK error stands for (the table in the module docstring)."""
    # The SDK re-exports these by star imports, which a strict type checker does not follow.
    from easypost.errors.api.gateway_timeout_error import GatewayTimeoutError
    from easypost.errors.api.http_error import HttpError
    from easypost.errors.api.internal_server_error import InternalServerError
    from easypost.errors.api.rate_limit_error import RateLimitError
    from easypost.errors.api.service_unavailable_error import ServiceUnavailableError
    from easypost.errors.api.timeout_error import TimeoutError

    transient = (
        HttpError,
        TimeoutError,
        RateLimitError,
        InternalServerError,
        ServiceUnavailableError,
        GatewayTimeoutError,
    )
    message = f"easypost {type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
    if isinstance(exc, transient):
        return TransientError(message)
    code = getattr(exc, "code", None)
    status = getattr(exc, "http_status", None)
    return TerminalError(message, code=code if isinstance(code, str) and code else f"http_{status}")


def _pace_of(ctx: EffectContext, downstream: str | None) -> Pace | None:
    if downstream is None:
        return None
    try:
        return ctx.downstream(downstream).pace
    except TerminalError:
        return None  # a client built by easypost_client, not from a [downstream.NAME]


async def _call(fn: Callable[[], T], pace: Pace | None) -> T:
    from easypost.errors.api.rate_limit_error import RateLimitError
    from easypost.errors.general.easypost_error import EasyPostError

    try:
        # abandon_on_cancel: a slice abandoned at its deadline must not wait for a blocked socket; the
        # thread ends at the client's timeout, and the step was never recorded, so find runs next time.
        if pace is None:
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
        async with pace.turn():
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except EasyPostError as exc:
        if pace is not None and isinstance(exc, RateLimitError):
            pace.hold(None)  # the SDK's error carries no Retry-After
        raise outcome_of(exc) from exc


def _plain(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = obj.to_dict()
    return result
