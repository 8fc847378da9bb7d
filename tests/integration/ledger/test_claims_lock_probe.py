"""The claim batcher's lock probe (which keys of a batch that met lock_timeout another transaction holds) when the
database has stalled or gone (a failover): an expected outage, logged as one line with the error and no traceback,
and answered as "no key known locked" so the batch is split and answered as usual (issue 42)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claim_queue import WaitingClaim
from effectgate.ledger.claims import Delivery, EffectRequest
from effectgate.ledger.handle import Ledger
from tests.e2e.processes import free_port


@pytest.mark.anyio
async def test_a_probe_that_finds_no_database_logs_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A real pool on a port nothing listens on: its checkout times out as it does while a primary is down.
    pool = db.make_pool(
        f"host=127.0.0.1 port={free_port()} user=postgres dbname=ledger connect_timeout=1", timeout=0.5
    )
    await pool.open(wait=False)
    try:
        batcher = ClaimBatcher(Ledger(pool))
        delivery = Delivery("req", "acme", "shop", "evt_1", "payment_intent.succeeded", {}, "fp")
        request = EffectRequest("order:1", "fulfil", 5, "park")
        waiting = WaitingClaim([(delivery, [request])], frozenset({("acme", "order:1")}), asyncio.Future())
        with caplog.at_level(logging.WARNING, logger="effectgate.ledger"):
            assert await batcher._locked_keys([waiting]) == set()
        [record] = [r for r in caplog.records if r.msg == "claims.lock_probe_failed"]
        assert record.exc_info is None and record.exc_text is None
        assert "PoolTimeout" in record.error  # type: ignore[attr-defined]
    finally:
        await pool.close()
