"""Which tenants have work, read shard by shard, so that a lost worker node stops only its own tenants (Citus).

On a ledger distributed by tenant (``topology``), the fetch and the maintenance passes first read which tenants
have due rows, then run one routed statement per tenant. That first read is the only statement of theirs that
reaches every shard, and Citus fails a multi-shard SELECT whole when one node cannot be reached: with one worker
node down, no tenant was leased or rescued, on any node. ``tenants_on_live_nodes`` runs the read on each node
for that node's shards instead (``shard_tenants_on_live_nodes``), and a node that does not answer is *skipped*:
its shards are named in the answer, the caller logs them once per pass (``log_skipped``, which also tells the
``SKIPS`` listeners: the processes' ``effectgate_shard_reads_skipped_total``), and its tenants appear again in the
next pass's read once the node is back. Each shard's read has its own ``ORDER BY … LIMIT``.

A read of one shard is a named block ending in ``_on_shard``, written for ``format()``: ``%1$s`` is the shard,
``%2$s`` the co-located shard of a joined table, and ``%3$L`` every parameter as one jsonb literal (``now`` is
the coordinator's clock when not given), each read back with ``->>`` and a cast. Only SQL quotes the values.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..db import Conn
from ..errors import LedgerError
from ..listeners import Listeners
from ..queries import Q

log = logging.getLogger("effectgate.ledger")

# How long one discovery waits for a worker node's connection (citus.node_connection_timeout, 30 s by default):
# a node that drops packets instead of refusing would otherwise hold every fetch and pass for 30 s per read.
# Nodes of one cluster answer in milliseconds; two seconds is long past a slow handshake.
DEFAULT_NODE_CONNECTION_TIMEOUT = 2.0

# What Citus, master_run_on_worker (citus_tools.c) and the remote node say when a worker node is not there, or
# went away during the read; any other error is a fault of the statement itself, which is raised, never passed
# off as a lost node. "marked as essential": a session whose cached connection to the node broke (XX000, not a
# connection SQLSTATE). "query result unavailable": the node stopped mid-read (seen in the chaos run).
UNREACHABLE = re.compile(
    r"failed to connect to|failed to send query to|connection lost|query result unavailable"
    r"|connection to the remote node|server closed the connection|connection not open|could not connect"
    r"|terminating connection|failure on connection marked as essential",
    re.IGNORECASE,
)


class ShardReadFailed(LedgerError):
    """A shard read failed on a node that answered: a fault of the read, not a lost node."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """A worker node that did not answer, and the shards of the read's table it holds."""

    node: str
    shards: tuple[int, ...]
    error: str


@dataclass(frozen=True, slots=True)
class Discovered:
    """Tenants with due rows, earliest first, and the nodes whose shards could not be read."""

    tenants: list[str]
    skipped: list[Skipped]


async def tenants_on_live_nodes(
    conn: Conn,
    command: str,
    *,
    table: str,
    params: Mapping[str, Any],
    limit: int,
    now: datetime | None = None,
    joined: str | None = None,
    node_connection_timeout: float = DEFAULT_NODE_CONNECTION_TIMEOUT,
) -> Discovered:
    """The tenants whose rows ``command`` (the name of an ``_on_shard`` block) finds on the shards of ``table``
    that can be read now, earliest first, at most ``limit``; ``joined`` names a table co-located with it that the
    read joins (``%2$s``). Each shard's read returns up to ``limit`` rows (a tenant with the time and id that
    order it: its earliest row, or, in a fair read, its oldest due job), so the first ``limit`` tenants over
    all live shards by each one's earliest row are among those returned, in that order."""
    rows = await (
        await conn.execute(
            Q["shard_tenants_on_live_nodes"],
            {
                "command": Q[command],
                "table": table,
                "joined": joined or table,
                "params": Jsonb({**params, "limit": limit}, dumps=_dumps),
                "now": now,
                "timeout_ms": round(node_connection_timeout * 1000),
            },
        )
    ).fetchall()
    tenants = [r["tenant"] for r in rows if r["tenant"] is not None][:limit]
    skipped: list[Skipped] = []
    for r in rows:
        if r["node"] is None:
            continue
        if not UNREACHABLE.search(r["error"] or ""):
            raise ShardReadFailed(f"{command} on {r['node']}: {r['error']}")
        skipped.append(Skipped(r["node"], tuple(r["shards"]), r["error"]))
    return Discovered(tenants, skipped)


def node_lost(conn: Conn, exc: psycopg.Error) -> bool:
    """Whether Citus failed a statement because a worker node could not be reached. The coordinator sent the
    error, so this session is fine; a lost connection to the coordinator itself is not this."""
    if conn.broken:
        return False
    return bool(exc.sqlstate and exc.sqlstate.startswith("08")) or bool(UNREACHABLE.search(str(exc)))


#: Told of each node a pass skipped: ``(pass, node, how many of its shards)``.
SKIPS: Listeners[[str, str, int]] = Listeners("shards.skip")


def log_skipped(pass_name: str, skipped: Iterable[Skipped]) -> None:
    """One warning for a pass that could not read some nodes' shards: which nodes, which shards (no traceback:
    a lost node is an expected outage, and its tenants are read again by the next pass); and each node told to
    ``SKIPS``."""
    by_node: dict[str, set[int]] = {}
    for s in skipped:
        by_node.setdefault(s.node, set()).update(s.shards)
    if by_node:
        log.warning(
            "shards.skipped",
            extra={
                "pass": pass_name,
                "nodes": sorted(by_node),
                "shards": {node: sorted(ids) for node, ids in sorted(by_node.items())},
            },
        )
    for node, ids in sorted(by_node.items()):
        SKIPS.tell(pass_name, node, len(ids))


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_iso)


def _iso(value: Any) -> str:
    # Datetimes as ISO 8601, which the read casts back with ::timestamptz; nothing else is guessed at.
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"a shard read's parameter cannot be {type(value).__name__}")
