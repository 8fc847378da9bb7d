"""The lean reference gateway: the least a careful engineer would write to take Stripe webhooks into Postgres.

A raw ASGI app (no framework, no routing table) on uvicorn (uvloop + httptools, 2 workers), a psycopg pool
over TCP like effectgate's, a Stripe signature check, and one statement per request into its own minimal
two-table schema (``lean.ledger``: the unique key; ``lean.jobs``: a 2 KB jsonb payload) — none of
effectgate's wide, indexed tables. It keeps no delivery row, wakes no worker and counts nothing. The ingress
benchmark (tests/bench/compare.py) reports effectgate against it and against tests/bench/reference_gateway.py.

    DATABASE_URL=… BENCH_SECRET=… uvicorn tests.bench.lean_gateway:app --workers 2 \\
        --loop uvloop --http httptools

``create_schema(url)`` makes the schema first (the benchmark calls it; two workers racing on
``CREATE TABLE IF NOT EXISTS`` can fail on the catalogue's unique index).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import psycopg
import psycopg_pool

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS lean;
CREATE TABLE IF NOT EXISTS lean.ledger (key text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS lean.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

CLAIM = """
WITH claim AS (
    INSERT INTO lean.ledger (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key
)
INSERT INTO lean.jobs (key, payload) SELECT key, %s::jsonb FROM claim RETURNING id
"""

SECRET = os.environ.get("BENCH_SECRET", "").encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None


def create_schema(url: str) -> None:
    """The lean schema in the database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)  # type: ignore[arg-type]


def counts(url: str) -> dict[str, int]:
    """What the lean gateway wrote: keys claimed and jobs made."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM lean.ledger), (SELECT count(*) FROM lean.jobs)"
        ).fetchone()
    return {"ledger": row[0], "jobs": row[1]} if row else {}


def verified(body: bytes, header: str) -> bool:
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    expected = hmac.new(SECRET, parts.get("t", "").encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    global _pool
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _pool = psycopg_pool.AsyncConnectionPool(
                os.environ["DATABASE_URL"], max_size=20, kwargs={"autocommit": True}, open=False
            )
            await _pool.open(wait=True)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _pool is not None:
                await _pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /webhooks/<anything>: verify, claim the event id, queue its payload; 202 new, 200 seen."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/webhooks/"):
        await _answer(send, 404, b'{"error":"not_found"}')
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    header = next((v.decode() for k, v in scope["headers"] if k == b"stripe-signature"), "")
    if not verified(body, header):
        await _answer(send, 401, b'{"error":"signature_invalid"}')
        return
    event = json.loads(body)
    assert _pool is not None
    async with _pool.connection() as conn:
        cur = await conn.execute(CLAIM, (f"bench:{event['id']}", body.decode()))
        created = await cur.fetchone()
    await _answer(send, 202 if created else 200, b'{"claimed":true}' if created else b'{"claimed":false}')
