"""A gateway running on a ledger whose schema is behind its version answers 503 ``migrations_pending``,
machine-readable like every other error answer, never 500 ``ledger_error``; and nothing is claimed."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.ledger import db
from effectgate.ledger.migrate import MIGRATIONS_DIR, discover, migrate
from tests.integration.gateway.ingress.ingress_app import (
    CONFIG,
    ENV,
    make_registry,
    post,
    stripe_event,
    stripe_headers,
)

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


async def deliver(client: httpx.AsyncClient) -> httpx.Response:
    body = stripe_event(order_id="42", event_id="evt_behind")
    return await post(client, "stripe", body, stripe_headers(body))


async def test_an_unmigrated_ledger_answers_503_migrations_pending(empty_db_url: str) -> None:
    async with gateway(empty_db_url) as client:
        answer = await deliver(client)
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert body["error"] == "migrations_pending"
    assert "nothing was claimed" in body["detail"]


async def test_a_ledger_one_migration_in_answers_503_and_claims_nothing(
    empty_db_url: str, tmp_path: Path
) -> None:
    # The first migration only: the tables exist, but not the columns later migrations added, so the claim
    # statement meets a missing column rather than a missing table.
    first = discover()[0]
    shutil.copy(Path(str(MIGRATIONS_DIR.joinpath(first.name))), tmp_path / first.name)
    conn = await db.connect(empty_db_url)
    async with conn:
        assert await migrate(conn, tmp_path) == [first.name]
        async with gateway(empty_db_url) as client:
            answer = await deliver(client)
        assert (answer.status_code, answer.json()["error"]) == (503, "migrations_pending"), answer.text
        effects = await (await conn.execute("SELECT count(*) AS n FROM effects")).fetchone()
        assert effects is not None and effects["n"] == 0


async def test_a_migrated_ledger_missing_a_table_is_still_a_500_ledger_error(db_url: str) -> None:
    # Every migration applied, yet a table is gone (dropped by hand): "run migrate" would not help, so the
    # answer is not migrations_pending.
    conn = await db.connect(db_url)
    async with conn:
        await conn.execute("DROP TABLE deliveries CASCADE")
    async with gateway(db_url) as client:
        answer = await deliver(client)
    assert (answer.status_code, answer.json()["error"]) == (500, "ledger_error"), answer.text
