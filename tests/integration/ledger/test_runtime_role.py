"""A runtime role with DML rights only (docs/adr/0019-own-schema.md, "Roles") is enough for everything but
applying migrations: the claim, the worker's run of a job, the reconciler with its partition keeper (whose DDL
runs as the owner through the two SECURITY DEFINER functions of 0019), `migrate --check/--status`, `migrate` on an
up-to-date ledger, and the operator commands."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from effectgate.gateway.cli import migrate as migrate_cli
from effectgate.ledger import db
from effectgate.ledger.maintenance.partitions import PartitionKeeper
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration.in_process_cli import run_cli
from tests.integration.ledger.kit_pipeline import run_pipeline

pytestmark = pytest.mark.anyio

GRANTS = """
GRANT USAGE ON SCHEMA effectgate TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA effectgate TO {role};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA effectgate TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA effectgate TO {role};
"""


@pytest.fixture
def runtime_url(db_url: str) -> Iterator[str]:
    role = f"effectgate_rt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]
        admin.execute(GRANTS.format(role=role))  # type: ignore[arg-type]
    # Without the test suite's search_path option: the role's connections set it themselves.
    url = make_conninfo(db_url, user=role, options="")
    yield url
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")  # type: ignore[arg-type]
        admin.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
        admin.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]


async def test_the_runtime_role_cannot_create_in_the_schema(runtime_url: str) -> None:
    conn = await db.connect(runtime_url)
    async with conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("CREATE TABLE intruder (x int)")


async def test_a_dml_only_role_runs_the_pipeline_maintenance_and_migrate_checks(runtime_url: str) -> None:
    assert await migrate_cli.run(runtime_url, 0, "check") == 0
    assert await migrate_cli.run(runtime_url, 0, "status") == 0
    assert await migrate_cli.run(runtime_url, 0, "apply") == 0  # up to date: nothing to create
    await run_pipeline(runtime_url, "as-runtime")

    conn = await db.connect(runtime_url)
    async with conn:
        result = await Reconciler().run_once(conn)
        assert result.partitions.created, result
        # Far ahead: every partition made now has expired, and the keeper drops them, as the owner.
        later = datetime.now(UTC) + timedelta(days=3650)
        dropped = await PartitionKeeper().run_once(conn, now=later)
        assert set(result.partitions.created) <= set(dropped.dropped), dropped
        owners = await (
            await conn.execute(
                "SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid"
            )
        ).fetchall()
        assert {r["owner"] for r in owners} == {"postgres"}
        # The drop runs as the owner, so it refuses what is not a history partition even when registered.
        await conn.execute(
            "INSERT INTO history_partitions (name, parent, range_to) VALUES ('jobs', 'deliveries', now())"
        )
        with pytest.raises(psycopg.errors.RaiseException, match="not a partition of a history table"):
            await conn.execute("SELECT history_partition_drop_v2('jobs')")


def test_the_operator_commands_run_as_the_runtime_role(
    runtime_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    asyncio.run(run_pipeline(runtime_url, "ops-1"))
    monkeypatch.setenv("DATABASE_URL", runtime_url)
    monkeypatch.delenv("EFFECTGATE_DATABASE_URL", raising=False)
    since = ["--since", "30d"]
    commands = [
        ["migrate", "--status"],
        ["migrate", "--check"],
        ["ledger", "duplicates", *since],
        ["ledger", "rejects", *since],
        ["ledger", "show", "o:ops-1"],
        ["jobs", "list"],
        ["jobs", "show", "1"],
        ["jobs", "pause", "--kind", "fulfil", "--reason", "test"],
        ["jobs", "paused"],
        ["jobs", "resume", "--kind", "fulfil"],
        ["jobs", "redrive", "1", "--force"],
        ["jobs", "cancel", "1", "--reason", "test"],
        ["jobs", "resolve", "1", "--reason", "test", "--by", "ops"],
    ]
    for argv in commands:
        code, out, err = run_cli(capsys, *argv)
        print(" ".join(argv), "->", code)
        assert "permission denied" not in (out + err), (argv, err)
        # 4: the ledger's own refusal (a succeeded job is not redriven), an answer read and written as the role.
        assert code == 0 or (code == 4 and "refused:" in err), (argv, code, out, err)
