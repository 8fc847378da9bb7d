"""Benchmark: past the claim queue's bound, how fast the gateway says 503 — over HTTP, per answer.

    python -m tests.bench.overload [--seconds 8] [--connections 64] [--queue 8]

A real ``effectgate serve --workers 2`` on a loopback port (the ingress benchmark's config), its claim
queue bounded at ``--queue`` per process (``EFFECTGATE_GATEWAY__CLAIM_QUEUE_MAX``; the default is 1024) so
that ``--connections`` clients sending distinct signed 2 KB deliveries back to back overflow it. Each client
is a keep-alive connection of this process's own (asyncio, raw HTTP/1.1), so every answer is timed on its
own from the request's first byte to the answer's last, and grouped by status — wrk reports one latency for
all statuses. The client shares the 2 cores with the gateway and Postgres, and its own event loop's turns are
in every figure: at 256 connections a Python client's scheduling dominates what it measures (so the default
is the ingress benchmark's 64), and every figure is a ceiling on what the gateway takes.

Prints, per status, how many and their p50/p99/max; checks every 503 says ``overloaded`` with a
``Retry-After``; then reads the ledger: jobs made must equal 202s answered (a refused claim wrote nothing).
Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import wrk as load
from .backlog import ROOT, count, env, wait_until_up
from .common import drop_database, fresh_database, percentile, server_url
from .ingress import free_port, write_config


async def client(
    port: int,
    requests: list[bytes],
    start: int,
    stride: int,
    until: float,
    answers: list[tuple[int, float, bool]],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = start
    try:
        while time.perf_counter() < until and n < len(requests):
            sent = time.perf_counter()
            writer.write(requests[n])
            n += stride
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            retry_after = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
                elif name.lower() == b"retry-after":
                    retry_after = True
            body = await reader.readexactly(length)
            status = int(head.split(b" ", 2)[1])
            answers.append(
                (status, (time.perf_counter() - sent) * 1000, retry_after and b"overloaded" in body)
            )
            if b"connection: close" in head.lower():
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


def requests_from(pool: Path) -> list[bytes]:
    out = []
    for line in pool.read_text().splitlines():
        signature, body = line.split("\t", 1)
        data = body.encode()
        out.append(
            b"POST /webhooks/bench HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + f"stripe-signature: {signature}\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            + data
        )
    return out


async def drive(
    port: int, requests: list[bytes], connections: int, seconds: float
) -> list[tuple[int, float, bool]]:
    answers: list[tuple[int, float, bool]] = []
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(client(port, requests, c, connections, until, answers) for c in range(connections))
    )
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--queue", type=int, default=8, help="claim_queue_max per gateway process")
    args = parser.parse_args()
    server = server_url()
    db_url = fresh_database(server)
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            requests = requests_from(load.write_pool(tmp / "pool.tsv", int(8000 * args.seconds)))
            port = free_port()
            command = [
                sys.executable, "-m", "effectgate.gateway.cli", "serve", "--config", str(write_config(tmp)),
                "--no-migrate", "--port", str(port), "--workers", "2",
            ]  # fmt: skip
            gateway = subprocess.Popen(
                command, cwd=ROOT, env={**env(db_url), "EFFECTGATE_GATEWAY__CLAIM_QUEUE_MAX": str(args.queue)}
            )
            try:
                wait_until_up(f"http://127.0.0.1:{port}")
                asyncio.run(drive(port, requests[-2000:], 32, 1))  # warm: every process, pool and statement
                before = count(db_url, "SELECT count(*) FROM jobs")
                answers = asyncio.run(drive(port, requests[:-2000], args.connections, args.seconds))
            finally:
                gateway.terminate()
                gateway.wait(timeout=30)
        jobs = count(db_url, "SELECT count(*) FROM jobs") - before
    finally:
        drop_database(server, db_url)
    by_status: dict[int, list[float]] = collections.defaultdict(list)
    for status, ms, _ in answers:
        by_status[status].append(ms)
    print(
        f"== past the claim queue's bound: serve --workers 2, claim_queue_max {args.queue} per process, "
        f"{args.connections} connections, {args.seconds:.0f} s; {os.cpu_count()} cores shared with this client"
    )
    for status in sorted(by_status):
        values = by_status[status]
        print(
            f"{status}: {len(values)} answers, p50 {percentile(values, 50):.1f} ms, "
            f"p99 {percentile(values, 99):.1f} ms, max {max(values):.1f} ms"
        )
    refused = [a for a in answers if a[0] == 503]
    labelled = sum(1 for a in refused if a[2])
    print(f"503s saying 'overloaded' with Retry-After: {labelled} of {len(refused)}")
    accepted = len(by_status.get(202, []))
    print(
        f"jobs made during the run {jobs}, 202s answered {accepted}: {'equal' if jobs == accepted else 'NOT EQUAL'}"
    )
    if refused:
        print(f"503 p99 {percentile([a[1] for a in refused], 99):.1f} ms (target: under 10 ms)")
    else:
        print("no 503: the queue never filled (raise --connections or lower --queue)")


if __name__ == "__main__":
    main()
