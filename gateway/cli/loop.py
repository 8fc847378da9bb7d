"""The event loop of effectgate's long-running processes."""

from __future__ import annotations

import importlib.util


def event_loop() -> str:
    """uvloop where it is installed (the production default), else asyncio's own loop.

    uvloop has no wheel for Windows or PyPy; there the gateway still runs, slower, rather than failing.
    (The HTTP parser is always httptools, under the guarded protocol in ``guard.py``.)
    """
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
