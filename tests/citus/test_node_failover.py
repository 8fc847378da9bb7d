"""A Citus worker node with a synchronous streaming standby, promoted when the node dies (issue 41, "worker-node
high availability"): nothing its tenants were acknowledged is lost, and their claims and fetches resume once the
coordinator points at the promoted standby (``citus_update_node``), without touching any process of effectgate.

Run by `make citus-check` against ``CITUS_URL`` (deploy/README.md, "Past one Postgres"). It changes the cluster
for the length of the test and puts it back in a ``finally``: a standby of the last worker node is made with
``pg_basebackup -R`` beside its data directory, the node is made to wait for it (``synchronous_standby_names``),
killed (``pg_ctl stop -m immediate``), the standby promoted and put in its place; at the end the standby is
stopped and removed, the node's own settings restored, the node started and put back. Runs as root or as the
nodes' owner, like tests/citus/test_lost_node.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, Duplicate, EffectRequest, claim_delivery
from tests.e2e.processes import free_port
from tests.topologies import CITUS

from .chaos_run import PG_BIN, node_data_dir, pg_ctl
from .ledger import delivery, own_ledger_fixtures

pytestmark = pytest.mark.anyio

KIND = "node-failover"


own_schema, conn = own_ledger_fixtures("ha")


def as_owner(*args: str) -> None:
    owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*owner, *args], check=True, capture_output=True)


def node_url(port: int) -> str:
    return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"


def wait_synchronous(port: int) -> None:
    """Make the node at ``port`` commit only what its standby has: a claim acknowledged is on both."""
    with psycopg.connect(node_url(port), autocommit=True) as c:
        c.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        c.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while c.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone() != (
            1,
        ):
            assert time.monotonic() < deadline, "the standby did not become synchronous"
            time.sleep(0.1)


def remove(standby: Path) -> None:
    shutil.rmtree(standby, ignore_errors=True)
    Path(f"{standby}.log").unlink(missing_ok=True)


async def claim(conn: db.Conn, tenant: str, key: str) -> Accepted | Duplicate:
    [outcome] = await claim_delivery(conn, delivery(tenant, key), [EffectRequest(key, KIND, 5, "redrive")])
    assert isinstance(outcome, Accepted | Duplicate), outcome
    return outcome


async def test_a_worker_nodes_synchronous_standby_takes_over_with_nothing_acknowledged_lost(
    conn: db.Conn, citus_url: str
) -> None:
    [node] = await (
        await conn.execute(
            "SELECT nodeid, nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
            " ORDER BY nodeport DESC LIMIT 1"
        )
    ).fetchall()
    port = int(node["nodeport"])
    tenant = ""
    for n in range(200):
        row = await (
            await conn.execute(
                "SELECT nodeport FROM citus_shards WHERE table_name = 'effects'::regclass"
                " AND shardid = get_shard_id_for_distribution_column('effects', %s::text)",
                (f"ha-{n}",),
            )
        ).fetchone()
        if row is not None and row["nodeport"] == port:
            tenant = f"ha-{n}"
            break
    assert tenant, f"no tenant of the first 200 is on node {port}"
    _, data_dir = node_data_dir(citus_url, f"127.0.0.1:{port}")
    standby_port = free_port()
    standby = data_dir.parent / f"ha-standby-{standby_port}"
    auto_conf = data_dir / "postgresql.auto.conf"
    original_conf = auto_conf.read_text()
    moved = False
    try:
        as_owner(
            str(PG_BIN / "pg_basebackup"),
            "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-D", str(standby), "-R", "-X", "stream",
            "-c", "fast",  # a checkpoint now, not one spread over minutes
        )  # fmt: skip
        with (standby / "postgresql.auto.conf").open("a") as f:
            f.write(f"port = {standby_port}\nsynchronous_standby_names = ''\n")
        pg_ctl(standby, "-l", f"{standby}.log", "-w", "start")
        await asyncio.to_thread(wait_synchronous, port)

        acknowledged = [f"before-{n}" for n in range(5)]
        for key in acknowledged:
            assert isinstance(await claim(conn, tenant, key), Accepted)

        pg_ctl(data_dir, "-m", "immediate", "stop")  # the node dies
        with pytest.raises(psycopg.Error):  # the gateway answers it 503 ledger_unavailable (class XX)
            await claim(conn, tenant, "during")
        # The failover manager (or a person): promote the standby, then point the coordinator at it.
        pg_ctl(standby, "-w", "promote")
        with psycopg.connect(citus_url, autocommit=True) as c:
            c.execute("SELECT citus_update_node(%s, '127.0.0.1', %s)", (node["nodeid"], standby_port))
        moved = True

        # Nothing acknowledged was lost: each is a duplicate now, and the tenant's work goes on.
        for key in acknowledged:
            assert isinstance(await claim(conn, tenant, key), Duplicate), key
        assert isinstance(await claim(conn, tenant, "after"), Accepted)
        leases = await jobs.fetch_and_lease(
            conn, owner="ha-test", kinds={KIND: 30.0}, limit=100, topology=CITUS
        )
        assert sorted(lease.tenant for lease in leases) == [tenant] * (len(acknowledged) + 1)
    finally:
        if moved:
            pg_ctl(standby, "-m", "fast", "stop")
        elif (standby / "postmaster.pid").exists():
            pg_ctl(standby, "-m", "immediate", "stop")
        # The node must not wait for a standby that is gone: its own settings back before it starts.
        auto_conf.write_text(original_conf)  # rewritten in place: the file keeps its owner
        if not (data_dir / "postmaster.pid").exists():
            pg_ctl(data_dir, "-l", f"{data_dir}.log", "-w", "start")
        if moved:
            with psycopg.connect(citus_url, autocommit=True) as c:
                c.execute("SELECT citus_update_node(%s, '127.0.0.1', %s)", (node["nodeid"], port))
        else:
            with psycopg.connect(node_url(port), autocommit=True) as c:
                c.execute("SELECT pg_reload_conf()")
        await asyncio.to_thread(remove, standby)
