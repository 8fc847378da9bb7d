"""Loading and validating ``effectgate.toml``.

Every mistake is reported at start, all of them at once, naming the file, the key and what is wrong
(with a "did you mean" for a misspelt key); secrets are named by the environment variables that hold
them and never read from the file itself.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import logging
import os
import re
import sys
import tomllib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, cast

from effectgate.handlers.downstream import DEFAULT_IDEMPOTENCY_HEADER, DownstreamConfig
from effectgate.handlers.downstream_names import check_downstream_names
from effectgate.handlers.forward import DeclaredEffect, register_declared
from effectgate.handlers.plan import MAX_TENANT_LENGTH, TenantRule, check_identity, check_key_spaces
from effectgate.handlers.registry import REGISTRY, Registry
from effectgate.handlers.tracing import TracingConfig, TracingUnavailable, check_available
from effectgate.handlers.worker import DEFAULT_CONCURRENCY, DEFAULT_POLL_INTERVAL, WorkerConfig
from effectgate.ledger import claim_batcher
from effectgate.ledger import rescuer as rescuer_defaults
from effectgate.ledger import waker as waker_defaults
from effectgate.ledger.db import DEFAULT_SCHEMA, check_schema_name
from effectgate.ledger.partitions import DEFAULT_INTERVAL as DEFAULT_PARTITION_INTERVAL
from effectgate.ledger.partitions import DEFAULT_PREMAKE, PartitionConfig
from effectgate.ledger.pointers import JsonPointer
from effectgate.ledger.reconciler import (
    DEFAULT_PENDING_TTL,
    DEFAULT_POISON_THRESHOLD,
    DEFAULT_TICK,
    ReconcilerConfig,
)
from effectgate.ledger.rescuer import RescuerConfig
from effectgate.ledger.retention import DEFAULT_BATCH as DEFAULT_RETENTION_BATCH
from effectgate.ledger.retention import DEFAULT_HISTORY, DEFAULT_PAYLOADS, RetentionConfig
from effectgate.ledger.sweeps import SweepConfig
from effectgate.ledger.waker import WakerConfig

from . import guard, handler_checks, penalty_box
from .effects_config import read_effects
from .operator.auth import MIN_TOKEN_LENGTH, OperatorToken, read_operators
from .penalty_box import PenaltySettings
from .providers import CONFLICT_STATUSES, ConflictStatus, default_conflict_status
from .retry_windows import DAY, HOUR, RETRY_WINDOWS, retry_window
from .secret_sources import ROLE_SECRETS, Role, SecretEnv, missing
from .secret_sources import read_file as read_secret_file
from .settings_env import mention as env_mention
from .settings_env import override as env_override
from .signatures import SCHEMES, Covers, Scheme, SchemeConfigError, build_scheme, covers_of
from .toml_reader import ConfigError as ConfigError  # re-exported: callers catch it from here
from .toml_reader import TableReader

log = logging.getLogger("effectgate.config")

DEFAULT_CONFIG_FILE = "effectgate.toml"
_NAME = re.compile(r"[A-Za-z0-9_-]+")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_POOL_MAX = 10
DEFAULT_SESSION_TTL = 8 * 3600.0
DEFAULT_OPERATOR_HOST = "127.0.0.1"
DEFAULT_THROTTLE_LIMIT = 10
DEFAULT_THROTTLE_WINDOW = 300.0
# How long a process starting while Postgres is unreachable keeps trying before it exits 1: long enough
# for a database container started alongside it to come up, short enough that a wrong host is noticed.
DEFAULT_STARTUP_WAIT = 30.0
# Seconds `serve`/`worker --no-migrate` wait for the schema this version expects before refusing to start.
DEFAULT_MIGRATION_WAIT = 60.0


class SecretsNotLoaded:
    """A source's verifier in a process whose role holds no webhook secrets (a worker): it knows the
    scheme's name and does nothing else. Nothing in a worker verifies deliveries; if something ever
    did, any use of it fails loudly here (whatever the ``Scheme`` interface grows to) rather than with a
    secret the process should not have."""

    name: ClassVar[str] = "secrets-not-loaded"

    def __init__(self, scheme_name: str) -> None:
        self.scheme_name = scheme_name

    def __getattr__(self, attribute: str) -> Any:
        raise RuntimeError(
            f"this process does not hold the {self.scheme_name} webhook secrets (scheme.{attribute})"
        )


@dataclass(frozen=True, slots=True)
class Source:
    """A configured webhook source: its name, verifier, tenant and conflict answer.

    ``tenant_from``, when set, takes each event's tenant from its payload (Stripe Connect's
    ``/account``) instead of the one static ``tenant``, and then only a tenant in ``tenants`` or
    matching ``tenant_pattern`` (the configuration refuses ``tenant_from`` without one of them).
    """

    name: str
    scheme_name: str
    scheme: Scheme
    tenant: str
    conflict_status: ConflictStatus
    secret_envs: tuple[str, ...]
    tenant_from: JsonPointer | None = None
    tenants: frozenset[str] | None = None
    tenant_pattern: re.Pattern[str] | None = None
    # What the scheme signs, known in every role, including one that holds no webhook secrets (a worker);
    # None: ask the scheme.
    covers: Covers | None = None

    @property
    def tenant_rule(self) -> TenantRule:
        """How this source's events get their tenant (``handlers.plan``, shared with the replay)."""
        return TenantRule(self.tenant, self.tenant_from, self.tenants, self.tenant_pattern)


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
    # Slow or lying clients are cut off (gateway.guard): the whole request head within header_timeout
    # seconds, the whole body within body_timeout seconds of it, a head of at most max_header_bytes.
    header_timeout: float = guard.DEFAULT_HEADER_TIMEOUT
    body_timeout: float = guard.DEFAULT_BODY_TIMEOUT
    max_header_bytes: int = guard.DEFAULT_MAX_HEADER_BYTES
    # The claim path's bounds (ledger.claim_batcher): waiting requests per process (past it: 503 overloaded),
    # seconds a request may wait to be taken into a batch, and the claim pool's lock and statement timeouts
    # (past any: 503 claim_timeout). Nothing is half-written in any case.
    claim_queue_max: int = claim_batcher.DEFAULT_MAX_QUEUE
    claim_deadline: float = claim_batcher.DEFAULT_DEADLINE
    claim_lock_timeout: float = claim_batcher.DEFAULT_LOCK_TIMEOUT
    claim_statement_timeout: float = claim_batcher.DEFAULT_STATEMENT_TIMEOUT
    # Requests in flight per client address and process (gateway.guard.ClientSlots); past it the client's
    # next request waits unread for one of its own to finish. 0: no limit. Trusted proxies are not limited.
    client_concurrency: int = guard.DEFAULT_CLIENT_CONCURRENCY
    # [gateway.penalty_box]: a client that keeps failing authentication for a source is held off it
    # (gateway.penalty_box).
    penalty_box: PenaltySettings = field(default_factory=PenaltySettings)

    @property
    def limits(self) -> guard.Limits:
        """The connection guard's limits."""
        return guard.Limits(self.header_timeout, self.body_timeout, self.max_header_bytes)

    def client_slots(self) -> guard.ClientSlots | None:
        """A process's per-client request slots (its own, so build one per process), or None for no limit."""
        if not self.client_concurrency:
            return None
        return guard.ClientSlots(self.client_concurrency, self.forwarded_allow_ips)


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """The dashboard's sessions: the secret their cookies are signed with, and how long one lasts."""

    # None: each serve makes a random one at start (sessions end when it restarts, and replicas do not
    # share them). Set it for several replicas; change it to end every session at once.
    session_secret: bytes | None = None
    session_ttl: float = DEFAULT_SESSION_TTL


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """The operator plane (``/ui``, ``/api``, ``/metrics``): where it listens, its cookies, its throttle.

    With no ``listen`` it shares the gateway's listener (the quick start). With one, the gateway's
    listener serves ``/webhooks/*``, ``/healthz`` and ``/readyz`` only, and the operator plane is
    served on its own address by the same processes.
    """

    listen_host: str | None = None
    listen_port: int | None = None
    # None: Secure exactly when the request came over https (as a trusted proxy says); True/False: always
    # or never, for a deployment whose TLS ends at a proxy that does not say so.
    secure_cookies: bool | None = None
    # Wrong operator tokens per client before its failures are answered 429 (gateway.operator.throttle).
    throttle_limit: int = DEFAULT_THROTTLE_LIMIT
    throttle_window: float = DEFAULT_THROTTLE_WINDOW

    @property
    def apart(self) -> bool:
        """Whether the operator plane has a listener of its own."""
        return self.listen_port is not None


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a host and port; ``ValueError`` naming what is wrong."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), got {text!r}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"an IPv6 address is written in brackets: [::1]:9464, got {text!r}")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"an IPv6 address is written in brackets: [::1]:9464, got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    return host, port


