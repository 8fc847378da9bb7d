"""The failures the fake providers inject (``FaultConfig``): a 500 or a 429 before the effect, a hang before
or after it, and a connection dropped after it, each drawn per request from a seeded generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

FaultMode = Literal["none", "error_500", "rate_limit", "hang", "hang_after_effect", "drop_after_effect"]


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Which failure to inject, how often, and where, validated at construction.

    `mode` is `none`, `error_500` (answer 500 before the effect, nothing stored), `rate_limit` (answer 429
    with `Retry-After: 7` before the effect, as Stripe's rate limiter does), `hang` (wait
    `hang_seconds` before the effect, given up when the client disconnects), `hang_after_effect` (perform and
    store the effect, then hold the answer the same way: the window a crash test kills a worker in) or
    `drop_after_effect` (perform
    and store the effect, then cut the connection mid-response). Each provider request is hit with
    probability `rate`, drawn from a generator seeded with `seed`; `paths`, when non-empty, limits faults to
    requests whose path starts with one of the prefixes. The `/_fake/` endpoints are never faulted.
    """

    mode: FaultMode = "none"
    rate: float = 1.0
    paths: tuple[str, ...] = ()
    seed: int | None = None
    hang_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.mode not in get_args(FaultMode):
            raise ValueError(f"mode must be one of {get_args(FaultMode)}, got {self.mode!r}")
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float) or not 0 <= self.rate <= 1:
            raise ValueError(f"rate must be a number in [0, 1], got {self.rate!r}")
        if isinstance(self.paths, str) or not all(isinstance(p, str) and p for p in self.paths):
            raise ValueError("paths must be a list of non-empty path prefixes")
        object.__setattr__(self, "paths", tuple(self.paths))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        hang = self.hang_seconds
        if (
            isinstance(hang, bool)
            or not isinstance(hang, int | float)
            or not (math.isfinite(hang) and hang >= 0)
        ):
            raise ValueError(f"hang_seconds must be a finite number >= 0, got {hang!r}")

    @classmethod
    def from_json(cls, data: object) -> FaultConfig:
        """Build a config from the JSON body of `POST /_fake/faults`; unknown fields raise `ValueError`."""
        if not isinstance(data, dict):
            raise ValueError("the fault config must be a JSON object")
        unknown = set(data) - {"mode", "rate", "paths", "seed", "hang_seconds"}
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        paths = data.get("paths") or ()
        if not isinstance(paths, list | tuple):
            raise ValueError("paths must be a list of path prefixes")
        return cls(
            mode=data.get("mode", "none"),
            rate=data.get("rate", 1.0),
            paths=tuple(paths),
            seed=data.get("seed"),
            hang_seconds=data.get("hang_seconds", 3600.0),
        )


class DroppedResponse(Response):
    """Announce the whole body, send half of it, and return without finishing the response.

    Under uvicorn an ASGI app that returns mid-response gets its connection closed, so the client sees a
    truncated message: httpx raises `RemoteProtocolError`, a `TransportError`, exactly as when a real
    provider or a proxy dies after the effect. (In-process, `httpx.ASGITransport` asserts instead: this
    fault needs a real server.)
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = str(len(self.body) * 2 + 64).encode()
        headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        headers.append((b"content-length", declared))
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send(
            {"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True}
        )


async def sleep_unless_gone(request: Request, seconds: float) -> bool:
    """Sleep `seconds`, or until the client disconnects; True if it did."""
    gone = False
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            nonlocal gone
            # The body is read already, so the next message the server has for us is the disconnect.
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        await anyio.sleep(seconds)
        tasks.cancel_scope.cancel()
    return gone
