"""Loading and validating ``effectgate.toml``.

Every mistake is reported at start, all of them at once, naming the file, the key and what is wrong
(with a "did you mean" for a misspelt key); secrets are named by the environment variables that hold
them and never read from the file itself.

``parse`` reads the file section by section, and the sections live beside it, one module per table:
``gateway`` (``[gateway]``), ``sources``, ``downstreams``, ``maintenance`` (with ``[retention]``),
``operator`` (``[[operators]]``, ``[operator]``, ``[dashboard]``, ``[metrics]``) and ``effects``; the
reader they share is ``reader``, the secrets' sources ``secrets``, what each provider does ``providers``,
and every key's one declaration ``settings`` (with ``env``, ``schema``, ``reference`` and ``show`` made
from it). Importing the handler modules it names, and checking them against it, is ``handler_imports``
(with ``handler_checks``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.forward import DeclaredEffect
from effectgate.handlers.tracing import TracingConfig, TracingUnavailable, check_available
from effectgate.handlers.worker.config import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_CONCURRENCY,
    DEFAULT_HANDLER_CONNECTIONS,
    DEFAULT_POLL_INTERVAL,
    WorkerConfig,
)
from effectgate.ledger.db import DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT, DEFAULT_SCHEMA, check_schema_name

from .downstreams import read_downstreams
from .effects import read_effects
from .env import mention as env_mention
from .env import override as env_override
from .gateway import GatewayConfig, read_gateway
from .maintenance import read_maintenance, read_retention
from .operator import (
    DashboardConfig,
    OperatorConfig,
    OperatorToken,
    read_dashboard,
    read_metrics_token,
    read_operator,
    read_operators,
)
from .reader import ConfigError as ConfigError  # re-exported: callers catch it from here
from .reader import TableReader
from .secrets import ROLE_SECRETS, Role, SecretEnv
from .sources import Source as Source  # re-exported: ingress takes it from here
from .sources import read_sources

DEFAULT_CONFIG_FILE = "effectgate.toml"
# How long a process starting while Postgres is unreachable keeps trying before it exits 1: long enough
# for a database container started alongside it to come up, short enough that a wrong host is noticed.
DEFAULT_STARTUP_WAIT = 30.0
# Seconds `serve`/`worker --no-migrate` wait for the schema this version expects before refusing to start.
DEFAULT_MIGRATION_WAIT = 60.0


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
    # Seconds the server lets a session of the pools sit idle inside a transaction (or holding a keeper's
    # session lock) before it ends it and frees its locks: the bound on a frozen or cut-off process (0: none;
    # deploy/README.md, "Frozen or cut-off processes").
    idle_in_transaction_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT

    @property
    def idle_bound(self) -> float | None:
        """``idle_in_transaction_timeout`` as ``ledger.db`` takes it (None: no limit)."""
        return self.idle_in_transaction_timeout or None


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


def read_tracing(reader: TableReader) -> TracingConfig | None:
    """``[tracing]``; None when the table is absent (no spans, and nothing of OpenTelemetry imported)."""
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


def parse(
    text: str, *, path: str = "<config>", env: Mapping[str, str] | None = None, role: Role = "all"
) -> Config:
    """Validate a configuration text; raises ``ConfigError`` naming the file and key of every mistake.

    Secrets are read from ``env`` (default: the process environment), from ``NAME_FILE`` or from
    ``$CREDENTIALS_DIRECTORY`` (``config.secrets``), and only those ``role`` uses: a gateway
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
    # EFFECTGATE_<SECTION>__<KEY> wins over the file (gateway.config.env).
    env_origins: dict[str, str] = {}
    data, env_problems = env_override(data, os.environ if env is None else env, env_origins)
    root = TableReader(path, "", data)
    root.problems.extend(env_problems)

    gateway = read_gateway(root.table_of("gateway"))

    dbt = root.table_of("database")
    database = DatabaseConfig(
        startup_wait=dbt.number("startup_wait", DEFAULT_STARTUP_WAIT, minimum=0),
        migration_wait=dbt.number("migration_wait", DEFAULT_MIGRATION_WAIT, minimum=0),
        schema=_schema_name(dbt),
        idle_in_transaction_timeout=dbt.number(
            "idle_in_transaction_timeout", DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT, minimum=0
        ),
    )
    dbt.no_unknown_keys()

    reconciler = read_maintenance(root)

    wk = root.table_of("worker")
    backoff_base = wk.number("backoff_base", DEFAULT_BACKOFF_BASE, minimum=0)
    backoff_cap = wk.number("backoff_cap", DEFAULT_BACKOFF_CAP, minimum=0)
    if backoff_cap < backoff_base:
        wk.problem("backoff_cap", f"must be >= backoff_base ({backoff_base:g}), got {backoff_cap:g}")
        backoff_cap = backoff_base
    worker = WorkerConfig(
        concurrency=wk.number("concurrency", DEFAULT_CONCURRENCY, minimum=1, integer=True),
        handler_connections=wk.number(
            "handler_connections", DEFAULT_HANDLER_CONNECTIONS, minimum=1, integer=True
        ),
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

    sources = read_sources(root, env_for("webhook"))

    worker = replace(
        worker,
        reconciler=replace(
            reconciler,
            retention=read_retention(root, sources, reconciler.retention_config().signature_failures),
        ),
    )

    downstreams, downstream_names = read_downstreams(root, env_for("downstream"))
    # The forward secret is a downstream credential: only a role that forwards reads it.
    effects = read_effects(root, sources, env_for("downstream"))

    operator_env = env_for("operator")
    if operator_env is not None:
        operators = read_operators(root, operator_env)
    else:
        root.used.add("operators")  # a worker lets no operator in: the tokens are not its to hold
        operators = ()
    dashboard = read_dashboard(root.table_of("dashboard"), operator_env)
    operator = read_operator(root.table_of("operator"), gateway)
    metrics_token_sha256 = read_metrics_token(root.table_of("metrics"), env_for("metrics"))
    root.problems.extend(f"{path}: {problem}" for problem in secret_env.problems)
    tracing = read_tracing(root.table_of("tracing"))
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