def _schema_name(dbt: TableReader) -> str:
    name = dbt.get("schema", str, DEFAULT_SCHEMA)
    try:
        return check_schema_name(name)
    except ValueError as exc:
        dbt.problem("schema", str(exc))
        return DEFAULT_SCHEMA


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """How a process meets its database at start ([database]; the URL itself is ``DATABASE_URL``)."""

    # Seconds a starting process retries an unreachable Postgres before it gives up (0: try once).
    startup_wait: float = DEFAULT_STARTUP_WAIT
    # Seconds `serve`/`worker --no-migrate` wait for another process (a migrate job, a deploy pipeline) to
    # apply the migrations this version ships, before refusing to start (0: check once).
    migration_wait: float = DEFAULT_MIGRATION_WAIT
    # The Postgres schema every effectgate object lives in (EFFECTGATE_SCHEMA wins; docs/adr/0019-own-schema.md).
    schema: str = DEFAULT_SCHEMA


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration of one effectgate deployment."""

    path: str
    sources: Mapping[str, Source]
    handler_modules: tuple[str, ...]
    # [handlers] skip_sources: sources the modules declare effects for that this deployment does not take
    # (a shared handler module); their effects are not refused at start-up for the missing source.
    handler_skip_sources: tuple[str, ...] = ()
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    payments: DownstreamConfig | None = None
    shipping: DownstreamConfig | None = None
    # Every [downstream.NAME] by name (payments and shipping too), for ctx.downstream(NAME).
    downstreams: Mapping[str, DownstreamConfig] = field(default_factory=dict)
    # The names declared, also where a role reads no downstream credentials: handlers are checked against them.
    downstream_names: frozenset[str] = frozenset()
    # Bearer tokens for the operator API and dashboard ([[operators]]); none configured, none let in.
    operators: tuple[OperatorToken, ...] = ()
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    # The SHA-256 of the bearer token GET /metrics asks for ([metrics] token_env); None: no token.
    metrics_token_sha256: bytes | None = None
    # OpenTelemetry export ([tracing]); None: no spans, and nothing of OpenTelemetry imported.
    tracing: TracingConfig | None = None
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    # Declared HTTP effects ([effects.NAME]), registered beside the handler modules' effects.
    effects: tuple[DeclaredEffect, ...] = ()


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


def _source(name: str, table: TableReader, env: Mapping[str, str] | None) -> Source | None:
    """A ``[sources.NAME]`` table; with ``env`` None (a role without webhook secrets) the secrets are
    neither read nor checked, and the source gets ``SecretsNotLoaded`` in place of its verifier."""
    scheme_name = table.get("scheme", str, required=True)
    secret_envs = table.get("secrets", list, required=True)
    secrets: list[str] = []
    if secret_envs is not None:
        if not secret_envs or not all(isinstance(s, str) and s for s in secret_envs):
            table.problem("secrets", "must be a non-empty list of environment variable names")
        elif env is not None:
            for var in secret_envs:
                value = env.get(var)
                if not value:
                    table.problem("secrets", missing(var))
                else:
                    secrets.append(value)
    tolerance = table.get("tolerance", int)
    if tolerance is not None and tolerance < 1:
        table.problem("tolerance", f"must be >= 1 second, got {tolerance}")
    tenant = table.get("tenant", str, "default")
    if not tenant:
        table.problem("tenant", "must not be empty")
    tenant_from = None
    tenant_pointer = table.get("tenant_from", str)
    if tenant_pointer is not None:
        if "tenant" in table.table:
            table.problem("tenant_from", "set tenant or tenant_from, not both")
        try:
            tenant_from = JsonPointer.parse(tenant_pointer)
        except ValueError as exc:
            table.problem("tenant_from", str(exc))
        else:
            if not tenant_from.tokens:
                table.problem(
                    "tenant_from", 'must point inside the payload (e.g. "/account"), not at all of it'
                )
    tenants, tenant_pattern = _tenant_allow_list(table, tenant_from is not None or tenant_pointer is not None)
    conflict_status = table.get("on_conflict", int, default_conflict_status(scheme_name or ""))
    if conflict_status not in CONFLICT_STATUSES:
        table.problem("on_conflict", f"must be 409 or 200, got {conflict_status}")
    options = table.get("options", dict, {})
    if scheme_name == "paypal" and options and env is not None:
        # A role without webhook secrets holds PayPal's API credentials neither.
        options = _paypal_credentials(options, table, env)
    table.no_unknown_keys()
    if table.failed:
        return None
    if env is None:
        if scheme_name not in SCHEMES:
            table.problem("scheme", f"unknown scheme {scheme_name!r} (known: {', '.join(sorted(SCHEMES))})")
            return None
        unloaded = cast(Scheme, SecretsNotLoaded(scheme_name))
        return Source(
            name,
            scheme_name,
            unloaded,
            tenant,
            conflict_status,
            tuple(secret_envs),
            tenant_from,
            tenants,
            tenant_pattern,
            covers_of(scheme_name, options),
        )
    try:
        scheme = build_scheme(scheme_name, secrets, tolerance=tolerance, options=options)
    except SchemeConfigError as exc:
        table.problem("scheme", str(exc))
        return None
    return Source(
        name,
        scheme_name,
        scheme,
        tenant,
        conflict_status,
        tuple(secret_envs),
        tenant_from,
        tenants,
        tenant_pattern,
        scheme.covers,
    )


def _tenant_allow_list(
    table: TableReader, takes_tenant: bool
) -> tuple[frozenset[str] | None, re.Pattern[str] | None]:
    # A sender naming its own tenant could name "default", or another source's, and pre-claim the keys
    # that source's handlers need: tenant_from comes with the list of tenants it may name, or a pattern.
    listed = table.get("tenants", list)
    pattern_text = table.get("tenant_pattern", str)
    if not takes_tenant:
        for key in ("tenants", "tenant_pattern"):
            if key in table.table:
                table.problem(key, "only meaningful with tenant_from")
        return None, None
    if listed is None and pattern_text is None:
        table.problem(
            "tenant_from",
            'needs the tenants it may name: tenants = ["acct_1", …] or tenant_pattern = "acct_[A-Za-z0-9]+"',
        )
        return None, None
    tenants = None
    if listed is not None:
        if not listed or not all(
            isinstance(t, str) and t and t.isprintable() and len(t) <= MAX_TENANT_LENGTH for t in listed
        ):
            table.problem(
                "tenants",
                f"must be a non-empty list of printable names of at most {MAX_TENANT_LENGTH} characters",
            )
        else:
            tenants = frozenset(listed)
    pattern = None
    if pattern_text is not None:
        try:
            pattern = re.compile(pattern_text)
        except re.error as exc:
            table.problem("tenant_pattern", f"not a regular expression: {exc}")
        else:
            if pattern.fullmatch("") is not None:
                table.problem("tenant_pattern", "must not match the empty string")
    return tenants, pattern


# PayPal's confirmation (options.confirm) calls PayPal's API with OAuth client credentials: secrets, so the
# file names the environment variables that hold them, as it does for webhook secrets.
_PAYPAL_CREDENTIALS = {"client_id_env": "client_id", "client_secret_env": "client_secret"}


def _paypal_credentials(
    options: dict[str, Any], table: TableReader, env: Mapping[str, str]
) -> dict[str, Any]:
    resolved = dict(options)
    for option in _PAYPAL_CREDENTIALS.values():
        if option in resolved:
            table.problem(f"options.{option}", f"name an environment variable in {option}_env instead")
    for option, target in _PAYPAL_CREDENTIALS.items():
        var = resolved.pop(option, None)
        if var is None:
            continue
        if not isinstance(var, str) or not var:
            table.problem(f"options.{option}", "must be the name of an environment variable")
        elif not env.get(var):
            table.problem(f"options.{option}", missing(var))
        else:
            resolved[target] = env[var]
    return resolved


def _penalty_settings(box: TableReader) -> PenaltySettings:
    settings = PenaltySettings(
        enabled=box.get("enabled", bool, True),
        failures=box.number("failures", penalty_box.DEFAULT_FAILURES, minimum=1, integer=True),
        window=box.number("window", penalty_box.DEFAULT_WINDOW, minimum=0.001),
        cooling=box.number("cooling", penalty_box.DEFAULT_COOLING, minimum=0.001),
        hold=box.number("hold", penalty_box.DEFAULT_HOLD, minimum=0, integer=True),
        max_clients=box.number("max_clients", penalty_box.DEFAULT_MAX_CLIENTS, minimum=1, integer=True),
        replays=box.number("replays", penalty_box.DEFAULT_REPLAYS, minimum=0, integer=True),
    )
    box.no_unknown_keys()
    return settings


def _forwarded_allow_ips(gw: TableReader) -> tuple[str, ...]:
    try:
        return parse_forwarded_allow_ips(gw.get("forwarded_allow_ips", list, []))
    except ValueError as exc:
        gw.problem("forwarded_allow_ips", str(exc))
        return ()


def _tracing(reader: TableReader) -> TracingConfig | None:
    if not reader.table:
        return None
    endpoint = reader.get("endpoint", str, required=True)
    service_name = reader.get("service_name", str, "effectgate")
    if not service_name:
        reader.problem("service_name", "must not be empty")
    sample_ratio = reader.number("sample_ratio", 1.0, minimum=0)
    if sample_ratio > 1:
        reader.problem("sample_ratio", f"must be <= 1, got {sample_ratio!r}")
    timeout = reader.number("timeout", 10.0, minimum=0.001)
    reader.no_unknown_keys()
    if reader.failed:
        return None
    try:
        config = TracingConfig(endpoint, service_name, float(sample_ratio), float(timeout))
    except ValueError as exc:
        reader.problem("endpoint", str(exc))
        return None
    try:
        check_available()
    except TracingUnavailable as exc:
        reader.problems.append(f"{reader.path}: {reader.prefix}: {exc}")
        return None
    return config


def _downstream(reader: TableReader, env: Mapping[str, str] | None) -> DownstreamConfig | None:
    """A ``[downstream.NAME]`` table; with ``env`` None (a role without downstream credentials) it is
    checked, and left out. The key comes from ``api_key_env`` (a variable, or ``NAME_FILE``, or
    ``$CREDENTIALS_DIRECTORY/NAME``) or ``api_key_file`` (a path, relative to the configuration file),
    never from the file in clear."""
    if not reader.table:
        return None
    base_url = reader.get("base_url", str, required=True)
    api_key_env = reader.get("api_key_env", str)
    api_key_file = reader.get("api_key_file", str)
    if "api_key" in reader.table:
        reader.used.add("api_key")
        reader.problem(
            "api_key", "keys are never read from the configuration in clear; use api_key_env or api_key_file"
        )
    if api_key_env and api_key_file:
        reader.problem("api_key_file", "set api_key_env or api_key_file, not both")
    api_key = None
    if api_key_env and env is not None:
        api_key = env.get(api_key_env)
        if not api_key:
            reader.problem("api_key_env", missing(api_key_env))
    elif api_key_file and env is not None:
        file = Path(api_key_file)
        if not file.is_absolute() and not reader.path.startswith("<"):
            file = Path(reader.path).parent / file
        try:
            api_key = read_secret_file(file)
        except ValueError as exc:
            reader.problem("api_key_file", f"{file}: {exc}")
    auth_scheme = reader.get("auth_scheme", str, "bearer")
    header = reader.get("idempotency_header", (str, bool), DEFAULT_IDEMPOTENCY_HEADER)
    idempotency_header: str | None = header if isinstance(header, str) else None
    if header is True or header == "":
        reader.problem("idempotency_header", "must be a header name, or false for an API that takes no key")
    timeout = reader.number("timeout", 10.0, minimum=0.001)
    connect_timeout = reader.number("connect_timeout", 5.0, minimum=0.001)
    reader.no_unknown_keys()
    if reader.failed:
        return None
    try:
        config = DownstreamConfig(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            auth_scheme=auth_scheme,
            idempotency_header=idempotency_header,
        )
    except ValueError as exc:
        # DownstreamConfig's messages begin with the field they are about.
        key = str(exc).split(" ", 1)[0]
        if key == "api_key":
            key = "api_key_env" if api_key_env else "api_key_file"
        reader.problem(key, str(exc))
        return None
    return config if env is not None else None


def _downstreams(
    root: TableReader, env: Mapping[str, str] | None
) -> tuple[dict[str, DownstreamConfig], frozenset[str]]:
    """Every ``[downstream.NAME]``, any name: what ``ctx.downstream(NAME)`` reaches (none for a role
    without downstream credentials), and every name declared (in every role, to check handlers against)."""
    ds = root.table_of("downstream")
    configs = {}
    names = set()
    for name in ds.table:
        if not isinstance(ds.table[name], dict):
            ds.used.add(name)
            ds.problem(name, "must be a table ([downstream.NAME])")
            continue
        if not _NAME.fullmatch(name):
            ds.used.add(name)
            ds.problem(name, "downstream names may use letters, digits, '-' and '_' only")
            continue
        names.add(name)
        config = _downstream(ds.table_of(name), env)
        if config is not None:
            configs[name] = config
    return configs, frozenset(names)


def _maintenance(root: TableReader) -> ReconcilerConfig:
    """``[maintenance]`` and its services' sections; ``[reconciler]`` is the older flat spelling, kept."""
    legacy = root.table_of("reconciler")
    mt = root.table_of("maintenance")
    if legacy.table and mt.table:
        root.problem("reconciler", "is the older name of [maintenance]; use one of them, not both")
    if legacy.table:
        try:
            config = ReconcilerConfig(
                tick=legacy.number("tick", DEFAULT_TICK, minimum=0.001),
                pending_ttl=legacy.number("pending_ttl", DEFAULT_PENDING_TTL, minimum=0.001),
                poison_threshold=legacy.number(
                    "poison_threshold", DEFAULT_POISON_THRESHOLD, minimum=1, integer=True
                ),
                signature_failure_retention=86400.0
                * legacy.number("signature_failure_retention_days", 30, minimum=0.001),
            )
        except ValueError as exc:
            legacy.problem("tick", str(exc))
            config = ReconcilerConfig()
        legacy.no_unknown_keys()
        return config
    tick = mt.number("tick", DEFAULT_TICK, minimum=0.001)
    lr = mt.table_of("lease_rescuer")
    pw = mt.table_of("pending_waker")
    sw = mt.table_of("sweeps")
    pt = mt.table_of("partitions")
    try:
        rescuer = RescuerConfig(
            batch=lr.number("batch", rescuer_defaults.DEFAULT_BATCH, minimum=1, integer=True),
            poison_threshold=lr.number("poison_threshold", DEFAULT_POISON_THRESHOLD, minimum=1, integer=True),
        )
        waker = WakerConfig(
            pending_ttl=pw.number("pending_ttl", DEFAULT_PENDING_TTL, minimum=0.001),
            batch=pw.number("batch", waker_defaults.DEFAULT_BATCH, minimum=1, integer=True),
        )
    except ValueError as exc:  # the readers' minimums catch what the dataclasses would refuse
        mt.problem("lease_rescuer", str(exc))
        rescuer, waker = RescuerConfig(), WakerConfig()
    sweeps = SweepConfig(enabled=sw.get("enabled", bool, True))
    partitions = PartitionConfig(
        interval=HOUR * pt.number("interval_hours", DEFAULT_PARTITION_INTERVAL / HOUR, minimum=1 / 60),
        premake=pt.number("premake", DEFAULT_PREMAKE, minimum=1, integer=True),
    )
    for reader in (lr, pw, sw, pt):
        reader.no_unknown_keys()
    mt.no_unknown_keys()
    return ReconcilerConfig(
        tick=tick,
        poison_threshold=rescuer.poison_threshold,
        pending_ttl=waker.pending_ttl,
        rescuer=rescuer,
        waker=waker,
        sweeps=sweeps,
        partitions=partitions,
    )


