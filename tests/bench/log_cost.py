"""Benchmark: what the worker's line per succeeded job costs, written and filtered, priced at a job rate.

    python -m tests.bench.log_cost [--lines 50000] [--rounds 3] [--rate 2000]

The call the worker makes for each succeeded job (``worker.finished``, DEBUG by default) through effectgate's
own JSON formatter, to a real file (production's stderr is a pipe or a file: the write is part of the cost),
with the logger at DEBUG (the line written) and at INFO (the level filters it). CPU time of this process per
line (``time.process_time``: on a shared machine it moves less than the wall clock), and what that comes to
per second at ``--rate`` jobs a second. Compare it with the worker's own CPU per job
(``python -m tests.bench.worker_sweep --log-level INFO,per-job``). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

from effectgate.gateway import logs


def cost_per_line(log: logging.Logger, level: int, lines: int) -> float:
    """Seconds of this process's CPU per ``worker.finished`` call with ``log`` at ``level``."""
    log.setLevel(level)
    started = time.process_time()
    for i in range(lines):
        log.debug("worker.finished", extra={"job_id": i, "state": "succeeded"})
    return (time.process_time() - started) / lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="jobs a second to price the line at")
    args = parser.parse_args()
    out = sys.stdout
    fd, path = tempfile.mkstemp(prefix="log_cost_", suffix=".log")
    os.close(fd)
    try:
        with open(path, "a", buffering=1) as stderr:
            sys.stderr = stderr  # logs.configure writes to sys.stderr, as the worker does
            logs.configure("INFO")
            log = logging.getLogger("effectgate.worker")
            for n in range(args.rounds):
                written = cost_per_line(log, logging.DEBUG, args.lines)
                filtered = cost_per_line(log, logging.INFO, args.lines)
                print(
                    f"round {n + 1}, load average {os.getloadavg()[0]:.1f}: a line written {written * 1e6:.1f} µs of CPU, "
                    f"filtered {filtered * 1e6:.2f} µs; at {args.rate:,} jobs/s: {written * args.rate * 1e3:.0f} ms "
                    f"of CPU a second written, {filtered * args.rate * 1e3:.1f} ms filtered",
                    file=out,
                    flush=True,
                )
    finally:
        sys.stderr = sys.__stderr__
        os.unlink(path)


if __name__ == "__main__":
    main()
