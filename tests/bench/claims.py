"""Benchmark: the claim transaction, through effectgate's ledger and through pgbench.

    python -m tests.bench.claims [--seconds 10] [--clients 8,16,32]

Both run the same statement (``effect_claim_batch`` from ledger/sql/claims.sql, one new key per
transaction) on the same Postgres, so the ratio says how much of the database's capacity the
Python side leaves on the table. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.queries import Q

from .common import drop_database, fresh_database, pgbench_binary, server_url

PAYLOAD = {"id": "evt", "type": "payment_intent.succeeded", "data": {"object": {"pad": "x" * 1800}}}


async def effectgate_rate(url: str, clients: int, seconds: float) -> float:
    fp = fingerprint(PAYLOAD)
    done = 0
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        conn = await db.connect(url)
        async with conn:
            while time.monotonic() < deadline:
                key = uuid.uuid4().hex
                delivery = Delivery(key, "default", "bench", key, "payment_intent.succeeded", PAYLOAD, fp, 0)
                await claim_delivery(conn, delivery, [EffectRequest(f"k:{key}", "bench", 5, "park")])
                done += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - started)


def pgbench_script() -> str:
    """``effect_claim_batch`` for one delivery with one effect, pgbench variables for the parameters, one new
    key per statement: the claim transaction as a one-request batch sends it."""
    values = {
        "ord": "ARRAY[0]",
        "tenant": "ARRAY['default']",
        "effect_key": "ARRAY['k:' || :key]",
        "source": "ARRAY['bench']",
        "handler": "ARRAY['bench']",
        "event_id": "ARRAY['e:' || :key]",
        "event_type": "ARRAY['payment_intent.succeeded']",
        "fingerprint": "ARRAY['" + fingerprint(PAYLOAD) + "']",
        "payload_ix": "ARRAY[1]",
        "payloads": "ARRAY['" + json.dumps(PAYLOAD) + "']",
        "now": "NULL::timestamptz",
        "max_attempts": "ARRAY[5]",
        "orphan_policy": "ARRAY['park']",
        "lock_key": "ARRAY[NULL]",
        "request_id": "ARRAY['r:' || :key]",
        "secret_index": "ARRAY[0]",
        "trace_parent": "ARRAY[NULL]",
        "version": "ARRAY[NULL]",
    }
    sql = re.sub(r"%\((\w+)\)[sb]", lambda m: values[m.group(1)], Q["effect_claim_batch"])
    sql = " ".join(line.split("--")[0].strip() for line in sql.splitlines())
    # One statement in autocommit, as ledger.claims sends a batch: its own transaction.
    return "\\set key random(1, 9000000000000)\n" + sql + ";\n"


def pgbench_rate(url: str, clients: int, seconds: float) -> float | None:
    """The claim transaction's rate under pgbench, or ``None`` without pgbench."""
    binary = pgbench_binary()
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "claim.sql"
        script.write_text(pgbench_script())
        result = subprocess.run(
            [
                binary,
                "-n",
                "-M",
                "prepared",
                "-c",
                str(clients),
                "-j",
                "2",
                "-T",
                str(int(seconds)),
                "-f",
                str(script),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    return float(match.group(1)) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="8,16,32")
    args = parser.parse_args()
    server = server_url()
    print(f"claim transaction (INSERT … ON CONFLICT + job + delivery, 2 KB payload), {args.seconds:g} s each")
    print(f"{'clients':>8} {'effectgate tx/s':>16} {'pgbench tx/s':>13} {'ratio':>6}")
    for clients in (int(c) for c in args.clients.split(",")):
        url = fresh_database(server)
        try:
            ours = asyncio.run(effectgate_rate(url, clients, args.seconds))
        finally:
            drop_database(server, url)
        url = fresh_database(server)
        try:
            theirs = pgbench_rate(url, clients, args.seconds)
        finally:
            drop_database(server, url)
        ratio = f"{ours / theirs:.2f}" if theirs else "n/a"
        print(f"{clients:>8} {ours:>16.0f} {theirs or float('nan'):>13.0f} {ratio:>6}")


if __name__ == "__main__":
    main()
