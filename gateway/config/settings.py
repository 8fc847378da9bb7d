"""The one declaration of every ``effectgate.toml`` setting.

``SETTINGS`` names each key once — its table, type, default, bounds, whether it names a secret, which
processes read it, and what it means. From it come the generated reference in ``docs/configuration.md``
(``config.reference``), the JSON Schema for editors (``config.schema``), ``effectgate
config show`` and the ``EFFECTGATE_<SECTION>__<KEY>`` environment overrides (``config.env``).

The parser (``gateway.config`` and its section modules) still reads each table itself, with the
cross-key rules a table of types cannot say. ``tests/unit/gateway/config/test_settings.py`` holds the two together: it
watches every key the parser asks for (``reader.reads``) and fails on one that is not declared
here, on one declared here that the parser never reads, and on a type, default or minimum that
differs. A branch that adds a key to the parser therefore adds it here too, or its tests fail.

Paths: ``gateway.penalty_box.cooling`` is a key of a fixed table; ``sources.*.scheme`` a key of every
``[sources.NAME]``; ``operators[].name`` a key of every ``[[operators]]`` entry.

Why one module of 774 lines (``wc -l``): 624 of them are one table, ``SETTINGS``, a few lines per key as
the formatter lays them out, read top to bottom in the order of the generated reference. Split per section,
the order of the reference and the one place a path is declared would be spread over files that must be kept
in step by hand; the code around the table (``Setting``, ``TABLES``, ``tables``) is about 130 lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from effectgate.handlers.downstream import RETRY_STATUSES
from effectgate.handlers.downstream.forward import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_TIMEOUT
from effectgate.handlers.effect_kind import DEFAULT_LEASE_TTL, DEFAULT_MAX_ATTEMPTS, DEFAULT_ORPHAN_POLICY
from effectgate.handlers.worker.config import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP
from effectgate.ledger.db import DEFAULT_POOL_MAX

# How a value is written in TOML:
#   string, integer, number (integer or float), boolean, strings (a list of strings), table (free keys),
#   days (a number of days > 0, or "forever" where the key says so), header (a header name, or false).
Kind = Literal["string", "integer", "number", "boolean", "strings", "table", "days", "header"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a key that must be set."""

