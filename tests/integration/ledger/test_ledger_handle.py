"""What the database is, asked once per process and carried on its ledger handle (ledger/handle.py): the claim
batcher, the worker and the maintenance passes no longer ask the catalog before every statement, and nothing is
cached in a module.

The proof of "kept" is that a handle that has answered once still answers after its pool is closed: a second
read would need it open. On a cluster, `make citus-check` reads the distributed answer
(tests/citus/test_claims_routed.py, test_ledger_on_citus.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from effectgate.ledger import db
from effectgate.ledger.cluster import topology
from effectgate.ledger.handle import Ledger
from tests.topologies import ROUTED_ON_ONE_NODE

pytestmark = pytest.mark.anyio


class CountedPool:
    """A real pool whose checkouts are counted: how many times the handle went to the database."""

    def __init__(self, pool: db.Pool) -> None:
        self.pool = pool
        self.checkouts = 0

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[db.Conn]:
        self.checkouts += 1
        async with self.pool.connection() as conn:
            yield conn


async def test_a_single_node_ledger_routes_nothing(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        assert await topology.read(conn) == topology.SINGLE_NODE
    assert await Ledger(pool).topology() == topology.SINGLE_NODE


async def test_the_answer_is_kept_for_the_handles_life(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    ledger = Ledger(pool)
    try:
        first = await ledger.topology()
    finally:
        await pool.close()
    assert await ledger.topology() is first  # a closed pool cannot be asked again
    assert ledger.known_topology is first


async def test_many_first_questions_at_once_make_one_read(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=4, timeout=5)
    await pool.open(wait=True)
    counted = CountedPool(pool)
    try:
        ledger = Ledger(counted)  # type: ignore[arg-type]  # a pool as far as the handle uses one
        answers = await asyncio.gather(*(ledger.topology() for _ in range(20)))
    finally:
        await pool.close()
    assert counted.checkouts == 1
    assert set(answers) == {topology.SINGLE_NODE}


async def test_a_question_on_the_callers_connection_takes_no_other(db_url: str) -> None:
    # A caller holding the pool's only connection would wait for ever for a second one.
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=1)
    await pool.open(wait=True)
    ledger = Ledger(pool)
    try:
        async with pool.connection() as conn:
            assert await ledger.topology(conn) == topology.SINGLE_NODE
    finally:
        await pool.close()


async def test_a_handle_that_could_not_read_asks_again(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=5)
    ledger = Ledger(pool)
    with pytest.raises(Exception):  # noqa: B017 - whatever a pool not yet open raises, nothing is kept
        await ledger.topology()
    assert ledger.known_topology == topology.SINGLE_NODE  # not known: the writes' fallback
    await pool.open(wait=True)
    try:
        assert await ledger.topology() == topology.SINGLE_NODE
    finally:
        await pool.close()


async def test_a_handle_given_a_topology_never_asks(db_url: str) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=1, timeout=5)  # never opened
    ledger = Ledger(pool, topology=ROUTED_ON_ONE_NODE)
    assert await ledger.topology() is ROUTED_ON_ONE_NODE
    assert ledger.known_topology is ROUTED_ON_ONE_NODE