def _retention(
    root: TableReader, sources: Mapping[str, Source], legacy_signature_failures: float
) -> RetentionConfig:
    """``[retention]`` and ``[retention.sources.NAME]``; windows in days (fractions allowed)."""
    rt = root.table_of("retention")

    def days(reader: TableReader, key: str, default: float | None) -> float | None:
        value = reader.get(key, (int, float, str), None)
        if value is None:
            return default
        if value == "forever":
            if key != "tombstones_days":
                reader.problem(key, 'only tombstones_days may be "forever"')
                return default
            return None
        if isinstance(value, str) or not value > 0:
            reader.problem(key, f"must be a number of days > 0, got {value!r}")
            return default
        return float(value) * DAY

    payloads = days(rt, "payloads_days", DEFAULT_PAYLOADS)
    history = days(rt, "history_days", DEFAULT_HISTORY)
    tombstones = days(rt, "tombstones_days", None)
    signature_failures = days(rt, "signature_failures_days", legacy_signature_failures)
    batch = rt.number("batch", DEFAULT_RETENTION_BATCH, minimum=1, integer=True)
    per = rt.table_of("sources")
    source_payloads: dict[str, float] = {}
    source_tombstones: dict[str, float | None] = {}
    provider_floor: dict[str, float] = {}
    for name in per.table:
        if name not in sources:
            per.problem(name, f"is not a configured source (known: {', '.join(sorted(sources))})")
            per.used.add(name)
            continue
        one = per.table_of(name)
        if "payloads_days" in one.table:
            source_payloads[name] = days(one, "payloads_days", None) or 0.0
        if "tombstones_days" in one.table:
            source_tombstones[name] = days(one, "tombstones_days", None)
        floor = one.get("provider_retry_hours", (int, float))
        if floor is not None:
            if floor < 0:
                one.problem("provider_retry_hours", f"must be >= 0, got {floor!r}")
            else:
                provider_floor[name] = float(floor) * HOUR
        one.no_unknown_keys()
    rt.no_unknown_keys()
    assert payloads is not None and history is not None and signature_failures is not None
    try:
        config = RetentionConfig(
            payloads=payloads,
            history=history,
            tombstones=tombstones,
            signature_failures=signature_failures,
            batch=batch,
            source_payloads=source_payloads,
            source_tombstones=source_tombstones,
        )
    except ValueError as exc:
        rt.problem("payloads_days", str(exc))
        return RetentionConfig()
    # The dedupe window may never be shorter than the provider's own retries: a late retry would be new.
    for name, source in sources.items():
        window = config.dedupe_window(name)
        if window is None:
            continue
        floor = provider_floor.get(name, retry_window(source.scheme_name))
        if window < floor:
            where = per.table_of(name) if name in source_tombstones else rt
            basis = RETRY_WINDOWS.get(source.scheme_name)
            because = basis.basis if basis is not None and name not in provider_floor else "as configured"
            where.problem(
                "tombstones_days",
                f"{window / DAY:g} days is shorter than source {name!r} ({source.scheme_name}) retries: "
                f"{floor / DAY:g} days ({because}); a late retry would run its effect again. "
                "See docs/providers.md",
            )
    return config


