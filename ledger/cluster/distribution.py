"""The ledger distributed by tenant on Citus: what is left to do, and doing it, one idempotent step at a time.

Where the Citus extension is installed, the migration runner (``migrate.migrate_and_distribute``) distributes
the ledger after applying the migrations, under the same advisory lock, so ``effectgate migrate`` alone sets a
ledger up on a cluster. Each step is done only if the catalog says it is not (``pg_dist_partition`` for the
tables, ``pg_dist_object`` for the claim function): a second run changes nothing, a ledger distributed by the
hand-run ``distribute.sql`` of earlier releases is accepted and given what it lacks, and what a later migration
adds (a table, a claim function) is distributed by the next run. ``missing`` asks the same question read-only,
for ``migrate --check`` and the processes that wait for their schema.

The plan (docs/adr/0023-claims-and-leases-on-citus.md, deploy/README.md "Past one Postgres"): the tables that
grow with traffic are hash-distributed by ``tenant``; effects founds a colocation group of its own and every
other distributed table joins it, so each ledger on a cluster has its own group and isolating a tenant in one
never splits another's shards. A ledger that shares effects' group with a table of another schema (the old
``distribute.sql`` put every ledger in Citus's default group, and a table distributed later with the default
colocation joins the oldest matching group, a ledger's own too) is moved out of it in one transaction:
``update_distributed_table_colocation`` gives effects a new group and brings the ledger's other tables (each
partition too) into it, and the claim function is distributed again with effects, since its
``pg_dist_object.colocationid`` does not follow. Metadata only: no shard moves, the other ledger keeps the old
group. The small global tables the distributed statements read are reference tables.
schema_migrations (the runner's), history_partitions (the partition keeper's registry, beside the DDL it
records), signature_failures and transmissions (written before any tenant is known) and retention_purges
(written with every retention batch: a write to a reference table needs every node) stay on the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from ..db import Conn
from ..errors import MigrationError
from ..queries import Q
from .topology import citus_installed

# The distributed statements read these (the fetch reads paused_kinds): a copy on every node.
REFERENCE_TABLES = ("paused_kinds", "kind_actions")
# Made reference tables by the distribute.sql of earlier releases, kept on the coordinator since (above): a ledger
# distributed then has them undistributed.
COORDINATOR_TABLES = ("retention_purges",)
# effects first: it founds the ledger's colocation group, which the others join.
DISTRIBUTED_TABLES = (
    "effects",
    "jobs",
    "job_attempts",
    "steps",
    "job_actions",
    "effect_versions",
    "unmatched_deliveries",
    # Partitioned by time: Citus distributes each partition with its parent, and the partition keeper's
    # CREATE TABLE ... PARTITION OF on the coordinator makes the new partition's shards.
    "deliveries",
    "effect_rejects",
)
# 0022's fill triggers serve a previous release's inserts while it drains on one node; Citus refuses to
# distribute a table with triggers, and a cluster is set up by this release, not upgraded from one before 0022.
FILL_TRIGGERS = {"job_attempts": "job_attempts_tenant_fill", "steps": "steps_tenant_fill"}
# The fetch on Citus is per tenant (a multi-shard FOR UPDATE is refused), and a shard holds many tenants: keyed by
# tenant first, one tenant's fetch reads only its own rows, not a hot shard-neighbour's backlog (issue 41;
# deploy/README.md, "Hot tenants"), and the fair discovery steps from tenant to tenant on it. A distribution step,
# not a migration: one Postgres never fetches per tenant, and its claims would write a second index of every
# pending job for nothing. Made before jobs is distributed where it can be (each shard is then made with it).
FETCH_INDEX = "jobs_tenant_kind_due_idx"
# The claim for one tenant (migration 0023), distributed by its tenant argument with effects. Its signature is
# in the two distribution_claim_function_* blocks: a claim_v2 gets blocks of its own (ADR 0017).
CLAIM_FUNCTION = "effect_claim_tenant_v1"


@dataclass(frozen=True, slots=True)
class Step:
    """One thing left to do to distribute the ledger; ``what`` says it for the operator."""

    what: str
    # How the runner does it (ledger/sql/distribution.sql: one block each).
    verb: Literal["trigger", "reference", "index", "effects", "table", "function", "undistribute", "regroup"]
    name: str
    # Whether this role owns the object (or is a member of its owner), as distributing it requires.
    owned: bool
    table: str = ""


async def missing(conn: Conn) -> list[Step]:
    """What is left to distribute the ledger on ``conn``'s search_path, in order; empty where Citus is not
    installed or everything is done. Read-only. Objects a pending migration will create are not listed yet."""
    if not await citus_installed(conn):
        return []
    names = [*REFERENCE_TABLES, *DISTRIBUTED_TABLES, *COORDINATOR_TABLES, FETCH_INDEX]
    params = {"tables": names, "triggers": list(FILL_TRIGGERS.values())}
    tables = {
        r["name"]: r for r in await (await conn.execute(Q["distribution_tables_read"], params)).fetchall()
    }
    steps = [
        Step(
            f"drop 0022's fill trigger {trigger} on {table}",
            "trigger",
            trigger,
            tables[table]["owned"],
            table,
        )
        for table, trigger in FILL_TRIGGERS.items()
        if trigger in tables[table]["triggers"]
    ]
    for name in REFERENCE_TABLES:
        row = tables[name]
        if row["present"]:
            _refuse_other_kind(name, row["kind"], "reference")
            if row["kind"] is None:
                steps.append(Step(f"make {name} a reference table", "reference", name, row["owned"]))
    if tables["jobs"]["present"] and not tables[FETCH_INDEX]["present"]:
        what = f"create the tenant-keyed fetch index {FETCH_INDEX} on jobs"
        steps.append(Step(what, "index", FETCH_INDEX, tables["jobs"]["owned"], "jobs"))
    for name in DISTRIBUTED_TABLES:
        row = tables[name]
        if row["present"]:
            _refuse_other_kind(name, row["kind"], "distributed")
            if row["kind"] is None:
                if name == "effects":
                    what = "distribute effects by tenant in a colocation group of its own"
                    steps.append(Step(what, "effects", name, row["owned"]))
                else:
                    what = f"distribute {name} by tenant, colocated with effects"
                    steps.append(Step(what, "table", name, row["owned"]))
    for name in COORDINATOR_TABLES:
        row = tables[name]
        if row["kind"] == "reference":
            what = f"undistribute {name} (a reference table of earlier releases) onto the coordinator"
            steps.append(Step(what, "undistribute", name, row["owned"]))
    group = await (await conn.execute(Q["distribution_colocation_read"])).fetchone()
    if group is not None and group["shared"]:
        what = (
            "move effects out of the colocation group it shares with another schema's tables into one of its "
            "own, the ledger's other tables and claim function with it (metadata only, no shard moves)"
        )
        steps.append(Step(what, "regroup", "effects", group["owned"]))
    elif group is not None and (group["tables"] or group["function"]):
        joining = ", ".join([*group["tables"], *([CLAIM_FUNCTION] if group["function"] else [])])
        steps.append(Step(f"colocate {joining} with effects", "regroup", "effects", group["owned"]))
    found = await (await conn.execute(Q["distribution_claim_function_read"])).fetchone()
    if found is not None and found["present"] and not found["distributed"]:
        what = f"distribute function {CLAIM_FUNCTION} by tenant, colocated with effects"
        steps.append(Step(what, "function", CLAIM_FUNCTION, found["owned"]))
    return steps


def _refuse_other_kind(name: str, kind: str | None, wanted: str) -> None:
    # A table Citus holds some other way (a reference table where effectgate distributes, say) was set up by
    # hand; undistributing it is the operator's call, never the runner's.
    if kind is not None and kind != wanted:
        raise MigrationError(
            f"table {name} is a Citus {kind} table; effectgate makes it a {wanted} table and will not change "
            "what someone else set up (undistribute_table, then run migrate again)"
        )


def not_owned_message(role: str, foreign: list[Step]) -> str:
    """What ``distribute`` says when ``role`` does not own what the ``foreign`` steps change: those steps, by
    what they do (a first distribution, or only a regroup of a ledger distributed long ago), and the objects."""
    names = ", ".join(dict.fromkeys(s.table or s.name for s in foreign))
    steps = "; ".join(s.what for s in foreign)
    return (
        f"the ledger on Citus needs: {steps}; but role {role} does not own {names}: Citus changes only what the "
        "role owns; run `effectgate migrate` as the role that owns the ledger's tables (the one that applied the "
        "migrations), or as a member of it; nothing was changed"
    )


async def distribute(conn: Conn) -> list[str]:
    """Do what ``missing`` lists, each step in its own transaction; returns what was done (empty when the
    ledger is distributed already or Citus is not installed). Call under the migration lock."""
    todo = await missing(conn)
    if not todo:
        return []
    foreign = [s for s in todo if not s.owned]
    if foreign:
        row = await (await conn.execute(Q["distribution_claim_function_read"])).fetchone()
        role = row["role"] if row is not None else "this role"
        raise MigrationError(not_owned_message(role, foreign))
    done: list[str] = []
    for step in todo:
        try:
            # Its own transaction: a step that fails leaves the ones before it done and itself undone, for the
            # next run to finish.
            async with conn.transaction():
                await conn.execute(Q["distribution_sequential_set_local"])
                await _run(conn, step)
        except psycopg.Error as exc:
            raise MigrationError(
                f"distributing the ledger on Citus: {step.what} failed: {exc}"
                + (f" (done before it: {'; '.join(done)})" if done else "")
            ) from exc
        done.append(step.what)
    return done


async def _run(conn: Conn, step: Step) -> None:
    if step.verb == "trigger":
        statement = sql.SQL(Q["distribution_trigger_drop"]).format(
            trigger=sql.Identifier(step.name), table=sql.Identifier(step.table)
        )
        await conn.execute(statement)
    elif step.verb == "reference":
        await conn.execute(Q["distribution_reference_table_create"], {"table": step.name})
    elif step.verb == "index":
        await conn.execute(Q["distribution_fetch_index_create"])
    elif step.verb == "effects":
        await conn.execute(Q["distribution_effects_create"])
    elif step.verb == "table":
        await conn.execute(Q["distribution_table_create_with_effects"], {"table": step.name})
    elif step.verb == "undistribute":
        await conn.execute(Q["distribution_table_undistribute"], {"table": step.name})
    elif step.verb == "regroup":
        await _regroup(conn)
    else:
        await conn.execute(Q["distribution_claim_function_create_with_effects"])


async def _regroup(conn: Conn) -> None:
    # Read again inside the step's transaction, under the migration lock: what joins is what is there now (a
    # table an earlier step of this run distributed into the shared group too). All of it in this one
    # transaction, so a failure leaves the ledger in the group it was in, never split between two.
    group = await (await conn.execute(Q["distribution_colocation_read"])).fetchone()
    if group is None:
        return
    if group["shared"]:
        await conn.execute(Q["distribution_effects_colocation_break"])
    for table in group["tables"]:
        await conn.execute(Q["distribution_table_colocation_join_effects"], {"table": table})
    if group["function"]:
        # update_distributed_table_colocation leaves pg_dist_object.colocationid alone: the function would stay
        # with the old group, its calls routed by the other ledger's shards. Distributing it again with effects
        # records effects' group.
        await conn.execute(Q["distribution_claim_function_create_with_effects"])
