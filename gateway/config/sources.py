"""``[sources.NAME]``: a webhook source's scheme and secrets, its tenant (static, or read from the payload
within an allow-list) and its conflict answer. A role that holds no webhook secrets gets ``SecretsNotLoaded``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from effectgate.handlers.plan import MAX_TENANT_LENGTH, TenantRule
from effectgate.ledger.pointers import JsonPointer

from ..signatures import SCHEMES, Covers, Scheme, SchemeConfigError, build_scheme, covers_of
from .providers import (
    CONFLICT_STATUSES,
    REFUSAL_ANSWERS,
    ConflictStatus,
    RefusalAnswer,
    default_conflict_status,
    default_refusal_answer,
)
from .reader import ConfigError as ConfigError
from .reader import TableReader
from .secrets import missing


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
    # What a verified delivery that cannot become effects is answered once it is kept (gateway.ingress.refusals).
    on_refusal: RefusalAnswer = "acknowledge"

    @property
    def tenant_rule(self) -> TenantRule:
        """How this source's events get their tenant (``handlers.plan``, shared with the replay)."""
        return TenantRule(self.tenant, self.tenant_from, self.tenants, self.tenant_pattern)


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
    on_refusal = table.get("on_refusal", str, default_refusal_answer(scheme_name or ""))
    if on_refusal not in REFUSAL_ANSWERS:
        table.problem("on_refusal", f'must be "acknowledge" or "reject", got {on_refusal!r}')
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
            cast(RefusalAnswer, on_refusal),
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
        cast(RefusalAnswer, on_refusal),
    )


def read_sources(root: TableReader, env: Mapping[str, str] | None) -> dict[str, Source]:
    """Every ``[sources.NAME]``; at least one is required."""
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
        root.problems.append(f"{root.path}: sources: at least one [sources.NAME] table is required")
    return sources


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
