"""The event loop of effectgate's long-running processes: uvloop where it is installed, for ``serve`` (through
uvicorn) and for ``worker`` (``run``)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def event_loop() -> str:
    """uvloop where it is installed (the production default), else asyncio's own loop.

    uvloop has no wheel for Windows or PyPy; there the gateway still runs, slower, rather than failing.
    (The HTTP parser is always httptools, under the guarded protocol in ``guard.py``.)
    """
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on ``event_loop()``'s loop.

    A worker's loop is mostly scheduling: a task and futures per job, socket readiness per statement. uvloop
    does that in C: a ninth less of the worker's CPU per job, and a drain beside live ingress 10 % faster
    (docs/performance.md, "What a real worker's drain costs").
    """
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop() == "uvloop":
        factory = importlib.import_module("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
