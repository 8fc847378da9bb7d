"""Shared fixtures: a real Postgres for every database test, never a mock, never a skip.

``TEST_DATABASE_URL`` names a server when set; otherwise the suite starts the embedded Postgres
itself. A template database is migrated once per session and cloned per test
(``CREATE DATABASE … TEMPLATE``), so every test owns a fresh ledger.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from effectgate.gateway import embedded
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger import db
from effectgate.ledger.migrate import migrate

# The handler authors' kit (effectgate_ledger), loaded the way its users load it.
pytest_plugins = ["effectgate.testing.pytest_plugin"]
# A user's project with tests of its own (run by tests/e2e/test_wheel.py in a fresh venv), not ours.
collect_ignore = ["data"]
# The ledger on a Citus cluster (`make citus-check`): collected only when CITUS_URL names a coordinator. CI has no
# cluster (Citus is built from source), so the default run leaves them out; tests/citus/conftest.py says more.
if not os.environ.get("CITUS_URL"):
    collect_ignore.append("citus")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    # A server of this session's own: concurrent test sessions never stop each other's server.
    data_dir = Path(tempfile.mkdtemp(prefix="effectgate-test-pg-")) / "data"
    return embedded.start(data_dir, cleanup="delete")


@pytest.fixture(scope="session")
def effectgate_server_url(pg_server_url: str) -> str:
    """The kit's server is the suite's own: one embedded Postgres per session, not two."""
    return pg_server_url


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url, autocommit=True)


def database_url(server_url: str, name: str) -> str:
    return make_conninfo(server_url, dbname=name)


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = f"effectgate_tpl_{uuid.uuid4().hex[:10]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    async def _migrate() -> None:
        conn = await db.connect(database_url(pg_server_url, name))
        async with conn:
            await migrate(conn)

    import asyncio

    asyncio.run(_migrate())
    yield name
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own. Its URL puts effectgate's schema on the search_path
    of a test's own plain psycopg connections too (effectgate's connections set it themselves; the tests of
    that, tests/integration/ledger/test_own_schema.py, use ``empty_db_url``, which has no such option)."""
    name = f"effectgate_t_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield make_conninfo(database_url(pg_server_url, name), options=f"-c search_path={db.DEFAULT_SCHEMA}")
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def module_db_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database shared by one test module: its single-connection tests each roll back
    (tests/integration/conftest.py, ``rolled_back``), or one gateway process serves every test in it (the
    end-to-end modules). Its URL names effectgate's schema as ``db_url``'s does."""
    name = f"effectgate_m_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield make_conninfo(database_url(pg_server_url, name), options=f"-c search_path={db.DEFAULT_SCHEMA}")
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[db.Pool]:
    """An open pool on the test's own database (the integration tests' and the end-to-end tests' that run a
    worker in the test's process)."""
    p = db.make_pool(db_url, min_size=1, max_size=12, name="effectgate-test")
    await p.open(wait=True)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def empty_db_url(pg_server_url: str) -> Iterator[str]:
    """A database with nothing in it, not even the migrations."""
    name = f"effectgate_e_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield database_url(pg_server_url, name)
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def _registry_keeps_what_it_had() -> Iterator[None]:
    """A test that clears the process-wide handler registry gives back what it held. Without this, a later
    test that imports the examples (already imported, so not registered again) found them gone, in
    whichever order the suite happened to run. What a test registers stays, as it always did: its module
    stays imported, so a later test could not register it again."""
    kinds, sweeps = dict(REGISTRY._kinds), dict(REGISTRY._sweeps)
    yield
    for name, kind in kinds.items():
        REGISTRY._kinds.setdefault(name, kind)
    for name, sweep in sweeps.items():
        REGISTRY._sweeps.setdefault(name, sweep)
