"""The shared half of the downstream clients: configuration, and one request path.

Every payment or shipping call an effect handler makes goes through `send_idempotent`, and every call of a
`[downstream.NAME]` client (`DownstreamClient`, `ctx.downstream(NAME)`) through the same path, which sends
the step's key in the API's idempotency header (`Idempotency-Key` unless configured otherwise) and turns
the provider's answer into a return value or one of the handler outcome exceptions, the same way for every
API:

    2xx with a JSON object          → the object
    2xx whose body is not JSON      → TransientError   (the effect may have happened: replay it)
    RETRY_STATUSES, transport       → TransientError   (retry with the SAME key; 429 carries retry_after)
    4xx with error.type "idempotency_error" → UnrecoverableError (key reused with other parameters: a bug)
    any other status                → TerminalError    (code = the provider's error code)

The client never retries by itself: the job runtime re-runs the step with the same key, so backoff, attempt
limits and lease deadlines live in one place.
"""

from __future__ import annotations

import base64
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from effectgate.handlers import tracing
from effectgate.handlers.errors import TransientError
from effectgate.handlers.observe import CallObserver, report_call

from .answers import RETRY_STATUSES, classify_response, retry_after_seconds
from .pace import Pace, PaceExceeded, SharedTurns, check_limits

__all__ = [
    "DEFAULT_IDEMPOTENCY_HEADER",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "PACE_SCOPES",
    "RETRY_STATUSES",
    "DownstreamClient",
    "DownstreamConfig",
    "Pace",
    "SharedTurns",
    "classify_response",
    "clients",
    "paces",
    "retry_after_seconds",
    "send_idempotent",
]

logger = logging.getLogger(__name__)

#: Stripe refuses longer keys; failing here names the bug instead of burning attempts on 400s.
MAX_IDEMPOTENCY_KEY_LENGTH = 255
#: The header Stripe, Adyen and the IETF draft use; PayPal's is `PayPal-Request-Id`.
DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
# RFC 9110 token characters: a header name outside them is refused by httpx at the first request.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_AUTH_SCHEMES = ("bearer", "basic")
#: Who shares a downstream's `max_per_second`: every worker process of the ledger, or each process alone.
PACE_SCOPES = ("ledger", "process")


