"""The claim as one router call on a ledger distributed by tenant (Citus; docs/adr/0023-claims-and-leases-on-citus.md).

Citus cannot route the claim statement: each of its chained modifying CTEs becomes a subplan run through the
coordinator, however constant the tenant. A PL/pgSQL function distributed by its tenant argument and colocated
with ``effects`` can be: called outside a transaction block, Citus sends the call whole to the node holding that
tenant's shards, and the statement runs there as one local transaction. So on Citus the claim statement is also
installed as a function, generated from ``effect_claim_batch`` itself (its placeholders become the arguments),
never written twice by hand.

Its name carries a hash of its text (``effect_claim_batch_t<12 hex>``): a release whose statement differs
installs a function of another name, so the previous release's gateways keep calling theirs during a roll
(ADR 0017's rule, kept by construction rather than by a ``_vN`` someone bumps). ``effectgate migrate`` installs
it where ``jobs`` is distributed; a gateway that finds it missing claims with the statement (correct, through
the coordinator) and says so once.

A NOTIFY sent inside a delegated call fires on the worker node, where no process listens: the caller wakes the
workers from the coordinator afterwards (``jobs_notify``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from .db import Conn
from .jobs import distributed
from .queries import Q

log = logging.getLogger("effectgate.ledger")

_PLACEHOLDER = re.compile(r"%\((\w+)\)([sb])(?:::([a-z0-9_\[\]]+))?")
# The statement's output, as RETURN QUERY must declare it (types exactly as the statement yields them).
_OUTPUT = (
    "ord int, effect_id bigint, outcome text, delivery_count int, held_fingerprint text, job_id bigint,"
    " version bigint, latest_version bigint, notified bigint"
)
# The one placeholder the statement leaves untyped: the clock, ``coalesce(%(now)s, now())``.
_UNTYPED = {"now": "timestamptz"}


@dataclass(frozen=True, slots=True)
class ClaimFunction:
    """The claim statement as a function: its name, argument types, body and the call that replaces it."""

    name: str
    arguments: tuple[tuple[str, str], ...]  # (placeholder, type) in order; the first is the tenant
    body: str

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(t for _, t in self.arguments)})"

    def create(self, schema: str) -> sql.Composed:
        """CREATE OR REPLACE FUNCTION, pinned to ``schema`` (the nodes run it with no session of ours)."""
        head = f"CREATE OR REPLACE FUNCTION {self.signature} RETURNS TABLE ({_OUTPUT}) LANGUAGE plpgsql"
        return sql.SQL("{} SET search_path = {} AS {}").format(
            sql.SQL(head),
            sql.Identifier(schema),
            sql.Literal(self.body),
        )

    def call(self) -> sql.SQL:
        """The call with the statement's own placeholders: the same parameters reach it."""
        arguments = ", ".join(
            f"%({name})s::{kind}" if name in _UNTYPED else f"%({name})b::{kind}"
            for name, kind in self.arguments
        )
        return sql.SQL(f"SELECT * FROM {self.name}({arguments})")


def claim_function(statement: str | None = None) -> ClaimFunction:
    """The function form of ``statement`` (default: this release's ``effect_claim_batch``)."""
    text = Q["effect_claim_batch"] if statement is None else statement
    arguments: list[tuple[str, str]] = [("tenant_id", "text")]
    index = {"tenant_id": 1}

    def argument(match: re.Match[str]) -> str:
        name, cast = match.group(1), match.group(3)
        if name not in index:
            kind = cast or _UNTYPED.get(name)
            if kind is None:
                raise ValueError(f"placeholder %({name}) of the claim statement has no type to declare")
            arguments.append((name, kind))
            index[name] = len(arguments)
        return f"${index[name]}" + (f"::{cast}" if cast else "")

    query = _PLACEHOLDER.sub(argument, text)
    tenant = index.get("tenant")
    if tenant is None:
        raise ValueError("the claim statement takes no %(tenant) array: it cannot be routed by tenant")
    # Every entry must be the routed tenant's: another's rows live on another node.
    body = (
        "\n#variable_conflict use_column\nBEGIN\n"
        f"IF EXISTS (SELECT 1 FROM unnest(${tenant}) AS t(tenant) WHERE t.tenant IS DISTINCT FROM $1) THEN\n"
        "    RAISE EXCEPTION 'a claim routed to tenant % carries another tenant''s entries', $1\n"
        "        USING ERRCODE = 'invalid_parameter_value';\nEND IF;\n"
        f"RETURN QUERY {query};\nEND\n"
    )
    digest = hashlib.sha256(repr((tuple(arguments), body)).encode()).hexdigest()[:12]
    return ClaimFunction(f"effect_claim_batch_t{digest}", tuple(arguments), body)


async def install_claim_function(conn: Conn, schema: str) -> str:
    """Create this release's claim function in ``schema`` and distribute it by tenant with ``effects``."""
    function = claim_function()
    async with conn.transaction():
        await conn.execute(function.create(schema))
    signature = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.SQL(function.signature))
    await conn.execute(
        Q["claim_function_distribute"],
        {"signature": signature.as_string(conn), "argument": "$1"},
    )
    return function.name


@dataclass(frozen=True, slots=True)
class ClaimRouter:
    """How a gateway claims on a ledger distributed by tenant: one routed function call per tenant."""

    function: ClaimFunction
    call: sql.SQL

    @classmethod
    def of(cls, function: ClaimFunction) -> ClaimRouter:
        return cls(function, function.call())

    async def claim(self, conn: Conn, tenant: str, params: dict[str, Any]) -> list[Any]:
        """One tenant's round through the function (``params`` as the statement takes them)."""
        return await (await conn.execute(self.call, {**params, "tenant_id": tenant})).fetchall()


async def claim_router(conn: Conn) -> ClaimRouter | None:
    """The router for this ledger, or None: not distributed (one statement), or the function is missing."""
    if not await distributed(conn):
        return None
    function = claim_function()
    row = await (
        await conn.execute(Q["claim_function_present"], {"signature": function.signature})
    ).fetchone()
    if row is None or not row["present"]:
        log.warning(
            "claims.router_function_missing",
            extra={
                "function": function.name,
                "hint": "run `effectgate migrate` after distributing: claims go through the coordinator until then",
            },
        )
        return None
    return ClaimRouter.of(function)
