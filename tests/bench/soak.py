"""Soak: steady deliveries with retention windows of minutes; table sizes must stay bounded, claim latency must
not grow while partitions are dropped, and a late duplicate after its payload was purged is still a duplicate.

    python -m tests.bench.soak --minutes 15                 # real time (make soak)
    python -m tests.bench.soak --minutes 0.8 --speed 30     # 24 simulated minutes in under a minute (make soak-short)

The ledger runs on a simulated clock, ``--speed`` simulated seconds per real second, passed as ``now=`` to every
claim, lease and maintenance pass: windows of minutes roll many times in a short run, while claim latency is
measured in real time. Windows (simulated): payloads 2 min, history 4 min, dedupe (tombstones) 8 min, partitions
of 1 min made 2 ahead. Prints one line per report interval; exits 1 if the late duplicate was claimed again or a
table kept growing (a correctness check, not a timing one). Latency is printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, Delivery, Duplicate, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.maintenance.partitions import PartitionConfig
from effectgate.ledger.maintenance.retention import RetentionConfig
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig

from .common import drop_database, fresh_database, percentile, server_url

MINUTE = 60.0
KIND = "soak.fulfil"
SIZES = """
SELECT (SELECT count(*) FROM effects) AS effects,
       (SELECT count(*) FROM effects WHERE purged_at IS NOT NULL) AS tombstones,
       (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM job_attempts) AS attempts,
       (SELECT count(*) FROM deliveries) AS deliveries,
       (SELECT count(*) FROM history_partitions WHERE parent = 'deliveries') AS partitions,
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('deliveries')) AS deliveries_bytes,
       pg_total_relation_size('effects') AS effects_bytes