@dataclass(frozen=True, slots=True)
class DownstreamConfig:
    """Where a downstream API lives and how long to wait for it, validated at construction.

    `base_url` must be an absolute http(s) URL (a trailing slash is dropped, a path prefix is kept);
    `api_key`, when set, is sent as `auth_scheme` says and is left out of `repr` so it never reaches a log
    line: `bearer` (`Authorization: Bearer KEY`), `basic` (`Authorization: Basic …` of `KEY` as
    `user:password`, or of `KEY:` when it holds no colon, as Stripe and EasyPost take it), or any other
    value, which names the header the key is sent in as it is (`X-Shopify-Access-Token`).
    `idempotency_header` names the header a step's key travels in (`PayPal-Request-Id`), or is None for an
    API that takes none. `timeout` bounds each read/write/pool wait and `connect_timeout` the TCP connect,
    both in seconds. `max_in_flight` and `max_per_second` pace the calls to this API
    (`handlers.downstream.pace`; None: no limit), a call waiting for its turn at most `timeout` seconds:
    `max_in_flight` per worker process, `max_per_second` for every worker of the ledger together where
    `pace_scope` is `"ledger"` (and the worker is given the ledger's schedule), per process where `"process"`.
    """

    base_url: str
    api_key: str | None = field(repr=False)
    timeout: float = 10.0
    connect_timeout: float = 5.0
    auth_scheme: str = "bearer"
    idempotency_header: str | None = DEFAULT_IDEMPOTENCY_HEADER
    max_in_flight: int | None = None
    max_per_second: float | None = None
    pace_scope: str = "ledger"

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an absolute http(s) URL, got {self.base_url!r}")
        if parts.query or parts.fragment:
            raise ValueError("base_url must not carry a query or fragment")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            # An empty or padded key is a configuration slip; None is how "no auth" is spelled.
            raise ValueError("api_key must be None or a non-empty string without surrounding whitespace")
        for name in ("timeout", "connect_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not isinstance(self.auth_scheme, str) or not (
            self.auth_scheme in _AUTH_SCHEMES or _HEADER_NAME.fullmatch(self.auth_scheme)
        ):
            raise ValueError(
                f"auth_scheme must be 'bearer', 'basic' or a header name, got {self.auth_scheme!r}"
            )
        if self.idempotency_header is not None and not (
            isinstance(self.idempotency_header, str) and _HEADER_NAME.fullmatch(self.idempotency_header)
        ):
            raise ValueError(
                f"idempotency_header must be a header name or None, got {self.idempotency_header!r}"
            )
        check_limits(self.max_in_flight, self.max_per_second)
        if self.pace_scope not in PACE_SCOPES:
            raise ValueError(f"pace_scope must be 'ledger' or 'process', got {self.pace_scope!r}")

    def pace(self, name: str = "", shared: SharedTurns | None = None) -> Pace:
        """A new `Pace` for this API's calls (one per process and downstream: `paces`), its `max_per_second`
        kept in `shared` under `name` where `pace_scope` is `"ledger"`."""
        return Pace(
            max_in_flight=self.max_in_flight,
            max_per_second=self.max_per_second,
            max_wait=self.timeout,
            name=name,
            shared=shared if self.pace_scope == "ledger" else None,
        )

    def headers(self, idempotency_key: str | None) -> dict[str, str]:
        """The headers of one request: `Accept`, the credentials, and the step's key where the API takes one."""
        headers = {"Accept": "application/json"}
        if idempotency_key is not None and self.idempotency_header is not None:
            headers[self.idempotency_header] = idempotency_key
        if self.api_key is not None:
            if self.auth_scheme == "bearer":
                headers["Authorization"] = f"Bearer {self.api_key}"
            elif self.auth_scheme == "basic":
                user_password = self.api_key if ":" in self.api_key else f"{self.api_key}:"
                headers["Authorization"] = "Basic " + base64.b64encode(user_password.encode()).decode("ascii")
            else:
                headers[self.auth_scheme] = self.api_key
        return headers

    def httpx_timeout(self) -> httpx.Timeout:
        """The per-request timeout, so the shared `httpx.AsyncClient`'s own defaults never apply."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout)


async def send_idempotent(
    http: httpx.AsyncClient,
    config: DownstreamConfig,
    path: str,
    *,
    idempotency_key: str,
    method: str = "POST",
    form: Mapping[str, str] | None = None,
    json: Any = None,
    service: str = "downstream",
    on_call: CallObserver | None = None,
    pace: Pace | None = None,
) -> dict[str, Any]:
    """Send one mutating request carrying `Idempotency-Key` and return the provider's JSON object.

    `path` is joined to `config.base_url`; the body is `form` (form-encoded, as Stripe wants) or `json`.
    Failures are raised as `TransientError`, `TerminalError` or `UnrecoverableError` as the module docstring
    lays out, with transport errors chained as the cause. Nothing is retried here: a retry must come from the
    caller, with the same `idempotency_key`, so the provider can replay instead of acting twice.
    `on_call(service, status, seconds)`, when given, hears of every request sent: the HTTP status, or the
    transport error's class name (`ConnectError`, `ReadTimeout`, …) when no answer came, and how long it took.
    `pace`, when given, is the downstream's (`paces`): the request waits for its turn, or is not sent at all
    (`PaceExceeded`, a `TransientError`; `on_call` hears `paced`), and a `429` holds its next calls back.
    """
    _check_idempotency_key(idempotency_key)
    return await _send(
        http,
        config,
        method,
        path,
        idempotency_key=idempotency_key,
        form=form,
        json=json,
        service=service,
        on_call=on_call,
        pace=pace,
    )


async def _send(
    http: httpx.AsyncClient,
    config: DownstreamConfig,
    method: str,
    path: str,
    *,
    idempotency_key: str | None,
    form: Mapping[str, str] | None = None,
    json: Any = None,
    params: Mapping[str, Any] | None = None,
    service: str,
    on_call: CallObserver | None,
    pace: Pace | None = None,
) -> dict[str, Any]:
    if form is not None and json is not None:
        raise ValueError("pass either form or json, not both")
    if not path.startswith("/"):
        # Joined to base_url as text: without the slash, "v1" would glue onto the host or the prefix.
        raise ValueError(f"path must start with '/', got {path!r}")
    headers = config.headers(idempotency_key)
    # The step's span, so the provider's side of the call joins the trace (when tracing is on).
    tracing.inject(headers)
    request = (http, config, method, path, headers, idempotency_key, form, json, params, service, on_call)
    if pace is None:
        response = await _request(*request)
    else:
        try:
            async with pace.turn():
                response = await _request(*request)
        except PaceExceeded as exc:
            logger.debug("downstream %s %s key=%s not sent: %s", method, path, idempotency_key, exc)
            report_call(on_call, service, "paced", 0.0)
            raise
        if response.status_code == 429:
            pace.hold(retry_after_seconds(response.headers.get("Retry-After")))
    return classify_response(response)


async def _request(
    http: httpx.AsyncClient,
    config: DownstreamConfig,
    method: str,
    path: str,
    headers: dict[str, str],
    idempotency_key: str | None,
    form: Mapping[str, str] | None,
    json: Any,
    params: Mapping[str, Any] | None,
    service: str,
    on_call: CallObserver | None,
) -> httpx.Response:
    started = time.perf_counter()
    try:
        response = await http.request(
            method,
            config.base_url + path,
            headers=headers,
            data=form,
            json=json,
            params=params,
            timeout=config.httpx_timeout(),
        )
    except (httpx.TransportError, httpx.DecodingError) as exc:
        # Connect errors, timeouts and connections dropped mid-response all look the same from here: the
        # provider may or may not have acted. Only a replay with the same key can tell, so retry.
        logger.debug("downstream %s %s key=%s failed: %s", method, path, idempotency_key, type(exc).__name__)
        report_call(on_call, service, type(exc).__name__, time.perf_counter() - started)
        raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    logger.debug("downstream %s %s key=%s -> %d", method, path, idempotency_key, response.status_code)
    report_call(on_call, service, response.status_code, time.perf_counter() - started)
    return response


class DownstreamClient:
    """A client for one `[downstream.NAME]` API, over the worker's shared `httpx.AsyncClient`.

    `request` sends one call and answers exactly as the payment and shipping clients do (`send_idempotent`,
    `classify_response`): the JSON object, or `TransientError`, `TerminalError` or `UnrecoverableError`. It
    never retries; the job runtime re-runs the step with the same key. Reach it with `ctx.downstream(NAME)`.
    """

    def __init__(
        self,
        name: str,
        http: httpx.AsyncClient,
        config: DownstreamConfig,
        *,
        on_call: CallObserver | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.name = name
        self.config = config
        #: The turns of this API's calls in this process, shared with the payments or shipping client of
        #: the same name and with a provider SDK's calls (`handlers.providers`); None: not paced.
        self.pace = pace
        self._http = http
        self._on_call = on_call

    def __repr__(self) -> str:
        return f"DownstreamClient({self.name!r}, {self.config.base_url!r})"

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send `method path` (joined to the base URL) with a JSON body and query, return the JSON object.

        `idempotency_key`, when given, travels in the configured `idempotency_header`; an API configured
        with none is sent no key (pair its creating steps with `find=`). Bad arguments raise `ValueError`
        before anything is sent.
        """
        if not isinstance(method, str) or not _HEADER_NAME.fullmatch(method):
            raise ValueError(f"method must be an HTTP method name, got {method!r}")
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        return await _send(
            self._http,
            self.config,
            method.upper(),
            path,
            idempotency_key=idempotency_key,
            json=json,
            params=params,
            service=self.name,
            on_call=self._on_call,
            pace=self.pace,
        )


