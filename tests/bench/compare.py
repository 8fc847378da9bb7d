"""Benchmark: every figure of the performance targets, measured side by side in one run, with the ratios.

    python -m tests.bench.compare [--short] [--only PART[,PART...]] [--wake-samples N]

``--only`` runs some parts alone (pgbench, ingress, drain, growth, wakeup), e.g. ``--only wakeup`` or
``--only growth``; their ratios print, the others say n/a.

On one Postgres (``BENCH_DATABASE_URL`` / ``TEST_DATABASE_URL``, else a throwaway embedded one), one load
generator (wrk) and one machine, in this order:

1. pgbench running the claim transaction (``effect_claim_batch`` for one delivery);
2. the two hand-written reference gateways, 2 uvicorn workers each — the project's (tests/bench/
   reference_gateway.py, effectgate's own tables) and the lean one (tests/bench/lean_gateway.py, raw ASGI,
   its own two-table schema) — and effectgate ``serve --workers 1`` and ``--workers 2``, each driven by wrk
   with distinct deliveries, each signed on its own before the run (wrk's Lua has no HMAC; see
   tests/bench/wrk.py), so every request is a new signature and a new key;
3. PgQueuer's drain of no-op jobs (the ``bench`` extra) and effectgate's worker drain, fencing on;
4. the cost of growth: batched claim throughput with 10^6 effects already in the ledger against an empty one
   (three windows on each, taken in turn, medians compared; the empty ledger holds what its earlier windows
   claimed, a few thousand effects);
5. claim commit -> handler start latency (LISTEN/NOTIFY wake-up), from the claim's answer (its commit as the
   claimer sees it) to the handler's start; the claim's own round trip is printed beside it.

Ratios are only meaningful within one run: figures move with whatever else the machine is doing. Each
figure is printed as it is measured, the ratios and targets at the end. Asserts nothing about speed;
``--short`` (what CI runs) is a smoke run that keeps the benchmark working, its figures are not the targets'.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import Delivery, EffectRequest
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger

from . import ingress, lean_gateway, pgqueuer_drain, worker
from .claims import PAYLOAD, pgbench_rate
from .common import drop_database, fresh_database, percentile, server_url
from .reports import fill


async def batched_claim_rate(url: str, clients: int, seconds: float) -> float:
    """Claims per second through one ClaimBatcher with ``clients`` concurrent requests, each a new key."""
    pool = db.make_pool(url, max_size=8)
    await pool.open(wait=True)
    batcher = ClaimBatcher(Ledger(pool))
    fp = fingerprint(PAYLOAD)
    done = 0
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            key = uuid.uuid4().hex
            delivery = Delivery(key, "default", "bench", key, "payment_intent.succeeded", PAYLOAD, fp, 0)
            await batcher.claim([(delivery, [EffectRequest(f"k:{key}", "bench", 5, "park")])])
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - started
    await batcher.close()
    await pool.close()
    return done / elapsed


PARTS = ("pgbench", "ingress", "drain", "growth", "wakeup")
# Claim windows on each ledger, empty and full, taken in turn.
GROWTH_ROUNDS = 3


def show(figure: float | None) -> str:
    return "n/a" if figure is None else f"{figure:.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="a smoke run (CI): small and quick")
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts to run, of {', '.join(PARTS)}"
    )
    parser.add_argument("--wake-samples", type=int, help="wake-ups to time (default 20 short, 200 full)")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    if not parts <= set(PARTS):
        parser.error(
            f"--only: unknown part(s) {', '.join(sorted(parts - set(PARTS)))}; parts: {', '.join(PARTS)}"
        )
    short = args.short
    seconds = 2 if short else 10
    connections = 16 if short else 64
    drain_jobs = 500 if short else 5000
    growth_effects = 20_000 if short else 1_000_000
    server = server_url()
    figures: dict[str, float | None] = {}

    def fresh() -> str:
        return fresh_database(server)

    print(f"== one run, {'short' if short else 'full'}; Postgres {server.split('@')[-1]}", flush=True)

    if "pgbench" in parts:
        url = fresh()
        try:
            figures["pgbench"] = pgbench_rate(url, 4 if short else 32, seconds)
        finally:
            drop_database(server, url)
        print(
            f"pgbench, claim transaction, {4 if short else 32} clients: {figures['pgbench'] or 'n/a'} tx/s",
            flush=True,
        )

    wrk = shutil.which("wrk")
    p99: dict[str, float] = {}
    if "ingress" in parts and wrk is None:
        print("ingress: no figures — wrk is not installed (apt-get install wrk)")
    elif "ingress" in parts and wrk is not None:
        with tempfile.TemporaryDirectory() as tmp:
            deliveries = Path(tmp) / "deliveries.tsv"
            # More distinct deliveries than any run here sends: every request claims a new key.
            ingress.write_deliveries(deliveries, 6000 * seconds)
            warmup = Path(tmp) / "warmup.tsv"
            ingress.write_deliveries(warmup, 4000)
            config = ingress.write_config(Path(tmp))
            runs = {
                "reference": lambda port: ingress.reference_command(port, 2),
                "lean": lambda port: ingress.reference_command(port, 2, "tests.bench.lean_gateway:app"),
                "effectgate_w1": lambda port: ingress.effectgate_command(config, port, 1),
                "effectgate_w2": lambda port: ingress.effectgate_command(config, port, 2),
            }
            for name, command in runs.items():
                url = fresh()
                try:
                    if name == "lean":
                        lean_gateway.create_schema(url)
                    port = ingress.free_port()
                    result = ingress.load(
                        wrk,
                        command(port),
                        port,
                        url,
                        deliveries,
                        connections=connections,
                        seconds=seconds,
                        warmup=warmup,
                        counts=lean_gateway.counts if name == "lean" else None,
                    )
                finally:
                    drop_database(server, url)
                ok = result.non_2xx == 0 and result.socket_errors == 0
                figures[name] = result.rate if ok else None
                p99[name] = result.p99_ms
                print(result.line(f"ingress {name}, {connections} connections"), flush=True)

    if "drain" in parts:
        url = fresh()
        try:
            figures["pgqueuer"] = asyncio.run(pgqueuer_drain.drain(url, drain_jobs))
        finally:
            drop_database(server, url)
        print(
            f"pgqueuer drain, batch 10: {figures['pgqueuer'] or 'n/a (pip install -e .[bench])'} jobs/s",
            flush=True,
        )
        url = fresh()
        try:
            figures["worker"] = asyncio.run(worker.drain(url, drain_jobs, 16))
        finally:
            drop_database(server, url)
        print(
            f"effectgate worker drain, fencing on, concurrency 16: {figures['worker']:.0f} jobs/s", flush=True
        )

    if "growth" in parts:
        empty, full = fresh(), fresh()
        try:
            asyncio.run(fill(full, growth_effects))
            # The fill's dirty pages written out now, not while the claims are timed.
            with psycopg.connect(full, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
            # Windows taken in turn, the medians compared: one window each, one after the other, measured
            # the machine's load as much as the ledger's size (0.74-0.99x in three short runs at load 11).
            rates: dict[str, list[float]] = {"claims_empty": [], "claims_full": []}
            for _ in range(GROWTH_ROUNDS):
                for name, url in (("claims_empty", empty), ("claims_full", full)):
                    rates[name].append(asyncio.run(batched_claim_rate(url, 64, seconds)))
        finally:
            drop_database(server, empty)
            drop_database(server, full)
        for name, values in rates.items():
            figures[name] = statistics.median(values)
        print(
            f"batched claims, 64 concurrent, {GROWTH_ROUNDS} windows of {seconds} s each in turn: empty ledger "
            f"{figures['claims_empty']:.0f} claims/s (median of {', '.join(f'{v:.0f}' for v in rates['claims_empty'])}), "
            f"{growth_effects} effects in the ledger {figures['claims_full']:.0f} claims/s "
            f"(median of {', '.join(f'{v:.0f}' for v in rates['claims_full'])})",
            flush=True,
        )

    wake_p50 = float("nan")
    if "wakeup" in parts:
        url = fresh()
        try:
            wakeups = asyncio.run(worker.latency(url, args.wake_samples or (20 if short else 200)))
        finally:
            drop_database(server, url)
        wake_p50 = percentile(wakeups.from_commit, 50) * 1000
        print(worker.wakeups_line(wakeups), flush=True)

    print("== ratios in this run (targets in brackets)")
    print(
        f"effectgate serve --workers 2 / reference gateway: {ratio(figures.get('effectgate_w2'), figures.get('reference'))} (>= 1.5x)"
    )
    print(
        f"effectgate serve --workers 2 / lean reference gateway: {ratio(figures.get('effectgate_w2'), figures.get('lean'))} (>= 1.5x)"
    )
    print(
        f"effectgate serve --workers 1 / reference gateway: {ratio(figures.get('effectgate_w1'), figures.get('reference'))}"
    )
    print(
        f"effectgate serve --workers 2 p99: {p99.get('effectgate_w2', float('nan')):.1f} ms (<= 50 ms at 64 connections)"
    )
    print(
        f"effectgate serve --workers 2 / pgbench claim transaction: {ratio(figures.get('effectgate_w2'), figures.get('pgbench'))}"
    )
    print(
        f"effectgate worker / PgQueuer drain: {ratio(figures.get('worker'), figures.get('pgqueuer'))} (>= 1.0x)"
    )
    print(
        f"claims with {growth_effects} effects / empty ledger: {ratio(figures.get('claims_full'), figures.get('claims_empty'))} (>= 0.9x)"
    )
    print(f"wake-up p50: {wake_p50:.1f} ms (<= 10 ms)")


if __name__ == "__main__":
    main()