def parse(
    text: str, *, path: str = "<config>", env: Mapping[str, str] | None = None, role: Role = "all"
) -> Config:
    """Validate a configuration text; raises ``ConfigError`` naming the file and key of every mistake.

    Secrets are read from ``env`` (default: the process environment), from ``NAME_FILE`` or from
    ``$CREDENTIALS_DIRECTORY`` (``gateway.secret_sources``), and only those ``role`` uses: a gateway
    reads no downstream API key and a worker no webhook secret, and neither is stopped by the other's
    missing secret.
    """
    secret_env = SecretEnv(os.environ if env is None else env)
    loads = ROLE_SECRETS[role]

    def env_for(kind: str) -> SecretEnv | None:
        return secret_env if kind in loads else None

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    # EFFECTGATE_<SECTION>__<KEY> wins over the file (gateway.settings_env).
    env_origins: dict[str, str] = {}
    data, env_problems = env_override(data, os.environ if env is None else env, env_origins)
    root = TableReader(path, "", data)
    root.problems.extend(env_problems)

    gw = root.table_of("gateway")
    gateway = GatewayConfig(
        host=gw.get("host", str, DEFAULT_HOST),
        port=gw.number("port", DEFAULT_PORT, minimum=0, integer=True),
        max_body_bytes=gw.number("max_body_bytes", DEFAULT_MAX_BODY_BYTES, minimum=1, integer=True),
        pool_max=gw.number("pool_max", DEFAULT_POOL_MAX, minimum=1, integer=True),
        run_reconciler=gw.get("run_reconciler", bool, True),
        forwarded_allow_ips=_forwarded_allow_ips(gw),
        header_timeout=gw.number("header_timeout", guard.DEFAULT_HEADER_TIMEOUT, minimum=0.001),
        body_timeout=gw.number("body_timeout", guard.DEFAULT_BODY_TIMEOUT, minimum=0.001),
        max_header_bytes=gw.number(
            "max_header_bytes", guard.DEFAULT_MAX_HEADER_BYTES, minimum=1024, integer=True
        ),
        claim_queue_max=gw.number(
            "claim_queue_max", claim_batcher.DEFAULT_MAX_QUEUE, minimum=1, integer=True
        ),
        client_concurrency=gw.number(
            "client_concurrency", guard.DEFAULT_CLIENT_CONCURRENCY, minimum=0, integer=True
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

    dbt = root.table_of("database")
    database = DatabaseConfig(
        startup_wait=dbt.number("startup_wait", DEFAULT_STARTUP_WAIT, minimum=0),
        migration_wait=dbt.number("migration_wait", DEFAULT_MIGRATION_WAIT, minimum=0),
        schema=_schema_name(dbt),
    )
    dbt.no_unknown_keys()

    reconciler = _maintenance(root)

    wk = root.table_of("worker")
    backoff_base = wk.number("backoff_base", 1.0, minimum=0)
    backoff_cap = wk.number("backoff_cap", 600.0, minimum=0)
    if backoff_cap < backoff_base:
        wk.problem("backoff_cap", f"must be >= backoff_base ({backoff_base:g}), got {backoff_cap:g}")
        backoff_cap = backoff_base
    worker = WorkerConfig(
        concurrency=wk.number("concurrency", DEFAULT_CONCURRENCY, minimum=1, integer=True),
        poll_interval=wk.number("poll_interval", DEFAULT_POLL_INTERVAL, minimum=0.001),
        drain_timeout=wk.number("drain_timeout", 30.0, minimum=0),
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        reconciler=reconciler,
    )
    wk.no_unknown_keys()

    hd = root.table_of("handlers")
    modules = hd.get("modules", list, [])
    if not all(isinstance(m, str) and m for m in modules):
        hd.problem("modules", "must be a list of importable module names")
        modules = []
    skip_sources = hd.get("skip_sources", list, [])
    if not all(isinstance(m, str) and m for m in skip_sources):
        hd.problem("skip_sources", "must be a list of source names")
        skip_sources = []
    hd.no_unknown_keys()

    src = root.table_of("sources")
    sources = {}
    for name in src.table:
        if not isinstance(src.table[name], dict):
            src.problem(name, "must be a table ([sources.NAME])")
            continue
        if not name.replace("-", "").replace("_", "").isalnum():
            src.problem(name, "source names may use letters, digits, '-' and '_' only")
            continue
        source = _source(name, src.table_of(name), env_for("webhook"))
        if source is not None:
            sources[name] = source
    if not src.table and not src.failed:
        root.problems.append(f"{path}: sources: at least one [sources.NAME] table is required")

    worker = replace(
        worker,
        reconciler=replace(
            reconciler,
            retention=_retention(root, sources, reconciler.retention_config().signature_failures),
        ),
    )

    downstreams, downstream_names = _downstreams(root, env_for("downstream"))
    # The forward secret is a downstream credential: only a role that forwards reads it.
    effects = read_effects(root, sources, env_for("downstream"))

    operator_env = env_for("operator")
    if operator_env is not None:
        operators = read_operators(root, operator_env)
    else:
        root.used.add("operators")  # a worker lets no operator in: the tokens are not its to hold
        operators = ()
    dashboard = _dashboard(root.table_of("dashboard"), operator_env)
    operator = _operator(root.table_of("operator"), gateway)
    metrics_token_sha256 = _metrics_token(root.table_of("metrics"), env_for("metrics"))
    root.problems.extend(f"{path}: {problem}" for problem in secret_env.problems)
    tracing = _tracing(root.table_of("tracing"))
    root.no_unknown_keys()
    if root.problems:
        raise ConfigError(*env_mention(root.problems, path, env_origins))
    return Config(
        path=path,
        sources=sources,
        handler_modules=tuple(modules),
        handler_skip_sources=tuple(skip_sources),
        gateway=gateway,
        worker=worker,
        payments=downstreams.get("payments"),
        shipping=downstreams.get("shipping"),
        downstreams=downstreams,
        downstream_names=downstream_names,
        operators=operators,
        dashboard=dashboard,
        operator=operator,
        metrics_token_sha256=metrics_token_sha256,
        tracing=tracing,
        database=database,
        effects=effects,
    )


def _secret(reader: TableReader, key: str, env: Mapping[str, str] | None) -> str | None:
    var = reader.get(key, str)
    if var is None or env is None:
        return None
    value = env.get(var, "")
    if not value:
        reader.problem(key, missing(var))
        return None
    if len(value) < MIN_TOKEN_LENGTH:
        reader.problem(key, f"the secret in {var} is shorter than {MIN_TOKEN_LENGTH} characters")
        return None
    return value


def _dashboard(reader: TableReader, env: Mapping[str, str] | None) -> DashboardConfig:
    secret = _secret(reader, "session_secret_env", env)
    ttl = reader.number("session_ttl", DEFAULT_SESSION_TTL, minimum=60)
    reader.no_unknown_keys()
    return DashboardConfig(None if secret is None else secret.encode("utf-8"), ttl)


def _operator(reader: TableReader, gateway: GatewayConfig) -> OperatorConfig:
    host = port = None
    listen = reader.get("listen", str)
    if listen is not None:
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            reader.problem("listen", str(exc))
        else:
            if port != 0 and port == gateway.port:
                reader.problem("listen", f"must not be the gateway's own port ({gateway.port})")
    config = OperatorConfig(
        listen_host=host,
        listen_port=port,
        secure_cookies=reader.get("secure_cookies", bool),
        throttle_limit=reader.number("throttle_limit", DEFAULT_THROTTLE_LIMIT, minimum=1, integer=True),
        throttle_window=reader.number("throttle_window", DEFAULT_THROTTLE_WINDOW, minimum=1),
    )
    reader.no_unknown_keys()
    return config


def _metrics_token(reader: TableReader, env: Mapping[str, str] | None) -> bytes | None:
    token = _secret(reader, "token_env", env)
    reader.no_unknown_keys()
    return None if token is None else hashlib.sha256(token.encode("utf-8")).digest()


def load(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None, role: Role = "all") -> Config:
    """Read and validate the configuration file at ``path``, with the secrets ``role`` uses."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{p}: configuration file not found (pass --config or set EFFECTGATE_CONFIG)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc}") from exc
    return parse(text, path=str(p), env=env, role=role)


def app_dir(config: Config) -> Path:
    """Where handler modules are looked for first: the configuration file's directory, or the
    current directory when the configuration did not come from a file."""
    path = Path(config.path)
    return path.resolve().parent if path.is_file() else Path.cwd()


def import_handlers(config: Config, *, warn: bool = True) -> None:
    """Import the configured handler modules, which register their effects on import.

    The configuration file's directory goes first on ``sys.path`` (as uvicorn's ``--app-dir`` does), so
    a handler module kept next to ``effectgate.toml`` imports without ``PYTHONPATH``, from any working
    directory and in every process of ``serve --workers N``. Every module that fails is reported at
    once, with the error and what to do about it, and so is every mistaken ``@effect`` declaration and
    every effect of an unconfigured source (``handler_checks``), each at the user's file and line. An
    event pattern that can never match its source's scheme is logged as a warning (``warn``).
    """
    directory = str(app_dir(config))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    where = f"{directory} (the configuration file's directory)" if Path(config.path).is_file() else directory
    problems = []
    with REGISTRY.collecting() as mistakes:
        for module in config.handler_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                problems.append(
                    f"{config.path}: handlers.modules: cannot import {module!r}: {_import_failure(module, exc, where)}"
                )
    for declared in config.effects:
        try:
            register_declared(REGISTRY, declared)
        except ValueError as exc:
            problems.append(f"{config.path}: effects.{declared.name}: {exc} (by a handler module)")
    schemes = {name: source.scheme_name for name, source in config.sources.items()}
    problems.extend(handler_checks.problems(REGISTRY, mistakes, schemes, config.handler_skip_sources))
    if not problems:
        problems = [f"{config.path}: {p}" for p in identity_problems(config, REGISTRY)]
        problems += check_downstream_names(REGISTRY, config.downstream_names)
    if problems:
        raise ConfigError(*problems)
    if warn:
        for warning in handler_checks.warnings(REGISTRY, schemes):
            log.warning("handlers.pattern_never_matches", extra={"problem": warning})


def unsigned_fields(config: Config) -> dict[str, frozenset[str]]:
    """Per configured source, the event fields its signature leaves unsigned (``type`` or none; an
    unsigned id was already replaced with the signed body's digest by the scheme)."""
    return {
        name: frozenset() if (source.covers or source.scheme.covers).type else frozenset({"type"})
        for name, source in config.sources.items()
    }


def identity_problems(config: Config, registry: Registry) -> list[str]:
    """Effects whose key, lock-key or require function reads a field their source does not sign, without
    ``trust_unsigned=True`` (``handlers.plan.check_identity``), and key functions of two sources that can
    reach one tenant with no ``key_space`` declared (``check_key_spaces``): refused at start-up, named."""

    def overlapping(a: str, b: str) -> bool:
        x, y = config.sources.get(a), config.sources.get(b)
        return x is not None and y is not None and tenants_overlap(x, y)

    return check_identity(registry, unsigned_fields(config)) + check_key_spaces(registry, overlapping)


def tenants_overlap(x: Source, y: Source) -> bool:
    """Whether two sources can file effects under one tenant: their static tenants or allow-lists meet, a
    pattern matches the other's listed tenant, or both take patterns (which may always meet)."""
    listed_x = frozenset({x.tenant}) if x.tenant_from is None else x.tenants
    listed_y = frozenset({y.tenant}) if y.tenant_from is None else y.tenants
    if listed_x is not None and listed_y is not None and listed_x & listed_y:
        return True
    if x.tenant_pattern is not None and y.tenant_pattern is not None:
        return True
    for pattern, listed in ((x.tenant_pattern, listed_y), (y.tenant_pattern, listed_x)):
        if pattern is not None and listed and any(pattern.fullmatch(t) for t in listed):
            return True
    return False


def _import_failure(module: str, exc: Exception, where: str) -> str:
    """What went wrong importing ``module``, and how to fix it."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and (module == missing or module.startswith(missing + ".")):
        return (
            f"{type(exc).__name__}: {exc}. It was looked for in {where} and on the Python path; put the module there (a dotted name is a "
            "package path: 'myapp.handlers' is myapp/handlers.py), install it into this "
            "environment, or add its parent directory to PYTHONPATH"
        )
    if missing is not None:
        return (
            f"{type(exc).__name__}: {exc}; the module was found, but it imports {missing!r}, which "
            "is not installed in this environment"
        )
    frames = traceback.extract_tb(exc.__traceback__)
    # The innermost frame outside the import machinery is the line of the user's module that failed.
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" (at {user[-1].filename}:{user[-1].lineno})" if user else ""
    if isinstance(exc, SyntaxError):
        at = ""  # its message already names the file and line
    return f"{type(exc).__name__}: {exc}{at}; the module was found, but importing it raised this error"