def paces(
    configs: Iterable[tuple[str, DownstreamConfig]], shared: SharedTurns | None = None
) -> dict[str, Pace]:
    """One `Pace` per configured downstream, by name: built once per process (inside its event loop) and
    handed to every client of that name, so `ctx.payments` and `ctx.downstream("payments")` share turns.
    With `shared` (the ledger's schedule, `ledger.paces.LedgerTurns`), a `max_per_second` of `pace_scope`
    `"ledger"` is every worker process's together."""
    return {name: config.pace(name, shared) for name, config in configs}


def clients(
    http: httpx.AsyncClient,
    configs: Iterable[tuple[str, DownstreamConfig]],
    *,
    on_call: CallObserver | None = None,
    paces: Mapping[str, Pace] | None = None,
) -> dict[str, DownstreamClient]:
    """One `DownstreamClient` per configured downstream, by name, sharing `http` (and each its `paces[name]`)."""
    given = paces or {}
    return {
        name: DownstreamClient(name, http, config, on_call=on_call, pace=given.get(name))
        for name, config in configs
    }


def _check_idempotency_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError("idempotency_key must be a non-empty string")
    if len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise ValueError(f"idempotency_key is longer than {MAX_IDEMPOTENCY_KEY_LENGTH} characters")
    if not key.isascii() or not key.isprintable():
        raise ValueError("idempotency_key must be printable ASCII")
