"""How statements route is read once per pool (or connection) and kept: the operator's writes by id, the
claim batcher, the worker and the maintenance services no longer ask the catalog before every statement.

The proof of "kept" is that a pool or connection that has answered once still answers after it is closed:
a second read would need it open. On a cluster, `make citus-check` reads the distributed answer
(tests/citus/test_claims_routed.py, test_ledger_on_citus.py).
"""

from __future__ import annotations

import pytest

from effectgate.ledger import db, topology

from .jobs_fixtures import pool

pytestmark = pytest.mark.anyio
__all__ = ["pool"]  # the fixture, imported for pytest


async def test_a_single_node_ledger_routes_nothing(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        assert await topology.read(conn) == topology.SINGLE_NODE
    assert await topology.of_pool(pool) == topology.SINGLE_NODE


async def test_the_answer_is_kept_once_per_pool(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    try:
        first = await topology.of_pool(pool)
    finally:
        await pool.close()
    assert await topology.of_pool(pool) is first  # a closed pool cannot be asked again


async def test_the_answer_is_kept_once_per_connection(db_url: str) -> None:
    conn = await db.connect(db_url)
    async with conn:
        first = await topology.of(conn)
    assert conn.closed
    assert await topology.of(conn) is first


async def test_a_pool_that_cannot_answer_is_asked_again(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    await pool.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever a closed pool raises, nothing is kept
        await topology.of_pool(pool)
    assert pool not in topology._by_pool
