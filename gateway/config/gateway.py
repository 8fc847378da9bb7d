"""``[gateway]``: the HTTP face of the configuration (where it listens, how much it reads, its connection
guard, claim-path bounds and penalty box), and the trusted-proxy list it shares with ``--forwarded-allow-ips``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from effectgate.ledger import claim_batcher
from effectgate.ledger.db import DEFAULT_POOL_MAX

from .reader import ConfigError as ConfigError
from .reader import TableReader

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


# -- the edge's settings (gateway/edge/ is configured with these values; config imports nothing of it) --

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a client may take to send a request's head and body, and how large the head may be."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES

    def __post_init__(self) -> None:
        if self.header_timeout <= 0 or self.body_timeout <= 0 or self.max_header_bytes < 1:
            raise ValueError("timeouts must be > 0 and max_header_bytes >= 1")


DEFAULT_FAILURES = 50
DEFAULT_WINDOW = 10.0
DEFAULT_COOLING = 60.0
DEFAULT_MAX_CLIENTS = 10_000
DEFAULT_REPLAYS = 20
DEFAULT_CLIENT_CONCURRENCY = 64
Mode = Literal["one_at_a_time", "held"]
MODES: tuple[Mode, ...] = ("one_at_a_time", "held")


@dataclass(frozen=True, slots=True)
class PenaltySettings:
    """``[gateway.penalty_box]``: when a client is boxed, for how long, what it gets, and how many of its
    connections wait at once."""

    enabled: bool = True
    failures: int = DEFAULT_FAILURES
    window: float = DEFAULT_WINDOW
    cooling: float = DEFAULT_COOLING
    # None: ``derived_hold`` of the process's file limit.
    hold: int | None = None
    max_clients: int = DEFAULT_MAX_CLIENTS
    # Repeats of one delivery (same client, source and body) within ``window`` that box a client; 0: never.
    replays: int = DEFAULT_REPLAYS
    mode: Mode = "one_at_a_time"

    def __post_init__(self) -> None:
        if (
            self.failures < 1
            or self.window <= 0
            or self.cooling <= 0
            or (self.hold is not None and self.hold < 0)
            or self.max_clients < 1
            or self.replays < 0
        ):
            raise ValueError(
                "failures and max_clients must be >= 1, window and cooling > 0, hold and replays >= 0"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The HTTP face: where it listens and how much it reads."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    pool_max: int = DEFAULT_POOL_MAX
    # Gateways tick the reconciler too, so jobs are repaired while no worker runs; off for a gateway
    # that should only answer (or a test over a ledger frozen in the past).
    run_reconciler: bool = True
    # Peers whose X-Forwarded-Proto / X-Forwarded-For are believed (addresses, networks, or "*").
    # None by default: a client that reaches the port directly must not be able to claim it came over
    # TLS (the dashboard cookie's Secure flag follows the scheme) or spoof its address in the logs.
    forwarded_allow_ips: tuple[str, ...] = ()
    # Slow or lying clients are cut off (gateway/edge/guard.py): the whole request head within header_timeout
    # seconds, the whole body within body_timeout seconds of it, a head of at most max_header_bytes.
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    # The claim path's bounds (ledger.claim_batcher): waiting requests per process (past it: 503 overloaded),
    # seconds a request may wait to be taken into a batch, and the claim pool's lock and statement timeouts
    # (past any: 503 claim_timeout). Nothing is half-written in any case.
    claim_queue_max: int = claim_batcher.DEFAULT_MAX_QUEUE
    claim_deadline: float = claim_batcher.DEFAULT_DEADLINE
    claim_lock_timeout: float = claim_batcher.DEFAULT_LOCK_TIMEOUT
    claim_statement_timeout: float = claim_batcher.DEFAULT_STATEMENT_TIMEOUT
    # Requests in flight per client address and process (gateway/edge/client_slots.py); past it the
    # client's next request waits unread for one of its own to finish. 0: no limit. Trusted proxies are not
    # limited.
    client_concurrency: int = DEFAULT_CLIENT_CONCURRENCY
    # [gateway.penalty_box]: a client that keeps failing authentication for a source is held off it
    # (gateway/edge/penalty_box.py).
    penalty_box: PenaltySettings = field(default_factory=PenaltySettings)

    @property
    def limits(self) -> Limits:
        """The connection guard's limits."""
        return Limits(self.header_timeout, self.body_timeout, self.max_header_bytes)


