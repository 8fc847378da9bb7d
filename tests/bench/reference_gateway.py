"""The hand-written reference gateway the ingress benchmark compares effectgate with.

The careful thing a user would write without effectgate: Starlette on uvicorn (uvloop + httptools, run
with 2 workers), a psycopg pool, a Stripe signature check, and one statement per request — a CTE that
claims the key (``ON CONFLICT DO NOTHING``) and inserts the job. It keeps no delivery row, tells a
duplicate from a conflict by nothing, wakes no worker and counts nothing: less work than effectgate does.

    DATABASE_URL=… BENCH_SECRET=… uvicorn tests.bench.reference_gateway:app --workers 2 \\
        --loop uvloop --http httptools

It writes effectgate's own tables (migrated), so the same database and the same counts serve both.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg_pool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

CLAIM = """
WITH claim AS (
    INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                         first_seen_at, last_seen_at)
    VALUES ('default', %s, 'bench', 'bench.any', %s, %s, %s, %s, now(), now())
    ON CONFLICT (tenant, effect_key) DO NOTHING
    RETURNING id
)
INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, run_at, created_at, updated_at)
SELECT id, 'default', 'bench.any', 5, 'park', now(), now(), now() FROM claim
RETURNING id
"""

SECRET = os.environ.get("BENCH_SECRET", "").encode()


def verified(body: bytes, header: str) -> bool:
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    expected = hmac.new(SECRET, parts.get("t", "").encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


async def webhook(request: Request) -> Response:
    body = await request.body()
    if not verified(body, request.headers.get("stripe-signature", "")):
        return JSONResponse({"error": "signature_invalid"}, status_code=401)
    event = json.loads(body)
    pool: psycopg_pool.AsyncConnectionPool = request.app.state.pool  # type: ignore[type-arg]
    async with pool.connection() as conn:
        cur = await conn.execute(
            CLAIM,
            (
                f"bench:{event['id']}",
                event["id"],
                event["type"],
                hashlib.sha256(body).hexdigest(),
                body.decode(),
            ),
        )
        created = await cur.fetchone()
    return JSONResponse({"claimed": created is not None}, status_code=202 if created else 200)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = psycopg_pool.AsyncConnectionPool(
        os.environ["DATABASE_URL"], max_size=20, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    app.state.pool = pool
    yield
    await pool.close()


app = Starlette(routes=[Route("/webhooks/{source}", webhook, methods=["POST"])], lifespan=lifespan)
