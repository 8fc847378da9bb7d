"""What a bad signature costs: per failed check, and next to genuine deliveries in one process.

``python -m tests.bench.reject_cost`` prints figures and asserts nothing (the tests count instead):

1. one failed Stripe check of a JSON body and of random bytes of the same size (~250 KB and ~60 KB), as it
   is now and with the re-encoding diagnosis run inline, as every failure used to (the old cap was 256 KiB,
   so for 250 KB "before" is the old inline cost, and now nothing past 64 KiB is diagnosed at all);
2. genuine deliveries through the app in this process (httpx's ASGI transport, a real ledger), quiet and
   beside a flood of ~250 KB JSON bad signatures, of random bytes, the same at ~60 KB (diagnosed, sampled),
   and of tiny 401s: their p50/p99 and the ratio to quiet. In-process, client and gateway share one event loop, so the ratios are what matters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import httpx

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.signatures import SignatureInvalid, build_scheme
from effectgate.gateway.signatures import stripe as stripe_scheme
from effectgate.handlers.registry import Registry

from .common import drop_database, fresh_database, server_url

SECRET = "whsec_bench_reject_cost"
CONFIG = """
[gateway]
max_body_bytes = 300000
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""


def big_json(event_id: str = "evt_flood", lines_count: int = 15_600) -> bytes:
    """About 16 bytes a line: 15,600 lines are ~250 KB, 3,700 ~60 KB (under the diagnosis's 64 KiB)."""
    lines = [{"n": i % 10, "k": "v"} for i in range(lines_count)]
    return json.dumps({"id": event_id, "type": "x", "lines": lines}, separators=(",", ":")).encode()


def per_check(repeat: int) -> None:
    scheme = build_scheme("stripe", [SECRET])
    now = time.time()
    headers = {"Stripe-Signature": stripe_scheme.signature_header(b"other", SECRET, timestamp=int(now))}
    small = big_json(lines_count=3_700)
    bodies = [
        ("json", big_json()),
        ("random", os.urandom(len(big_json()))),
        ("json", small),
        ("random", os.urandom(len(small))),
    ]

    def run(body: bytes, inline: bool) -> float:
        started = time.perf_counter()
        for _ in range(repeat):
            try:
                scheme.verify(body, headers, now=now)
            except SignatureInvalid as exc:
                if inline and exc.diagnose is not None:
                    exc.diagnose()
        return (time.perf_counter() - started) / repeat * 1000

    for name, body in bodies:
        print(
            f"failed check, {name} {len(body)} B: {run(body, False):.2f} ms now, "
            f"{run(body, True):.2f} ms with the diagnosis inline (before)"
        )


async def one_round(
    client: httpx.AsyncClient,
    round_no: int,
    flood: tuple[bytes, dict[str, str]] | None,
    genuine: int,
    attackers: int,
) -> tuple[list[float], int, float]:
    """Genuine deliveries, 8 at a time, beside ``attackers`` loops posting ``flood``: latencies in ms,
    requests rejected, seconds taken."""
    latencies: list[float] = []
    stop = asyncio.Event()
    rejected = 0

    async def attack(body: bytes, headers: dict[str, str]) -> None:
        nonlocal rejected
        while not stop.is_set():
            await client.post("/webhooks/stripe", content=body, headers=headers)
            rejected += 1
            # A 401 answered in-process never waits for I/O: without this, one attacker would hold the
            # loop forever (a real server's sockets interleave them).
            await asyncio.sleep(0)

    async def deliver(i: int) -> None:
        doc = {"id": f"evt_{round_no}_{i}", "type": "payment_intent.succeeded", "data": {}}
        body = json.dumps(doc).encode()
        headers = {
            "stripe-signature": stripe_scheme.signature_header(body, SECRET, timestamp=int(time.time()))
        }
        started = time.perf_counter()
        r = await client.post("/webhooks/stripe", content=body, headers=headers)
        latencies.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 202, r.text

    tasks = [asyncio.create_task(attack(*flood)) for _ in range(attackers)] if flood else []
    started = time.perf_counter()
    for batch in range(0, genuine, 8):
        await asyncio.gather(*(deliver(i) for i in range(batch, min(batch + 8, genuine))))
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*tasks)
    return latencies, rejected, elapsed


async def beside_floods(database_url: str, genuine: int, attackers: int) -> None:
    registry = Registry()

    async def noop(ctx: Any, ev: Any) -> None:
        return None

    registry.effect(source="stripe", events=["payment_intent.succeeded"], name="bench.noop")(noop)
    app = create_app(parse(CONFIG, env={"STRIPE_SECRET": SECRET}), registry, database_url)
    forged_json = big_json()
    forged_random = os.urandom(len(forged_json))
    forged_small = big_json(lines_count=3_700)
    forged_small_random = os.urandom(len(forged_small))
    forged_headers = {
        "stripe-signature": stripe_scheme.signature_header(b"x", SECRET, timestamp=int(time.time()))
    }
    floods: dict[str, tuple[bytes, dict[str, str]] | None] = {
        "quiet": None,
        "json 250 KB bad signatures": (forged_json, forged_headers),
        "random 250 KB bad signatures": (forged_random, forged_headers),
        "json 60 KB bad signatures (diagnosed, sampled)": (forged_small, forged_headers),
        "random 60 KB bad signatures": (forged_small_random, forged_headers),
        "tiny 401s": (b"{}", {}),
    }
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=120) as client:
            quiet_p99: float | None = None
            for round_no, (name, flood) in enumerate(floods.items()):
                latencies, rejected, elapsed = await one_round(client, round_no, flood, genuine, attackers)
                p50 = statistics.median(latencies)
                p99 = statistics.quantiles(latencies, n=100)[98]
                quiet_p99 = quiet_p99 or p99
                print(
                    f"genuine beside {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({p99 / quiet_p99:.2f}x quiet), "
                    f"{genuine / elapsed:.0f} genuine/s, {rejected / elapsed:.0f} rejected/s"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--genuine", type=int, default=200)
    parser.add_argument("--attackers", type=int, default=8)
    args = parser.parse_args()
    per_check(args.repeat)
    server = server_url()
    url = fresh_database(server)
    try:
        asyncio.run(beside_floods(url, args.genuine, args.attackers))
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
