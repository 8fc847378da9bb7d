"""`effectgate migrate` alone distributes the ledger by tenant where it finds Citus (ledger/cluster/distribution.py).

A fresh schema is migrated and distributed in one run, a second run changes nothing, a ledger distributed by the
hand-run ``deploy/citus/distribute.sql`` of earlier releases is accepted (and given what it lacks, a colocation
group of its own among them), ``--check`` reports an undistributed ledger as pending, a role that does not own the
tables is told so, and each ledger gets a colocation group of its own, so isolating a tenant in one leaves
another's shards alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.gateway.cli.migrate import SchemaBehind, wait_for_schema
from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, claim_deliveries
from effectgate.ledger.cluster import distribution, topology
from effectgate.ledger.errors import MigrationError
from effectgate.ledger.migrate import migrate_and_distribute, script
from effectgate.ledger.queries import Q
from tests.topologies import CITUS

from .ledger import claim_params, delivery, effect

pytestmark = pytest.mark.anyio

# deploy/citus/distribute.sql as operators ran it by hand after `migrate` (before issue 41 kept retention_purges
# on the coordinator).
PREVIOUS_SCRIPT = """
SET citus.multi_shard_modify_mode TO 'sequential';
DROP TRIGGER IF EXISTS job_attempts_tenant_fill ON job_attempts;
DROP TRIGGER IF EXISTS steps_tenant_fill ON steps;
SELECT create_reference_table('paused_kinds');
SELECT create_reference_table('kind_actions');
SELECT create_reference_table('retention_purges');
SELECT create_distributed_table('effects', 'tenant');
SELECT create_distributed_table('jobs', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('job_attempts', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('steps', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('job_actions', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('effect_versions', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('unmatched_deliveries', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('deliveries', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('effect_rejects', 'tenant', colocate_with => 'effects');
"""
PREVIOUS_FUNCTION_LINE = """
SELECT create_distributed_function(
    'effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[], text[], text[], int[],'
    ' int[], text[], text[], int[], int8[], text[], text[], timestamptz)',
    '$1', colocate_with => 'effects');
"""


@pytest.fixture
def new_schema(citus_url: str) -> Iterator[Callable[[], str]]:
    """Names a fresh schema for this test; each is dropped at its end."""
    made: list[str] = []

    def new() -> str:
        made.append(f"effectgate_mig_{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield new
    with psycopg.connect(citus_url, autocommit=True) as c:
        for name in made:
            c.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')  # type: ignore[arg-type]


async def distributed_the_old_way(url: str, schema: str, *, with_function: bool = True) -> None:
    """Migrated without distributing, then distributed by the previous distribute.sql, run by hand: effects in
    Citus's default colocation group for 32-shard text-keyed tables, which every such ledger joins."""
    await migrated_not_distributed(url, schema)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        c.execute(PREVIOUS_SCRIPT + (PREVIOUS_FUNCTION_LINE if with_function else ""))  # type: ignore[arg-type]


async def migrated_not_distributed(url: str, schema: str) -> None:
    """Every migration applied the way a team's own tool applies them (`migrate --print-sql`), which does not
    distribute: the ledger a previous release's operator had before running distribute.sql."""
    conn = await db.connect(url, schema=schema)
    async with conn:
        _, text = await script(conn, schema=schema)
        async with conn.transaction():
            await conn.execute(text)  # type: ignore[arg-type]


def catalog(url: str, schema: str) -> list[dict[str, Any]]:
    """How Citus holds each table of ``schema`` and the claim function: kind, column, group, shard count."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        tables = c.execute(
            "SELECT c.relname::text AS name, p.partmethod::text AS method, p.repmodel::text AS model,"
            " column_to_column_name(p.logicalrelid, p.partkey) AS col, p.colocationid AS colocation,"
            " (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shards"
            " FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid"
            " WHERE c.relnamespace = %s::regnamespace ORDER BY 1",
            (schema,),
        ).fetchall()
        functions = c.execute(
            "SELECT f.proname::text AS name, o.distribution_argument_index AS arg, o.colocationid AS colocation"
            " FROM pg_dist_object o JOIN pg_proc f ON f.oid = o.objid"
            " WHERE o.classid = 'pg_proc'::regclass AND f.pronamespace = %s::regnamespace"
            " AND o.distribution_argument_index IS NOT NULL ORDER BY 1",
            (schema,),
        ).fetchall()
    return [*tables, *functions]


# The fetch index a tenant's fetch walks on Citus (issue 41, hot tenants): made by migrate on a fresh ledger and on
# one the previous script distributed, which did not make it.
INDEX = f"create the tenant-keyed fetch index {distribution.FETCH_INDEX} on jobs"


# The step that moves a ledger distributed the old way out of the colocation group it shares with another's.
REGROUP = "move effects out of the colocation group it shares"


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


def without_group(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "colocation"}


def groups(url: str, schema: str) -> set[int]:
    """The colocation groups of ``schema``'s hash-distributed tables (partitions too) and its claim function."""
    return {r["colocation"] for r in catalog(url, schema) if r.get("method") in ("h", None)}


def worker_urls(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as c:
        nodes = c.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY 2"
        ).fetchall()
    return [f"postgresql://postgres@{host}:{port}/postgres" for host, port in nodes]


def row_counts(url: str, schema: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as c:
        return {
            name: c.execute(f'SELECT count(*) FROM "{schema}".{name}').fetchall()[0][0]  # type: ignore[arg-type]
            for name in distribution.DISTRIBUTED_TABLES
        }


def effectgate(url: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTGATE_DATABASE_URL": url, "EFFECTGATE_SCHEMA": schema}
    command = [sys.executable, "-m", "effectgate.gateway.cli", "migrate", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def isolate_acme(citus_url: str, schema: str) -> None:
    """Tenant ``acme`` of ``schema``'s ledger on a shard of its own, with every table of its ledger."""
    with psycopg.connect(citus_url, autocommit=True) as c:
        # block_writes: cluster.sh's nodes have no logical replication, which the default transfer mode needs.
        c.execute(
            "SELECT isolate_tenant_to_new_shard(%s, 'acme', cascade_option => 'CASCADE',"
            " shard_transfer_mode => 'block_writes')",
            (f'"{schema}".effects',),
        )


async def test_migrate_alone_distributes_a_fresh_ledger_and_again_changes_nothing(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    schema = new_schema()
    conn = await db.connect(citus_url, schema=schema)
    async with conn:
        first = await migrate_and_distribute(conn, schema=schema)
        # 0022's two fill triggers dropped, every table, the tenant-keyed fetch index, and the claim function.
        every = len(distribution.REFERENCE_TABLES) + len(distribution.DISTRIBUTED_TABLES)
        assert first.applied and len(first.distributed) == len(distribution.FILL_TRIGGERS) + every + 1 + 1
        assert INDEX in first.distributed
        assert await topology.read(conn) == CITUS
    before = catalog(citus_url, schema)
    tables = by_name(before)
    for name in distribution.DISTRIBUTED_TABLES:
        assert (tables[name]["method"], tables[name]["col"]) == ("h", "tenant"), name
        assert tables[name]["colocation"] == tables["effects"]["colocation"], name
    for name in distribution.REFERENCE_TABLES:
        assert (tables[name]["method"], tables[name]["model"]) == ("n", "t"), name
    assert tables["effect_claim_tenant_v1"]["arg"] == 0
    assert tables["effect_claim_tenant_v1"]["colocation"] == tables["effects"]["colocation"]
    # Left on the coordinator: the runner's and the keeper's records, and what is written before any tenant.
    coordinator = {"schema_migrations", "history_partitions", "signature_failures", "transmissions"}
    assert not (coordinator | {"downstream_paces"}) & set(tables)

    conn = await db.connect(citus_url, schema=schema)
    async with conn:
        again = await migrate_and_distribute(conn, schema=schema)
    assert (again.applied, again.distributed) == ([], [])
    assert catalog(citus_url, schema) == before
    done = effectgate(citus_url, schema)
    assert (done.returncode, done.stdout.strip()) == (0, "up to date"), done.stderr


@pytest.mark.parametrize("with_function", [True, False], ids=["whole", "before-0023"])
async def test_a_ledger_distributed_by_the_previous_script_is_accepted(
    citus_url: str, new_schema: Callable[[], str], with_function: bool
) -> None:
    schema = new_schema()
    await distributed_the_old_way(citus_url, schema, with_function=with_function)
    before = by_name(catalog(citus_url, schema))
    conn = await db.connect(citus_url, schema=schema)
    async with conn:
        done = await migrate_and_distribute(conn, schema=schema)
        assert done.applied == []
        # That script made no tenant-keyed fetch index and made retention_purges a reference table, kept on the
        # coordinator since; the script of a release before 0023 had no function line. migrate does just those.
        function = "distribute function effect_claim_tenant_v1 by tenant, colocated with effects"
        # Whether the ledger also shares its group depends on what else is on the cluster (Citus's default
        # colocation joins the oldest matching group, one another ledger founded with 'none' too); when it does,
        # migrate moves it out (test_a_ledger_in_a_group_shared_with_another_gets_one_of_its_own).
        assert [s for s in done.distributed if not s.startswith(REGROUP)] == [
            INDEX,
            "undistribute retention_purges (a reference table of earlier releases) onto the coordinator",
            *([] if with_function else [function]),
        ]
        assert (await topology.read(conn)).claims_routed
        assert await distribution.missing(conn) == []
    after = by_name(catalog(citus_url, schema))
    changed = {"effect_claim_tenant_v1", "retention_purges"}
    assert "retention_purges" not in after
    assert {n: without_group(r) for n, r in after.items() if n not in changed} == {
        n: without_group(r) for n, r in before.items() if n not in changed
    }
    assert {r["colocation"] for r in after.values() if r.get("method") != "n"} == {
        after["effects"]["colocation"]
    }


async def test_check_reports_an_undistributed_ledger_as_pending_and_migrate_says_it_distributed(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    schema = new_schema()
    await migrated_not_distributed(citus_url, schema)
    # A --no-migrate process waits for the distribution too: started before it, it would keep a single node's
    # topology for its life.
    with pytest.raises(SchemaBehind, match="its distribution on Citus"):
        await wait_for_schema(citus_url, 0, 0, schema)
    check = effectgate(citus_url, schema, "--check")
    assert check.returncode == 5, check.stderr
    assert check.stdout.startswith("pending distribution on Citus: drop 0022's fill trigger"), check.stdout
    status = effectgate(citus_url, schema, "--status", "--format", "json")
    assert '"up_to_date": false' in status.stdout and "distribute effects by tenant" in status.stdout
    run = effectgate(citus_url, schema)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "up to date"
    assert run.stdout.splitlines()[1].startswith("distributed on Citus: drop 0022's fill trigger")
    assert "distribute effects by tenant in a colocation group of its own" in run.stdout
    check = effectgate(citus_url, schema, "--check")
    assert check.returncode == 0 and check.stdout.startswith("up to date ("), check.stdout


async def test_a_role_that_does_not_own_the_ledger_is_told_what_it_lacks(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    schema = new_schema()
    await migrated_not_distributed(citus_url, schema)
    role = f"effectgate_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(citus_url, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{role}" LOGIN')  # type: ignore[arg-type]
        c.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')  # type: ignore[arg-type]
        c.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')  # type: ignore[arg-type]
    try:
        url = citus_url.replace("postgres@", f"{role}@", 1)
        conn = await db.connect(url, schema=schema)
        async with conn:
            with pytest.raises(MigrationError) as raised:
                await migrate_and_distribute(conn, schema=schema)
        message = str(raised.value)
        assert (
            f"role {role} does not own" in message
            and "effects" in message
            and "nothing was changed" in message
        )
        cli = effectgate(url, schema)
        assert cli.returncode != 0 and "Traceback" not in cli.stderr, cli.stderr
        assert f"role {role} does not own" in cli.stderr
        assert catalog(citus_url, schema) == []
    finally:
        with psycopg.connect(citus_url, autocommit=True) as c:
            c.execute(f'DROP OWNED BY "{role}"')  # type: ignore[arg-type]
            c.execute(f'DROP ROLE "{role}"')  # type: ignore[arg-type]


async def test_each_ledger_has_its_own_colocation_group_and_isolating_a_tenant_splits_only_its_own(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    one, other = new_schema(), new_schema()
    for schema in (one, other):
        conn = await db.connect(citus_url, schema=schema)
        async with conn:
            await migrate_and_distribute(conn, schema=schema)
    groups = {
        s: {r["colocation"] for r in catalog(citus_url, s) if r.get("method") == "h"} for s in (one, other)
    }
    assert len(groups[one]) == len(groups[other]) == 1 and groups[one] != groups[other]
    shards = {s: by_name(catalog(citus_url, s))["effects"]["shards"] for s in (one, other)}
    isolate_acme(citus_url, one)
    after = {s: by_name(catalog(citus_url, s)) for s in (one, other)}
    # The tenant's shard split in three (below it, the tenant, above it), with every table of its ledger.
    assert after[one]["effects"]["shards"] == shards[one] + 2
    assert after[one]["jobs"]["shards"] == shards[one] + 2
    assert after[other]["effects"]["shards"] == shards[other]
    assert after[other]["jobs"]["shards"] == shards[other]


async def test_a_ledger_in_a_group_shared_with_another_gets_one_of_its_own(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    one, other = new_schema(), new_schema()
    for schema in (one, other):
        await distributed_the_old_way(citus_url, schema)
    before = {s: catalog(citus_url, s) for s in (one, other)}
    # Both ledgers, every table (the partitions of deliveries and effect_rejects too) and both claim functions,
    # in one group: the one Citus's default colocation chose.
    [shared] = groups(citus_url, one)
    assert groups(citus_url, other) == {shared}
    tenants = [f"regroup-{n}" for n in range(8)]
    conn = await db.connect(citus_url, schema=one)
    async with conn:
        claimed = await claim_deliveries(
            conn, [(delivery(t, "order-1"), [effect("order-1")]) for t in tenants]
        )
        assert all(isinstance(o, Accepted) for [o] in claimed)
    counts = row_counts(citus_url, one)
    assert counts["effects"] == counts["jobs"] == len(tenants)

    check = effectgate(citus_url, one, "--check")
    assert check.returncode == 5 and REGROUP in check.stdout, check.stdout + check.stderr
    run = effectgate(citus_url, one)
    assert run.returncode == 0 and REGROUP in run.stdout, run.stdout + run.stderr
    check = effectgate(citus_url, one, "--check")
    assert check.returncode == 0 and check.stdout.startswith("up to date ("), check.stdout

    # One new group for the whole ledger; the other ledger keeps the old one, its catalog untouched; nothing moved
    # (metadata only: the same shards, the same rows).
    [own] = groups(citus_url, one)
    assert own != shared
    assert catalog(citus_url, other) == before[other]
    # The worker nodes, which route the delegated claim by their own copy of the metadata, have the same.
    for node in worker_urls(citus_url):
        assert catalog(node, one) == catalog(citus_url, one)
        assert catalog(node, other) == before[other]
    after = by_name(catalog(citus_url, one))
    assert {n: without_group(r) for n, r in after.items() if n != "retention_purges"} == {
        r["name"]: without_group(r) for r in before[one] if r["name"] != "retention_purges"
    }
    assert row_counts(citus_url, one) == counts
    conn = await db.connect(citus_url, schema=one)
    async with conn:
        assert await distribution.missing(conn) == []
        assert (await topology.read(conn)).claims_routed
        # Routed as before: one task on the tenant's node, and the ledger answers from the rows it had.
        params = {**claim_params(tenants[0], "order-2"), "tenant_id": tenants[0]}
        # Outside a transaction block, as the gateway calls it: only there Citus delegates the call.
        cur = await conn.execute("EXPLAIN " + Q["effect_claim_tenant"], params)  # type: ignore[operator]
        plan = "\n".join(next(iter(r.values())) for r in await cur.fetchall())
        assert "Task Count: 1" in plan and "Distributed Subplan" not in plan, plan
        again = await claim_deliveries(
            conn, [(delivery(t, "order-1"), [effect("order-1")]) for t in tenants], topology=CITUS
        )
        assert [type(o).__name__ for [o] in again] == ["Duplicate"] * len(tenants)
        again_done = await migrate_and_distribute(conn, schema=one)
    assert (again_done.applied, again_done.distributed) == ([], [])
    assert groups(citus_url, one) == {own}

    isolate_acme(citus_url, one)
    shards = {s: by_name(catalog(citus_url, s)) for s in (one, other)}
    assert shards[one]["effects"]["shards"] == shards[one]["jobs"]["shards"] == 34
    assert shards[other]["effects"]["shards"] == shards[other]["jobs"]["shards"] == 32


async def test_a_table_or_the_function_out_of_effects_group_is_brought_back(
    citus_url: str, new_schema: Callable[[], str]
) -> None:
    schema = new_schema()
    conn = await db.connect(citus_url, schema=schema)
    async with conn:
        await migrate_and_distribute(conn, schema=schema)
    [own] = groups(citus_url, schema)
    with psycopg.connect(citus_url, autocommit=True) as c:
        # By hand (a regroup is one transaction, so no run of migrate leaves this): jobs in a group of its own.
        c.execute(
            "SELECT update_distributed_table_colocation(%s, colocate_with => 'none')", (f'"{schema}".jobs',)
        )
    assert len(groups(citus_url, schema)) == 2
    conn = await db.connect(citus_url, schema=schema)
    async with conn:
        assert [s.what for s in await distribution.missing(conn)] == ["colocate jobs with effects"]
        done = await migrate_and_distribute(conn, schema=schema)
        assert done.distributed == ["colocate jobs with effects"]
        assert await distribution.missing(conn) == []
    assert groups(citus_url, schema) == {own}