"""


@dataclass
class Soak:
    speed: float
    start_real: float = field(default_factory=time.monotonic)
    start_sim: datetime = field(default_factory=lambda: datetime.now(UTC).replace(second=0, microsecond=0))
    latencies: list[float] = field(default_factory=list)
    claimed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> datetime:
        return self.start_sim + timedelta(seconds=(time.monotonic() - self.start_real) * self.speed)


def delivery(key: str, payload: dict[str, object]) -> Delivery:
    return Delivery(
        uuid.uuid4().hex, "default", "soak", f"evt-{key}", "order.paid", payload, fingerprint(payload)
    )


async def claim(conn: db.Conn, soak: Soak, key: str, payload: dict[str, object]) -> object:
    started = time.perf_counter()
    [outcome] = await claim_delivery(
        conn, delivery(key, payload), [EffectRequest(key, KIND, 3, "redrive")], now=soak.now()
    )
    soak.latencies.append(time.perf_counter() - started)
    soak.claimed += 1
    return outcome


async def produce(url: str, soak: Soak, rate: float) -> None:
    conn = await db.connect(url)
    async with conn:
        n = 0
        next_at = time.monotonic()
        while not soak.stop.is_set():
            n += 1
            payload = {"order": n, "amount": 1000 + n % 97, "lines": [{"sku": f"sku-{i}"} for i in range(8)]}
            await claim(conn, soak, f"order-{n}", payload)
            if n % 10 == 0:  # a provider retry of a recent delivery: a duplicate
                recent = n - 5
                await claim(
                    conn,
                    soak,
                    f"order-{recent}",
                    {
                        "order": recent,
                        "amount": 1000 + recent % 97,
                        "lines": [{"sku": f"sku-{i}"} for i in range(8)],
                    },
                )
            # Steady, never a burst: a producer that fell behind (a loaded machine) does not catch up.
            next_at = max(next_at + 1 / rate, time.monotonic())
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def work(url: str, soak: Soak) -> None:
    conn = await db.connect(url)
    async with conn:
        while not soak.stop.is_set():
            leases = await jobs.fetch_and_lease(
                conn, owner="soak", kinds={KIND: 30}, limit=200, now=soak.now()
            )
            for lease in leases:
                await jobs.finish(
                    conn, lease.job_id, lease.lease_token, state="succeeded", by="soak", now=soak.now()
                )
            if not leases:
                await asyncio.sleep(0.05)


async def maintain(url: str, soak: Soak, config: ReconcilerConfig) -> None:
    conn = await db.connect(url)
    async with conn:
        while not soak.stop.is_set():
            result = await Reconciler(config).run_once(conn, now=soak.now())
            if result.service_errors:
                print(f"maintenance error: {result.service_errors}", file=sys.stderr)
            await asyncio.sleep(0.5)


async def late_duplicate(url: str, soak: Soak, payload_window: float, dedupe_window: float) -> str:
    """Claim a probe, let it finish and its payload be purged, then deliver it again inside the dedupe window."""
    conn = await db.connect(url)
    async with conn:
        payload = {"probe": True, "order": "late"}
        first = await claim(conn, soak, "probe-late", payload)
        assert isinstance(first, Accepted)
        deadline = soak.now() + timedelta(seconds=dedupe_window * 0.9)
        while soak.now() < deadline and not soak.stop.is_set():
            row = await (
                await conn.execute(
                    "SELECT payload IS NULL AS purged FROM effects WHERE effect_key = 'probe-late'"
                )
            ).fetchone()
            if row is not None and row["purged"]:
                again = await claim(conn, soak, "probe-late", payload)
                n = await (
                    await conn.execute(
                        "SELECT count(*) AS n FROM jobs j JOIN effects e ON e.id = j.effect_id "
                        "WHERE e.effect_key = 'probe-late'"
                    )
                ).fetchone()
                jobs_for_key = n["n"] if n else -1
                ok = isinstance(again, Duplicate) and jobs_for_key <= 1
                return (
                    f"late duplicate {'OK' if ok else 'FAILED'}: delivered again at +"
                    f"{(soak.now() - soak.start_sim).total_seconds() / 60:.1f} sim min after its payload was "
                    f"purged -> {type(again).__name__}, jobs for the key: {jobs_for_key}"
                )
            await asyncio.sleep(0.2)
        return "late duplicate NOT CHECKED: the payload was not purged within the dedupe window (run longer)"


async def report(url: str, soak: Soak, every: float, rows: list[dict[str, object]]) -> None:
    conn = await db.connect(url)
    async with conn:
        print(
            f"{'real_s':>6} {'sim_min':>7} {'claimed':>8} {'p50_ms':>7} {'p99_ms':>7} {'effects':>8} {'tombst':>7} "
            f"{'jobs':>7} {'deliv':>7} {'parts':>5} {'deliv_kB':>9} {'eff_kB':>8}"
        )
        while not soak.stop.is_set():
            await asyncio.sleep(every)
            window, soak.latencies = soak.latencies, []
            sizes = await (await conn.execute(SIZES)).fetchone()
            assert sizes is not None
            row = {
                "real": time.monotonic() - soak.start_real,
                "sim_min": (soak.now() - soak.start_sim).total_seconds() / 60,
                "p50": percentile(window, 50) * 1000,
                "p99": percentile(window, 99) * 1000,
                "claimed": soak.claimed,
                **sizes,
            }
            rows.append(row)
            print(
                f"{row['real']:6.0f} {row['sim_min']:7.1f} {soak.claimed:8d} {row['p50']:7.2f} {row['p99']:7.2f} "
                f"{sizes['effects']:8d} {sizes['tombstones']:7d} {sizes['jobs']:7d} {sizes['deliveries']:7d} "
                f"{sizes['partitions']:5d} {int(sizes['deliveries_bytes']) // 1024:9d} {int(sizes['effects_bytes']) // 1024:8d}",
                flush=True,
            )


# How long (simulated seconds) a claim can stay in each table: its window(s), one partition, a minute of slack.
HORIZONS = {"deliveries": 6 * MINUTE, "jobs": 6 * MINUTE, "effects": 11 * MINUTE}


def bounded(rows: list[dict[str, object]], column: str) -> bool:
    """Whether ``column`` stayed within what its windows allow: at every report after the first horizon, at
    most the claims made during the last horizon (plus slack). A table that kept rows past their windows
    would outgrow it; one that is bounded tracks the load, even when the load itself varies."""
    horizon = HORIZONS[column] / MINUTE
    for row in rows:
        if float(row["sim_min"]) < horizon:  # type: ignore[arg-type]
            continue
        floor = float(row["sim_min"]) - horizon  # type: ignore[arg-type]
        before = [r for r in rows if float(r["sim_min"]) <= floor]  # type: ignore[arg-type]
        claimed_before = int(before[-1]["claimed"]) if before else 0  # type: ignore[call-overload]
        allowed = (int(row["claimed"]) - claimed_before) * 1.2 + 200  # type: ignore[call-overload]
        if int(row[column]) > allowed:  # type: ignore[call-overload]
            print(f"{column}: {row[column]} rows at {float(row['sim_min']):.1f} sim min, over {allowed:.0f}")  # type: ignore[arg-type]
            return False
    return True


async def main(args: argparse.Namespace, server: str, url: str) -> int:
    retention = RetentionConfig(
        payloads=2 * MINUTE,
        history=4 * MINUTE,
        tombstones=8 * MINUTE,
        signature_failures=4 * MINUTE,
        batch=1000,
    )
    config = ReconcilerConfig(retention=retention, partitions=PartitionConfig(interval=MINUTE, premake=2))
    soak = Soak(speed=args.speed)
    rows: list[dict[str, object]] = []
    print(
        f"soak: {args.minutes:g} real min at {args.rate:g} deliveries/s (+10 % duplicates), clock x{args.speed:g}; "
        "windows (sim): payloads 2 min, history 4 min, dedupe 8 min, partitions 1 min"
    )
    conn = await db.connect(url)
    async with conn:
        # Start the simulated clock past the legacy partition (the fresh database's "before the upgrade" range,
        # to the end of today), so every delivery lands in a time partition the keeper made.
        row = await (await conn.execute("SELECT max(range_to) AS end FROM history_partitions")).fetchone()
        assert row is not None
        soak.start_sim = row["end"] + timedelta(minutes=1)
        soak.start_real = time.monotonic()
        await Reconciler(config).run_once(conn, now=soak.now())  # partitions before the first delivery
    if True:
        tasks = [
            asyncio.create_task(produce(url, soak, args.rate)),
            asyncio.create_task(work(url, soak)),
            asyncio.create_task(maintain(url, soak, config)),
            asyncio.create_task(report(url, soak, args.report_every, rows)),
        ]
        probe = asyncio.create_task(late_duplicate(url, soak, retention.payloads, 8 * MINUTE))
        await asyncio.sleep(args.minutes * 60)
        soak.stop.set()
        verdict = await probe
        await asyncio.gather(*tasks)
    sizes_ok = all([bounded(rows, c) for c in HORIZONS])
    third = max(1, len(rows) // 3)
    early = [float(r["p99"]) for r in rows[:third]]  # type: ignore[arg-type]
    late = [float(r["p99"]) for r in rows[-third:]]  # type: ignore[arg-type]
    print(verdict)
    print(
        f"sizes bounded: {'yes' if sizes_ok else 'NO'} (rows of effects, jobs, deliveries within their windows)"
    )
    if early and late:
        print(f"claim p99 (ms), first third vs last third of the run: {max(early):.2f} vs {max(late):.2f}")
    return 0 if sizes_ok and "OK" in verdict else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=15.0, help="real minutes to run (default 15)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second (default 1)")
    p.add_argument("--rate", type=float, default=100.0, help="new deliveries per real second (default 100)")
    p.add_argument("--report-every", type=float, default=None, help="real seconds between lines")
    args = p.parse_args(argv)
    if args.report_every is None:
        args.report_every = max(2.0, args.minutes * 60 / 30)
    return args


def run(argv: list[str] | None = None) -> int:
    args = parse(argv)
    server = server_url()
    url = fresh_database(server)
    try:
        return asyncio.run(main(args, server, url))
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    sys.exit(run())