BOTH = ("gateway", "worker")


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of ``effectgate.toml``.

    ``default`` is the value an absent key means (None: unset, the feature off or decided elsewhere;
    ``REQUIRED``: must be set); ``default_text`` says it in words where it depends on something else.
    ``secret`` marks a key whose value *names* an environment variable (or file) holding a secret, never
    the secret itself. ``roles`` are the processes that read the key (``serve`` is the gateway).
    """

    path: str
    kind: Kind
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[Any, ...] | None = None
    secret: bool = False
    roles: tuple[str, ...] = BOTH
    default_text: str | None = None
    # A key whose default does not apply when this other key of the table is set (tenant, with tenant_from).
    unless: str | None = None

    @property
    def table(self) -> str:
        """The table the key belongs to (``edge.penalty_box``, ``sources.*``, ``operators[]``)."""
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def env_var(self) -> str | None:
        """Its ``EFFECTGATE_<SECTION>__<KEY>`` override; None for keys of ``[[operators]]`` and free tables."""
        if "[]" in self.path or self.kind == "table":
            return None
        parts = ["NAME" if part == "*" else part.upper() for part in self.path.split(".")]
        return "EFFECTGATE_" + "__".join(parts)


# Tables, in the order the reference lists them, with what each is for.
TABLES: dict[str, str] = {
    "gateway": "The HTTP face: where it listens, how much it reads, the claim path's bounds.",
    "gateway.penalty_box": "A client that keeps failing authentication, or replays one delivery, is held off a source.",
    "database": "How a process meets its database at start (the URL itself is `EFFECTGATE_DATABASE_URL` "
    "or `DATABASE_URL`).",
    "worker": "How a worker takes and runs jobs.",
    "handlers": "The handler modules and which declared sources this deployment does not take.",
    "sources.*": "A webhook source, `[sources.NAME]`: its scheme, the secrets it verifies with, its tenant.",
    "downstream.*": "An API handlers call, `[downstream.NAME]` (`payments`, `shipping` or any name), "
    "reached as `ctx.downstream(NAME)`.",
    "effects.*": "A declared HTTP effect, `[effects.NAME]`: claimed like a Python effect, run by forwarding "
    "the event, signed, to a URL (docs/forwarding.md).",
    "effects.*.forward": "Where a declared effect's event is sent, `[effects.NAME.forward]`, and how its answer "
    "is read.",
    "operators[]": "An operator token for the API and dashboard, `[[operators]]`.",
    "dashboard": "The dashboard's sessions.",
    "operator": "The operator plane (`/ui`, `/api`, `/metrics`).",
    "metrics": "`GET /metrics`.",
    "tracing": "OpenTelemetry export (needs the `otel` extra); no table, no tracing.",
    "maintenance": "The maintenance services every process ticks.",
    "maintenance.lease_rescuer": "Expired leases taken off `running`.",
    "maintenance.pending_waker": "Due jobs woken again.",
    "maintenance.sweeps": "Sweeps registered with `registry.sweep`.",
    "maintenance.partitions": "Time partitions of deliveries, rejects and failed verifications.",
    "reconciler": "The older spelling of `[maintenance]`; use one of them, not both.",
    "retention": "How long payloads, history and tombstones are kept.",
    "retention.sources.*": "Per-source retention, `[retention.sources.NAME]` (NAME a configured source).",
}

_G = ("gateway",)
_W = ("worker",)


def statuses_text(statuses: frozenset[int]) -> str:
    """``statuses`` as the reference writes them: single statuses, then each whole class as ``5xx``, e.g.
    ``408, 409, 425, 429 and 5xx`` for ``RETRY_STATUSES`` (so the page follows the set, not a copy of it)."""
    classes = [c for c in range(3, 6) if set(range(c * 100, c * 100 + 100)) <= statuses]
    words = [str(s) for s in sorted(statuses) if s // 100 not in classes] + [f"{c}xx" for c in classes]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


SETTINGS: tuple[Setting, ...] = (
    # [gateway]
    Setting("gateway.host", "string", "127.0.0.1", "address `serve` listens on", roles=_G),
    Setting("gateway.port", "integer", 8000, "port `serve` listens on", minimum=0, maximum=65535, roles=_G),
    Setting(
        "gateway.max_body_bytes",
        "integer",
        1024 * 1024,
        "largest webhook body read (past it: 413)",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "gateway.pool_max",
        "integer",
        DEFAULT_POOL_MAX,
        "connections in each process's main database pool",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "gateway.run_reconciler",
        "boolean",
        True,
        "whether `serve` ticks maintenance too (false: it only answers)",
        roles=_G,
    ),
    Setting(
        "gateway.forwarded_allow_ips",
        "strings",
        [],
        'peers whose X-Forwarded-Proto/-For are believed: addresses, CIDR networks, or "*"',
        roles=_G,
    ),
    Setting(
        "gateway.header_timeout",
        "number",
        10.0,
        "seconds a client has to send a request's head",
        minimum=0.001,
        roles=_G,
    ),
    Setting(
        "gateway.body_timeout",
        "number",
        30.0,
        "seconds a client has to send the body after the head",
        minimum=0.001,
        roles=_G,
    ),
    Setting("gateway.max_header_bytes", "integer", 16 * 1024, "largest request head", minimum=1024, roles=_G),
    Setting(
        "gateway.claim_queue_max",
        "integer",
        1024,
        "claims waiting for a batch per process (past it: 503)",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "gateway.client_concurrency",
        "integer",
        64,
        "requests in flight per client address and process (0: no limit)",
        minimum=0,
        roles=_G,
    ),
    Setting(
        "gateway.claim_deadline",
        "number",
        2.0,
        "seconds a claim may wait to be taken into a batch (past it: 503)",
        minimum=0.001,
        roles=_G,
    ),
    Setting(
        "gateway.claim_lock_timeout",
        "number",
        0.5,
        "the claim pool's lock_timeout, seconds (less than claim_statement_timeout)",
        minimum=0.001,
        roles=_G,
    ),
    Setting(
        "gateway.claim_statement_timeout",
        "number",
        5.0,
        "the claim pool's statement_timeout, seconds",
        minimum=0.001,
        roles=_G,
    ),
    # [gateway.penalty_box]
    Setting("gateway.penalty_box.enabled", "boolean", True, "false: nobody is boxed", roles=_G),
    Setting(
        "gateway.penalty_box.failures",
        "integer",
        50,
        "failed authentications within `window` that box a client",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "gateway.penalty_box.window",
        "number",
        10.0,
        "seconds failures (and repeats of one delivery) are counted over",
        minimum=0.001,
        roles=_G,
    ),
    Setting(
        "gateway.penalty_box.cooling",
        "number",
        60.0,
        "seconds a boxed client stays boxed",
        minimum=0.001,
        roles=_G,
    ),
    Setting(
        "gateway.penalty_box.hold",
        "integer",
        None,
        "connections of boxed clients waiting (or held) unread at once per process; past it one is closed at once",
        minimum=0,
        roles=_G,
        default_text="min(2048, (F - 256) // 2), F the process's file limit once raised to its hard limit",
    ),
    Setting(
        "gateway.penalty_box.mode",
        "string",
        "one_at_a_time",
        "what a boxed client's new connections get: `one_at_a_time` (served in turn, one request in flight "
        "per process) or `held` (no answer until the header timeout)",
        choices=("one_at_a_time", "held"),
        roles=_G,
    ),
    Setting(
        "gateway.penalty_box.max_clients",
        "integer",
        10_000,
        "(client, source) pairs remembered per process",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "gateway.penalty_box.replays",
        "integer",
        20,
        "times one delivery may be sent by a client within `window` before it is boxed (0: never)",
        minimum=0,
        roles=_G,
    ),
    # [database]
    Setting(
        "database.startup_wait",
        "number",
        30.0,
        "seconds a starting process retries an unreachable Postgres (0: once)",
        minimum=0,
    ),
    Setting(
        "database.migration_wait",
        "number",
        60.0,
        "seconds `serve`/`worker --no-migrate` wait for the expected schema (0: check once)",
        minimum=0,
    ),
    Setting(
        "database.schema",
        "string",
        "effectgate",
        "the Postgres schema every effectgate table, type and function lives in (`EFFECTGATE_SCHEMA` wins)",
    ),
    Setting(
        "database.idle_in_transaction_timeout",
        "number",
        30.0,
        "seconds the server lets a session sit idle in a transaction (or holding a keeper's lock) before it "
        "ends it and frees its locks: the bound on a frozen or cut-off process (0: none)",
        minimum=0,
    ),
    # [worker]
    Setting(
        "worker.concurrency",
        "integer",
        64,
        "jobs a worker runs at once (and the most downstream calls it makes at once)",
        minimum=1,
        roles=_W,
    ),
    Setting(
        "worker.handler_connections",
        "integer",
        16,
        "the most connections a worker's running jobs share for their writes (steps, checkpoints, fenced "
        "writes); a job holds one only while it writes",
        minimum=1,
        roles=_W,
    ),
    Setting(
        "worker.poll_interval",
        "number",
        2.0,
        "seconds between polls when no notification came",
        minimum=0.001,
        roles=_W,
    ),
    Setting(
        "worker.drain_timeout",
        "number",
        30.0,
        "seconds a stopping worker lets running jobs finish",
        minimum=0,
        roles=_W,
    ),
    Setting(
        "worker.backoff_base",
        "number",
        DEFAULT_BACKOFF_BASE,
        "seconds of the first retry's backoff (0: no waits, for every kind)",
        minimum=0,
        roles=_W,
    ),
    Setting(
        "worker.backoff_cap",
        "number",
        DEFAULT_BACKOFF_CAP,
        "longest backoff, seconds (>= backoff_base)",
        minimum=0,
        roles=_W,
    ),
    # [handlers]
    Setting("handlers.modules", "strings", [], "modules that register effects on import"),
    Setting(
        "handlers.skip_sources",
        "strings",
        [],
        "sources the modules declare effects for that this deployment does not take",
    ),
    # [sources.NAME]
    Setting(
        "sources.*.scheme", "string", REQUIRED, "the provider's signature scheme (`stripe`, `github`, …)"
    ),
    Setting(
        "sources.*.secrets",
        "strings",
        REQUIRED,
        "names of the environment variables holding the webhook secrets (several while rotating)",
        secret=True,
        roles=_G,
    ),
    Setting(
        "sources.*.tolerance",
        "integer",
        None,
        "seconds a signed timestamp may be off",
        minimum=1,
        roles=_G,
        default_text="the scheme's own",
    ),
    Setting(
        "sources.*.tenant",
        "string",
        "default",
        "the tenant its effects are filed under (or tenant_from)",
        unless="tenant_from",
    ),
    Setting(
        "sources.*.tenant_from",
        "string",
        None,
        'JSON pointer to each event\'s tenant in its payload (e.g. "/account"); needs tenants or tenant_pattern',
    ),
    Setting("sources.*.tenants", "strings", None, "the tenants tenant_from may name"),
    Setting(
        "sources.*.tenant_pattern", "string", None, "a regular expression the tenants tenant_from names match"
    ),
    Setting(
        "sources.*.on_conflict",
        "integer",
        None,
        "answer to a key conflict: 409 or 200",
        choices=(409, 200),
        roles=_G,
        default_text="the provider's (200 for an unknown scheme)",
    ),
    Setting(
        "sources.*.on_refusal",
        "string",
        None,
        "answer to a verified delivery that cannot become effects, once kept: 200 with the refusal, or its 4xx",
        choices=("acknowledge", "reject"),
        roles=_G,
        default_text='the provider\'s ("acknowledge"; "reject" for GitHub)',
    ),
    Setting("sources.*.options", "table", None, "the scheme's own options (docs/providers.md)"),
    # [downstream.NAME]
    Setting("downstream.*.base_url", "string", REQUIRED, "the API's base URL", roles=_W),
    Setting(
        "downstream.*.api_key_env",
        "string",
        None,
        "name of the environment variable holding the API key",
        secret=True,
        roles=_W,
    ),
    Setting(
        "downstream.*.api_key_file",
        "string",
        None,
        "a file holding the API key (relative to the configuration file)",
        secret=True,
        roles=_W,
    ),
    Setting(
        "downstream.*.auth_scheme", "string", "bearer", "how the key is sent (`bearer`, `basic`, …)", roles=_W
    ),
    Setting(
        "downstream.*.idempotency_header",
        "header",
        "Idempotency-Key",
        "header carrying the idempotency key, or false for an API that takes none",
        roles=_W,
    ),
    Setting("downstream.*.timeout", "number", 10.0, "seconds per request", minimum=0.001, roles=_W),
    Setting("downstream.*.connect_timeout", "number", 5.0, "seconds to connect", minimum=0.001, roles=_W),
    Setting(
        "downstream.*.max_in_flight",
        "integer",
        None,
        "calls to it at once per worker process (none: as many as the worker's slots); a call waits for "
        "its turn at most `timeout` seconds, then is retried later, not sent",
        minimum=1,
        roles=_W,
    ),
    Setting(
        "downstream.*.max_per_second",
        "number",
        None,
        "calls to it started a second (none: no limit), spaced evenly, by every worker process of the ledger "
        "together (`pace_scope`); leave room below the provider's limit (Stripe: 100 a second live, 25 in a "
        "sandbox)",
        minimum=0.001,
        roles=_W,
    ),
    Setting(
        "downstream.*.pace_scope",
        "string",
        "ledger",
        "who shares `max_per_second` and a 429's hold: `ledger`, every worker process of the ledger (one "
        "schedule in its `downstream_paces` table, a statement a call), or `process`, each alone",
        choices=("ledger", "process"),
        roles=_W,
    ),
    # [effects.NAME] and [effects.NAME.forward]
    Setting("effects.*.source", "string", REQUIRED, "the configured source whose deliveries it takes"),
    Setting("effects.*.events", "strings", REQUIRED, "event types it takes (patterns with '*' allowed)"),
    Setting(
        "effects.*.key",
        "string",
        REQUIRED,
        "the effect key template: text and {/json/pointer} fields of the signed payload",
    ),
    Setting("effects.*.lock_key", "string", None, "a template naming the object runs of it serialise on"),
    Setting(
        "effects.*.version",
        "string",
        None,
        "with lock_key: a JSON pointer to a field of the signed payload that grows per object; older "
        "deliveries are superseded, never run (docs/ordering.md)",
    ),
    Setting(
        "effects.*.fingerprint", "strings", None, "JSON pointers whose values tell a retry from a conflict"
    ),
    Setting(
        "effects.*.key_space", "string", None, "`source` or `shared` (ADR 0007)", choices=("source", "shared")
    ),
    Setting(
        "effects.*.max_attempts", "integer", DEFAULT_MAX_ATTEMPTS, "attempts before the job fails", minimum=1
    ),
    Setting(
        "effects.*.orphan_policy",
        "string",
        DEFAULT_ORPHAN_POLICY,
        "what a lost lease leads to: `redrive` or `park`",
        choices=("redrive", "park"),
    ),
    Setting("effects.*.lease_ttl", "number", DEFAULT_LEASE_TTL, "seconds a lease lasts", minimum=0.001),
    Setting(
        "effects.*.backoff_base",
        "number",
        None,
        "this effect's first retry backoff, seconds",
        minimum=0.001,
        default_text="[worker] backoff_base",
    ),
    Setting(
        "effects.*.backoff_cap",
        "number",
        None,
        "this effect's longest backoff, seconds (>= its backoff_base)",
        minimum=0.001,
        default_text="[worker] backoff_cap",
    ),
    Setting("effects.*.forward.url", "string", REQUIRED, "the URL the signed event is POSTed to", roles=_W),
    Setting(
        "effects.*.forward.timeout", "number", DEFAULT_TIMEOUT, "seconds per request", minimum=0.001, roles=_W
    ),
    Setting(
        "effects.*.forward.max_answer_bytes",
        "integer",
        DEFAULT_MAX_ANSWER_BYTES,
        "largest answer read (the rest is cut)",
        minimum=1,
        roles=_W,
    ),
    Setting(
        "effects.*.forward.retry_statuses",
        "strings",
        None,
        'answers retried with backoff: statuses and classes such as "5xx"',
        roles=_W,
        default_text=statuses_text(RETRY_STATUSES),
    ),
    Setting(
        "effects.*.forward.secret_env",
        "string",
        None,
        "name of the environment variable holding the signing secret (or secret_file)",
        secret=True,
        roles=_W,
    ),
    Setting(
        "effects.*.forward.secret_file",
        "string",
        None,
        "a file holding the signing secret (relative to the configuration file)",
        secret=True,
        roles=_W,
    ),
    # [[operators]]
    Setting("operators[].name", "string", REQUIRED, "the operator's name, for the audit log", roles=_G),
    Setting(
        "operators[].token_sha256",
        "string",
        None,
        "the SHA-256 of the token, 64 hex digits (or token_env)",
        roles=_G,
    ),
    Setting(
        "operators[].token_env",
        "string",
        None,
        "name of the environment variable holding the token (or token_sha256)",
        secret=True,
        roles=_G,
    ),
    Setting("operators[].scopes", "strings", REQUIRED, '"view" and/or "operate"', roles=_G),
    # [dashboard]
    Setting(
        "dashboard.session_secret_env",
        "string",
        None,
        "name of the environment variable holding the session cookies' signing secret",
        secret=True,
        roles=_G,
        default_text="a random one per `serve`",
    ),
    Setting(
        "dashboard.session_ttl",
        "number",
        8 * 3600.0,
        "seconds a dashboard session lasts",
        minimum=60,
        roles=_G,
    ),
    # [operator]
    Setting(
        "operator.listen",
        "string",
        None,
        "`HOST:PORT` of an operator listener of its own",
        roles=_G,
        default_text="the gateway's own port",
    ),
    Setting(
        "operator.secure_cookies",
        "boolean",
        None,
        "session cookie always (true) or never (false) Secure",
        roles=_G,
        default_text="Secure over https",
    ),
    Setting(
        "operator.throttle_limit",
        "integer",
        10,
        "wrong operator tokens per client and window before 429",
        minimum=1,
        roles=_G,
    ),
    Setting(
        "operator.throttle_window", "number", 300.0, "the throttle's window, seconds", minimum=1, roles=_G
    ),
    # [metrics]
    Setting(
        "metrics.token_env",
        "string",
        None,
        "name of the environment variable holding /metrics' bearer token",
        secret=True,
        default_text="no token",
    ),
    # [tracing]
    Setting("tracing.endpoint", "string", REQUIRED, "OTLP/HTTP traces URL"),
    Setting("tracing.service_name", "string", "effectgate", "the service.name resource attribute"),
    Setting("tracing.sample_ratio", "number", 1.0, "fraction of new traces kept", minimum=0, maximum=1),
    Setting("tracing.timeout", "number", 10.0, "seconds per export request", minimum=0.001),
    # [maintenance]
    Setting("maintenance.tick", "number", 15.0, "seconds between maintenance passes", minimum=0.001),
    Setting(
        "maintenance.lease_rescuer.batch", "integer", 1000, "expired leases taken per statement", minimum=1
    ),
    Setting(
        "maintenance.lease_rescuer.poison_threshold",
        "integer",
        3,
        "times in a row a job may be orphaned before it is parked as poison",
        minimum=1,
    ),
    Setting(
        "maintenance.pending_waker.pending_ttl",
        "number",
        900.0,
        "seconds a due job waits before it is woken again",
        minimum=0.001,
    ),
    Setting("maintenance.pending_waker.batch", "integer", 1000, "due jobs woken per pass", minimum=1),
    Setting("maintenance.sweeps.enabled", "boolean", True, "run the registered sweeps"),
    Setting(
        "maintenance.partitions.interval_hours",
        "number",
        24.0,
        "width of each partition, hours",
        minimum=1 / 60,
    ),
    Setting(
        "maintenance.partitions.premake", "integer", 3, "partitions made ahead of the current one", minimum=1
    ),
    # [reconciler] (older spelling)
    Setting("reconciler.tick", "number", 15.0, "= maintenance.tick", minimum=0.001),
    Setting(
        "reconciler.pending_ttl", "number", 900.0, "= maintenance.pending_waker.pending_ttl", minimum=0.001
    ),
    Setting(
        "reconciler.poison_threshold", "integer", 3, "= maintenance.lease_rescuer.poison_threshold", minimum=1
    ),
    Setting(
        "reconciler.signature_failure_retention_days",
        "number",
        30,
        "= retention.signature_failures_days",
        minimum=0.001,
    ),
    # [retention]
    Setting(
        "retention.payloads_days",
        "days",
        30.0,
        "days a finished effect's payload is kept",
        minimum=0,
        exclusive_minimum=True,
    ),
    Setting(
        "retention.history_days",
        "days",
        90.0,
        "days deliveries and finished jobs are kept",
        minimum=0,
        exclusive_minimum=True,
    ),
    Setting(
        "retention.tombstones_days",
        "days",
        "forever",
        'days a tombstone (the dedupe window) is kept, or "forever"',
        minimum=0,
        exclusive_minimum=True,
    ),
    Setting(
        "retention.signature_failures_days",
        "days",
        30.0,
        "days failed-verification counters are kept",
        minimum=0,
        exclusive_minimum=True,
    ),
    Setting("retention.batch", "integer", 1000, "rows per purge statement", minimum=1),
    Setting(
        "retention.sources.*.payloads_days",
        "days",
        None,
        "this source's payload window",
        minimum=0,
        exclusive_minimum=True,
        default_text="retention.payloads_days",
    ),
    Setting(
        "retention.sources.*.tombstones_days",
        "days",
        None,
        'this source\'s dedupe window, or "forever"',
        minimum=0,
        exclusive_minimum=True,
        default_text="retention.tombstones_days",
    ),
    Setting(
        "retention.sources.*.provider_retry_hours",
        "number",
        None,
        "how long this source's sender retries, hours",
        minimum=0,
        default_text="the provider's (docs/providers.md)",
    ),
)

BY_PATH: dict[str, Setting] = {s.path: s for s in SETTINGS}


def tables() -> list[str]:
    """Every table a setting lives in, parents included (``sources.*`` for ``sources.*.scheme``)."""
    found: dict[str, None] = {}
    for setting in SETTINGS:
        parts = setting.table.split(".")
        for end in range(1, len(parts) + 1):
            found[".".join(parts[:end])] = None
    return list(found)
