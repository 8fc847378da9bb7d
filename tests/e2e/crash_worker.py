"""A worker process for the crash tests, run as ``python -m tests.e2e.crash_worker URL PROGRESS MODE``.

Its one kind counts items 0..9. Each item is *work that is not idempotent* — a line appended to the
progress file — followed by a checkpoint. In ``crash`` mode the slice stops after checkpointing item 5,
writes a marker file and waits there, mid-slice, to be SIGKILLed; in ``resume`` mode the worker runs
every due job to the end and exits. Counting the lines afterwards shows what was done twice.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from effectgate.handlers import EffectContext, Event, Registry
from effectgate.handlers.registry import EffectKind
from effectgate.handlers.worker.runtime import Worker, WorkerConfig
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger

KIND = "crash.count"
ITEMS = 10
CRASH_AFTER = 5
LEASE_TTL = 1.0
MARKER = "checkpointed"


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


def build_registry(progress: Path, *, crash: bool) -> Registry:
    """The registry of this process: one kind, redriven when orphaned."""

    async def count(ctx: EffectContext, ev: Event) -> None:
        start = (ctx.checkpoint or {"done": 0})["done"]
        for item in range(start, ITEMS):
            await asyncio.to_thread(_append, progress, str(item))
            await ctx.save_checkpoint({"done": item + 1})
            if crash and item + 1 == CRASH_AFTER:
                await asyncio.to_thread((progress.parent / MARKER).write_text, str(os.getpid()))
                await asyncio.Event().wait()  # the SIGKILL lands here, mid-slice, lease held

    registry = Registry()
    registry.register(
        EffectKind(
            name=KIND, source="test", events=("*",), fn=count, orphan_policy="redrive", lease_ttl=LEASE_TTL
        )
    )
    return registry


async def main(url: str, progress: str, mode: str) -> None:
    pool = db.make_pool(url, max_size=4, name="crash-worker")
    await pool.open(wait=True)
    try:
        config = WorkerConfig(backoff_base=0, run_reconciler=False, poll_interval=0.1)
        worker = Worker(
            Ledger(pool), build_registry(Path(progress), crash=mode == "crash"), url=url, config=config
        )
        if mode == "crash":
            await worker.run()
        else:
            await worker.run_until_idle()
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
