"""A ledger on a running Citus cluster, for `make citus-check` (deploy/README.md, "Past one Postgres").

``CITUS_URL`` names the coordinator (`../shared/citus/cluster.sh start` prints it). tests/conftest.py collects
this folder only when it is set: CI has no cluster (Citus is built from source), so these tests are a command
of their own, like the chaos run, never part of `make check`.

The session migrates a fresh schema on the coordinator with the migration runner, which distributes it by tenant
as `effectgate migrate` does for operators; the schema is dropped at the end.
(A schema, not a database: Citus 12.1 does not propagate CREATE DATABASE to the workers by default.)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from effectgate.ledger import db

from .ledger import own_ledger


@pytest.fixture(scope="session")
def citus_url() -> str:
    url = os.environ.get("CITUS_URL")
    if not url:
        pytest.fail("CITUS_URL names no Citus coordinator: start one (deploy/README.md, Past one Postgres)")
    return url


@pytest.fixture(scope="session")
def citus_schema(citus_url: str) -> Iterator[str]:
    """A freshly migrated and distributed ledger schema on the cluster."""
    with own_ledger(citus_url, "citus") as schema:
        yield schema


@pytest.fixture
async def conn(citus_url: str, citus_schema: str) -> AsyncIterator[db.Conn]:
    c = await db.connect(citus_url, schema=citus_schema)
    async with c:
        yield c
