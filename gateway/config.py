"""Loading and validating ``effectgate.toml``.

Every mistake is reported at start, all of them at once, naming the file, the key and what is wrong
(with a "did you mean" for a misspelt key); secrets are named by the environment variables that hold
them and never read from the file itself.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import os
import re
import sys
import tomllib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.plan import MAX_TENANT_LENGTH, TenantRule, check_identity, check_key_spaces
from effectgate.handlers.registry import REGISTRY, Registry
from effectgate.handlers.tracing import TracingConfig, TracingUnavailable, check_available
from effectgate.handlers.worker import WorkerConfig
from effectgate.ledger import rescuer as rescuer_defaults
from effectgate.ledger import waker as waker_defaults
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

from . import guard
from .operator.auth import MIN_TOKEN_LENGTH, OperatorToken, read_operators
from .providers import CONFLICT_STATUSES, ConflictStatus, default_conflict_status
from .retry_windows import DAY, HOUR, RETRY_WINDOWS, retry_window
from .signatures import Scheme, SchemeConfigError, build_scheme
from .toml_reader import ConfigError as ConfigError  # re-exported: callers catch it from here
from .toml_reader import TableReader

DEFAULT_CONFIG_FILE = "effectgate.toml"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_POOL_MAX = 10
DEFAULT_SESSION_TTL = 8 * 3600.0
# How long a process starting while Postgres is unreachable keeps trying before it exits 1: long enough
# for a database container started alongside it to come up, short enough that a wrong host is noticed.
DEFAULT_STARTUP_WAIT = 30.0


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

    @property
    def limits(self) -> guard.Limits:
        """The connection guard's limits."""
        return guard.Limits(self.header_timeout, self.body_timeout, self.max_header_bytes)


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """The dashboard's sessions: the secret their cookies are signed with, and how long one lasts."""

    # None: each serve makes a random one at start (sessions end when it restarts, and replicas do not
    # share them). Set it for several replicas; change it to end every session at once.
    session_secret: bytes | None = None
    session_ttl: float = DEFAULT_SESSION_TTL


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """How a process meets its database at start ([database]; the URL itself is ``DATABASE_URL``)."""

    # Seconds a starting process retries an unreachable Postgres before it gives up (0: try once).
    startup_wait: float = DEFAULT_STARTUP_WAIT


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration of one effectgate deployment."""

    path: str
    sources: Mapping[str, Source]
    handler_modules: tuple[str, ...]
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    payments: DownstreamConfig | None = None
    shipping: DownstreamConfig | None = None
    # Bearer tokens for the operator API and dashboard ([[operators]]); none configured, none let in.
    operators: tuple[OperatorToken, ...] = ()
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    # The SHA-256 of the bearer token GET /metrics asks for ([metrics] token_env); None: no token.
    metrics_token_sha256: bytes | None = None
    # OpenTelemetry export ([tracing]); None: no spans, and nothing of OpenTelemetry imported.
    tracing: TracingConfig | None = None
    database: DatabaseConfig = field(default_factory=DatabaseConfig)


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


def _source(name: str, table: TableReader, env: Mapping[str, str]) -> Source | None:
    scheme_name = table.get("scheme", str, required=True)
    secret_envs = table.get("secrets", list, required=True)
    secrets: list[str] = []
    if secret_envs is not None:
        if not secret_envs or not all(isinstance(s, str) and s for s in secret_envs):
            table.problem("secrets", "must be a non-empty list of environment variable names")
        else:
            for var in secret_envs:
                value = env.get(var)
                if not value:
                    table.problem("secrets", f"environment variable {var} is not set (or empty)")
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
    if scheme_name == "paypal" and options:
        options = _paypal_credentials(options, table, env)
    table.no_unknown_keys()
    if table.failed:
        return None
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
            table.problem(f"options.{option}", f"environment variable {var} is not set (or empty)")
        else:
            resolved[target] = env[var]
    return resolved


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


def _downstream(reader: TableReader, env: Mapping[str, str]) -> DownstreamConfig | None:
    if not reader.table:
        return None
    base_url = reader.get("base_url", str, required=True)
    api_key_env = reader.get("api_key_env", str)
    api_key = None
    if api_key_env:
        api_key = env.get(api_key_env)
        if not api_key:
            reader.problem("api_key_env", f"environment variable {api_key_env} is not set (or empty)")
    timeout = reader.number("timeout", 10.0, minimum=0.001)
    connect_timeout = reader.number("connect_timeout", 5.0, minimum=0.001)
    reader.no_unknown_keys()
    if reader.failed:
        return None
    try:
        return DownstreamConfig(
            base_url=base_url, api_key=api_key, timeout=timeout, connect_timeout=connect_timeout
        )
    except ValueError as exc:
        reader.problem("base_url", str(exc))
        return None


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


def parse(text: str, *, path: str = "<config>", env: Mapping[str, str] | None = None) -> Config:
    """Validate a configuration text; raises ``ConfigError`` naming the file and key of every mistake."""
    env = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    root = TableReader(path, "", data)

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
    )
    if gateway.port > 65535:
        gw.problem("port", f"must be <= 65535, got {gateway.port}")
    gw.no_unknown_keys()

    dbt = root.table_of("database")
    database = DatabaseConfig(startup_wait=dbt.number("startup_wait", DEFAULT_STARTUP_WAIT, minimum=0))
    dbt.no_unknown_keys()

    reconciler = _maintenance(root)

    wk = root.table_of("worker")
    backoff_base = wk.number("backoff_base", 1.0, minimum=0)
    backoff_cap = wk.number("backoff_cap", 600.0, minimum=0)
    if backoff_cap < backoff_base:
        wk.problem("backoff_cap", f"must be >= backoff_base ({backoff_base:g}), got {backoff_cap:g}")
        backoff_cap = backoff_base
    worker = WorkerConfig(
        concurrency=wk.number("concurrency", 4, minimum=1, integer=True),
        poll_interval=wk.number("poll_interval", 2.0, minimum=0.001),
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
        source = _source(name, src.table_of(name), env)
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

    ds = root.table_of("downstream")
    payments = _downstream(ds.table_of("payments"), env)
    shipping = _downstream(ds.table_of("shipping"), env)
    ds.no_unknown_keys()

    operators = read_operators(root, env)
    dashboard = _dashboard(root.table_of("dashboard"), env)
    metrics_token_sha256 = _metrics_token(root.table_of("metrics"), env)
    tracing = _tracing(root.table_of("tracing"))
    root.no_unknown_keys()
    if root.problems:
        raise ConfigError(*root.problems)
    return Config(
        path=path,
        sources=sources,
        handler_modules=tuple(modules),
        gateway=gateway,
        worker=worker,
        payments=payments,
        shipping=shipping,
        operators=operators,
        dashboard=dashboard,
        metrics_token_sha256=metrics_token_sha256,
        tracing=tracing,
        database=database,
    )


def _secret(reader: TableReader, key: str, env: Mapping[str, str]) -> str | None:
    var = reader.get(key, str)
    if var is None:
        return None
    value = env.get(var, "")
    if not value:
        reader.problem(key, f"environment variable {var} is not set (or empty)")
        return None
    if len(value) < MIN_TOKEN_LENGTH:
        reader.problem(key, f"the secret in {var} is shorter than {MIN_TOKEN_LENGTH} characters")
        return None
    return value


def _dashboard(reader: TableReader, env: Mapping[str, str]) -> DashboardConfig:
    secret = _secret(reader, "session_secret_env", env)
    ttl = reader.number("session_ttl", DEFAULT_SESSION_TTL, minimum=60)
    reader.no_unknown_keys()
    return DashboardConfig(None if secret is None else secret.encode("utf-8"), ttl)


def _metrics_token(reader: TableReader, env: Mapping[str, str]) -> bytes | None:
    token = _secret(reader, "token_env", env)
    reader.no_unknown_keys()
    return None if token is None else hashlib.sha256(token.encode("utf-8")).digest()


def load(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{p}: configuration file not found (pass --config or set EFFECTGATE_CONFIG)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc}") from exc
    return parse(text, path=str(p), env=env)


def app_dir(config: Config) -> Path:
    """Where handler modules are looked for first: the configuration file's directory, or the
    current directory when the configuration did not come from a file."""
    path = Path(config.path)
    return path.resolve().parent if path.is_file() else Path.cwd()


def import_handlers(config: Config) -> None:
    """Import the configured handler modules, which register their effects on import.

    The configuration file's directory goes first on ``sys.path`` (as uvicorn's ``--app-dir`` does), so
    a handler module kept next to ``effectgate.toml`` imports without ``PYTHONPATH``, from any working
    directory and in every process of ``serve --workers N``. Every module that fails is reported at
    once, with the error and what to do about it.
    """
    directory = str(app_dir(config))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    where = f"{directory} (the configuration file's directory)" if Path(config.path).is_file() else directory
    problems = []
    for module in config.handler_modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            problems.append(
                f"{config.path}: handlers.modules: cannot import {module!r}: {_import_failure(module, exc, where)}"
            )
    if not problems:
        problems = [f"{config.path}: {p}" for p in identity_problems(config, REGISTRY)]
    if problems:
        raise ConfigError(*problems)


def unsigned_fields(config: Config) -> dict[str, frozenset[str]]:
    """Per configured source, the event fields its signature leaves unsigned (``type`` or none; an
    unsigned id was already replaced with the signed body's digest by the scheme)."""
    return {
        name: frozenset() if source.scheme.covers.type else frozenset({"type"})
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