def parse_forwarded_allow_ips(values: list[Any] | tuple[Any, ...]) -> tuple[str, ...]:
    """Validate trusted proxy entries: IP addresses, CIDR networks, or ``*`` (trust every peer).

    uvicorn quietly keeps a malformed entry as a literal that never matches, so a typo would turn the
    proxy's headers off without a word; here it is a ``ValueError`` naming the entry instead.
    """
    entries = []
    for value in values:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"expected IP addresses, CIDR networks or '*', got {value!r}")
        entry = value.strip()
        if entry != "*":
            try:
                if "/" in entry:
                    ipaddress.ip_network(entry)
                else:
                    ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address, a CIDR network (host bits zero) or '*'"
                ) from None
        entries.append(entry)
    return tuple(entries)


def _penalty_settings(box: TableReader) -> PenaltySettings:
    settings = PenaltySettings(
        enabled=box.get("enabled", bool, True),
        failures=box.number("failures", DEFAULT_FAILURES, minimum=1, integer=True),
        window=box.number("window", DEFAULT_WINDOW, minimum=0.001),
        cooling=box.number("cooling", DEFAULT_COOLING, minimum=0.001),
        hold=_optional_hold(box),
        max_clients=box.number("max_clients", DEFAULT_MAX_CLIENTS, minimum=1, integer=True),
        replays=box.number("replays", DEFAULT_REPLAYS, minimum=0, integer=True),
        mode=_mode(box),
    )
    box.no_unknown_keys()
    return settings


def _mode(box: TableReader) -> Mode:
    mode = box.get("mode", str, "one_at_a_time")
    if mode not in MODES:
        box.problem("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
        return "one_at_a_time"
    return cast(Mode, mode)


def _optional_hold(box: TableReader) -> int | None:
    # Unset: derived from each process's file limit (penalty_box.derived_hold).
    hold: int | None = box.get("hold", int, None)
    if hold is not None and hold < 0:
        box.problem("hold", f"must be >= 0, got {hold!r}")
        return None
    return hold


def _forwarded_allow_ips(gw: TableReader) -> tuple[str, ...]:
    try:
        return parse_forwarded_allow_ips(gw.get("forwarded_allow_ips", list, []))
    except ValueError as exc:
        gw.problem("forwarded_allow_ips", str(exc))
        return ()


def read_gateway(gw: TableReader) -> GatewayConfig:
    """``[gateway]`` and ``[gateway.penalty_box]``."""
    gateway = GatewayConfig(
        host=gw.get("host", str, DEFAULT_HOST),
        port=gw.number("port", DEFAULT_PORT, minimum=0, integer=True),
        max_body_bytes=gw.number("max_body_bytes", DEFAULT_MAX_BODY_BYTES, minimum=1, integer=True),
        pool_max=gw.number("pool_max", DEFAULT_POOL_MAX, minimum=1, integer=True),
        run_reconciler=gw.get("run_reconciler", bool, True),
        forwarded_allow_ips=_forwarded_allow_ips(gw),
        header_timeout=gw.number("header_timeout", DEFAULT_HEADER_TIMEOUT, minimum=0.001),
        body_timeout=gw.number("body_timeout", DEFAULT_BODY_TIMEOUT, minimum=0.001),
        max_header_bytes=gw.number("max_header_bytes", DEFAULT_MAX_HEADER_BYTES, minimum=1024, integer=True),
        claim_queue_max=gw.number(
            "claim_queue_max", claim_batcher.DEFAULT_MAX_QUEUE, minimum=1, integer=True
        ),
        client_concurrency=gw.number(
            "client_concurrency", DEFAULT_CLIENT_CONCURRENCY, minimum=0, integer=True
        ),
        claim_deadline=gw.number("claim_deadline", claim_batcher.DEFAULT_DEADLINE, minimum=0.001),
        claim_lock_timeout=gw.number("claim_lock_timeout", claim_batcher.DEFAULT_LOCK_TIMEOUT, minimum=0.001),
        claim_statement_timeout=gw.number(
            "claim_statement_timeout", claim_batcher.DEFAULT_STATEMENT_TIMEOUT, minimum=0.001
        ),
    )
    if gateway.port > 65535:
        gw.problem("port", f"must be <= 65535, got {gateway.port}")
    gateway = replace(gateway, penalty_box=_penalty_settings(gw.table_of("penalty_box")))
    if gateway.claim_lock_timeout >= gateway.claim_statement_timeout:
        # A lock wait must end as a lock timeout (only the requests needing the key fail), not as a statement
        # timeout (the whole batch fails).
        gw.problem(
            "claim_lock_timeout",
            f"must be shorter than claim_statement_timeout ({gateway.claim_statement_timeout:g}), "
            f"got {gateway.claim_lock_timeout:g}",
        )
    gw.no_unknown_keys()
    return gateway
