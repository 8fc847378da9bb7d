"""Benchmark: CPU per delivery — what each gateway costs its own processes and Postgres, per request.

    python -m tests.bench.ingress_cost [--seconds 10] [--connections 64] [--py-spy DIR] [--only NAME,…]

Runs effectgate ``serve --workers 2``, the lean reference (tests/bench/lean_gateway.py) and the project's
reference (tests/bench/reference_gateway.py) in turn under the same wrk load (distinct signed deliveries,
tests/bench/wrk.py), and reads from /proc the CPU seconds the gateway's process tree and its Postgres
backends (by ``pg_stat_activity``) spent during the run. CPU per request moves far less with the machine's
load than req/s does, so on a shared machine it says where the time goes: divide two cores by the sum and
you have the ceiling the gateway would reach with a core to itself. Postgres's shared processes (WAL
writer, checkpointer) are not counted. Needs a Postgres on this host (its backends' /proc). With
``--py-spy DIR`` it also records effectgate's two worker processes (``pip install py-spy``) and prints the
functions that take the most of their samples. Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from . import ingress, lean_gateway
from . import wrk as load
from .backlog import ROOT, env, wait_until_up
from .common import drop_database, fresh_database, server_url

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children[parent].append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children[current])
    return found


def backends(db_url: str) -> list[int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [row[0] for row in rows]


def summarise(paths: list[Path], top: int = 18) -> list[str]:
    """The functions with the most samples, inclusive, from py-spy's raw output (the event loop's thread)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        for line in path.read_text().splitlines():
            # uvicorn's supervisor ping thread blocks in recv(): not the gateway's work.
            if not line or "Thread._bootstrap" in line:
                continue
            stack, n = line.rsplit(" ", 1)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            total += int(n)
            own[frames[-1]] += int(n)
            for frame in set(frames):
                inclusive[frame] += int(n)
    lines = [f"py-spy: {total} samples of the event loop's thread"]
    # Frames every sample passes through (process start, the event loop's run) say nothing.
    telling = [(f, n) for f, n in inclusive.most_common() if n < total][:top]
    lines += [f"  {100 * n / total:5.1f}% incl  {f}" for f, n in telling]
    lines += [f"  {100 * n / total:5.1f}% self  {f}" for f, n in own.most_common(top // 2)]
    return lines


def measure(
    wrk: str,
    name: str,
    command: list[str],
    db_url: str,
    tmp: Path,
    seconds: int,
    connections: int,
    spy: Path | None,
) -> str:
    port = int(command[command.index("--port") + 1])
    base = f"http://127.0.0.1:{port}"
    gateway = subprocess.Popen(command, cwd=ROOT, env=env(db_url))
    try:
        wait_until_up(base)  # any answer will do: the references have no /healthz and say 404
        script = load.script(tmp, "pool.lua", load.POOL_LUA)
        warm = load.write_pool(tmp / "warm.tsv", 3000)
        load.finish(
            load.start(wrk, base, script, [str(warm), "/webhooks/bench"], connections=connections, seconds=2)
        )
        pool = load.write_pool(tmp / "pool.tsv", 3000 * seconds)
        procs, pg = tree(gateway.pid), backends(db_url)
        before = {pid: cpu_seconds(pid) for pid in [*procs, *pg]}
        running = load.start(
            wrk, base, script, [str(pool), "/webhooks/bench"], connections=connections, seconds=seconds
        )
        spies = []
        if spy is not None:
            workers = [
                p
                for p in procs
                if p != gateway.pid and "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()
            ]
            record = [
                "py-spy",
                "record",
                "--duration",
                str(max(1, seconds - 2)),
                "--rate",
                "200",
                "--format",
                "raw",
            ]
            spies = [
                subprocess.Popen(
                    [*record, "--pid", str(p), "--output", str(spy / f"{name}-{p}.txt")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
                for p in workers
            ]
        # wrk is the only child reaped in this window (the gateway runs on, py-spy is waited for below).
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = load.finish(running)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk_seconds = after.ru_utime + after.ru_stime - reaped.ru_utime - reaped.ru_stime
        # A backend a pool opened during the run counts from 0; one that closed is lost (pools keep theirs).
        pg = sorted({*pg, *backends(db_url)})
        used = {pid: cpu_seconds(pid) - before.get(pid, 0.0) for pid in [*procs, *pg]}
        for s in spies:
            s.wait()
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    n = max(result.requests, 1)
    gw_ms = sum(used[pid] for pid in procs) * 1000 / n
    pg_ms = sum(used[pid] for pid in pg) * 1000 / n
    wrk_ms = wrk_seconds * 1000 / n
    return (
        f"{name}: {result.line()}\n    CPU per request: gateway {gw_ms:.2f} ms, Postgres backends {pg_ms:.2f} ms, "
        f"sum {gw_ms + pg_ms:.2f} ms -> ceiling on 2 cores {2000 / (gw_ms + pg_ms):.0f} req/s (without wrk); "
        f"wrk {wrk_ms:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--py-spy", type=Path, help="record effectgate's workers with py-spy into this folder"
    )
    parser.add_argument(
        "--only", help="comma-separated gateways to run (effectgate, lean, reference); default all three"
    )
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("ingress cost: no figures — wrk is not installed (apt-get install wrk)")
        return
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    server = server_url()
    print(
        f"== CPU per delivery, {args.connections} connections, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = ingress.write_config(tmp)
        runs = {
            "effectgate": lambda port: ingress.effectgate_command(config, port, 2),
            "lean": lambda port: ingress.reference_command(port, 2, "tests.bench.lean_gateway:app"),
            "reference": lambda port: ingress.reference_command(port, 2),
        }
        chosen = args.only.split(",") if args.only else list(runs)
        for name, command in runs.items():
            if name not in chosen:
                continue
            db_url = fresh_database(server)
            try:
                if name == "lean":
                    lean_gateway.create_schema(db_url)
                spy = args.py_spy if name == "effectgate" else None
                line = measure(
                    wrk, name, command(ingress.free_port()), db_url, tmp, args.seconds, args.connections, spy
                )
                print(line, flush=True)
            finally:
                drop_database(server, db_url)
    if args.py_spy is not None:
        print("\n".join(summarise(sorted(args.py_spy.glob("effectgate-*.txt")))))


if __name__ == "__main__":
    main()
