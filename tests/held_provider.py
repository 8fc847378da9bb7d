"""A downstream API as an httpx transport for the pace tests: it holds every request until its gate opens and
counts the requests, each idempotency key's, and the most it held at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import httpx


class HeldProvider:
    """Holds each request until ``gate`` is set; answers ``answer(n)`` for the n-th (default: 201 with an id)."""

    def __init__(self, *, answer: Callable[[int], httpx.Response] | None = None) -> None:
        self.requests = 0
        self.keys: Counter[str] = Counter()
        self.held = 0
        self.most_held = 0
        self.gate = asyncio.Event()
        self.answer = answer or (lambda n: httpx.Response(201, json={"id": f"obj_{n}", "n": n}))

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        n = self.requests
        self.keys[request.headers.get("Idempotency-Key", "")] += 1
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        try:
            await self.gate.wait()
        finally:
            self.held -= 1
        return self.answer(n)
