"""``[effects.NAME]``: declared HTTP effects in the configuration (``handlers.downstream.forward``).

Its own module so the configuration's other sections and this one change apart; ``gateway.config`` calls
``read_effects`` once. Every mistake is reported as ``file: effects.NAME.key: what``, like the rest of the
configuration, and all of them in one pass. The signing secret is read only by a process whose role reads
downstream credentials (the worker, and ``up``): the gateway computes keys and never forwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectgate.handlers.downstream import RETRY_STATUSES
from effectgate.handlers.downstream.forward import (
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_TIMEOUT,
    DeclaredEffect,
    ForwardTarget,
    KeyTemplate,
)
from effectgate.handlers.effect_kind import DEFAULT_LEASE_TTL, DEFAULT_MAX_ATTEMPTS, DEFAULT_ORPHAN_POLICY

from .reader import TableReader
from .secrets import env_or_file

_STATUS_CLASSES = {"3xx": range(300, 400), "4xx": range(400, 500), "5xx": range(500, 600)}


def read_effects(
    root: TableReader, sources: Mapping[str, Any], env: Mapping[str, str] | None
) -> tuple[DeclaredEffect, ...]:
    """Every ``[effects.NAME]``, validated; ``env`` None (a role that never forwards) reads no secret."""
    section = root.table_of("effects")
    effects = []
    # Named in the file, parsed or not: a source with a mistake of its own is not reported twice.
    declared_sources = root.table.get("sources")
    if isinstance(declared_sources, dict):
        sources = {**declared_sources, **sources}
    for name in section.table:
        if not isinstance(section.table[name], dict):
            section.used.add(name)
            section.problem(name, "must be a table ([effects.NAME])")
            continue
        declared = _effect(name, section.table_of(name), sources, env)
        if declared is not None:
            effects.append(declared)
    return tuple(effects)


def _effect(
    name: str, reader: TableReader, sources: Mapping[str, Any], env: Mapping[str, str] | None
) -> DeclaredEffect | None:
    source = reader.get("source", str, required=True)
    if source is not None and source not in sources:
        known = ", ".join(sorted(sources)) or "none"
        reader.problem("source", f"{source!r} is not a configured source ([sources.NAME]: {known})")
    events = reader.get("events", list, required=True)
    if events is not None and (not events or not all(isinstance(e, str) and e for e in events)):
        reader.problem("events", "must be a non-empty list of event types (patterns with '*' allowed)")
    key = _template(reader, "key", required=True)
    lock_key = _template(reader, "lock_key", required=False)
    version = reader.get("version", str)
    fingerprint = reader.get("fingerprint", list)
    key_space = reader.get("key_space", str)
    if key_space is not None and key_space not in ("source", "shared"):
        reader.problem("key_space", f"must be 'source' or 'shared', got {key_space!r}")
    max_attempts = reader.number("max_attempts", DEFAULT_MAX_ATTEMPTS, minimum=1, integer=True)
    orphan_policy = reader.get("orphan_policy", str, DEFAULT_ORPHAN_POLICY)
    if orphan_policy not in ("redrive", "park"):
        reader.problem("orphan_policy", f"must be 'redrive' or 'park', got {orphan_policy!r}")
    lease_ttl = reader.number("lease_ttl", DEFAULT_LEASE_TTL, minimum=0.001)
    # Unset: the worker's [worker] backoff_base / backoff_cap. EffectKind refuses a cap below the base.
    backoff_base = reader.number("backoff_base", None, minimum=0.001)
    backoff_cap = reader.number("backoff_cap", None, minimum=0.001)
    forward = _forward(reader.table_of("forward"), env)
    if "forward" not in reader.table:
        reader.missing.append("forward")
        reader.failed = True
    reader.no_unknown_keys()
    if reader.failed or key is None or forward is None:
        return None
    try:
        declared = DeclaredEffect(
            name=name,
            source=source,
            events=tuple(events),
            key=key,
            forward=forward,
            fingerprint=None if fingerprint is None else tuple(fingerprint),
            lock_key=lock_key,
            version=version,
            key_space=key_space,
            max_attempts=max_attempts,
            orphan_policy=orphan_policy,
            lease_ttl=lease_ttl,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        # The registry's own checks (fingerprint pointers, lease settings), at start-up, not first delivery.
        declared.kind()
    except ValueError as exc:
        reader.problems.append(f"{reader.path}: {reader.prefix}: {exc}")
        return None
    return declared


def _template(reader: TableReader, key: str, *, required: bool) -> KeyTemplate | None:
    text = reader.get(key, str, required=required)
    if text is None:
        return None
    try:
        return KeyTemplate(text)
    except ValueError as exc:
        reader.problem(key, str(exc))
        return None


def _forward(reader: TableReader, env: Mapping[str, str] | None) -> ForwardTarget | None:
    if not reader.table:
        return None
    url = reader.get("url", str, required=True)
    timeout = reader.number("timeout", DEFAULT_TIMEOUT, minimum=0.001)
    max_answer_bytes = reader.number("max_answer_bytes", DEFAULT_MAX_ANSWER_BYTES, minimum=1, integer=True)
    retry_statuses = _statuses(reader, "retry_statuses")
    secret = env_or_file(reader, env, "secret", "secrets")
    if not reader.table.get("secret_env") and not reader.table.get("secret_file"):
        reader.problem("secret_env", "is required (or secret_file): the forwarded request is signed with it")
    reader.no_unknown_keys()
    if reader.failed:
        return None
    try:
        return ForwardTarget(
            url=url,
            timeout=timeout,
            max_answer_bytes=max_answer_bytes,
            secret=secret,
            retry_statuses=retry_statuses,
        )
    except ValueError as exc:
        # ForwardTarget's messages begin with the field they are about.
        field = str(exc).split(" ", 1)[0]
        if field == "secret":
            field = "secret_file" if "secret_file" in reader.table else "secret_env"
        reader.problem(field, str(exc))
        return None


def _statuses(reader: TableReader, key: str) -> frozenset[int]:
    values = reader.get(key, list)
    if values is None:
        return RETRY_STATUSES
    statuses: set[int] = set()
    for value in values:
        if isinstance(value, str) and value in _STATUS_CLASSES:
            statuses.update(_STATUS_CLASSES[value])
        elif isinstance(value, int) and not isinstance(value, bool) and 300 <= value <= 599:
            statuses.add(value)
        else:
            reader.problem(key, f"entries are statuses 300..599 or '3xx', '4xx', '5xx', got {value!r}")
            return RETRY_STATUSES
    return frozenset(statuses)
