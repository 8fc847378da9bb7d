"""A real uvicorn serving with the guarded protocol, in the test's own event loop, on 127.0.0.1.

The guard's tests drive uvicorn's own server, protocol and request cycle over loopback sockets (no
database, no other process), so a uvicorn release that changes what the guard stands on
(gateway/edge/uvicorn_private.py) fails them; ``make test-lowest`` runs them at uvicorn's floor. The server
is a task of the test's event loop: the guard's counters are read between two of its callbacks, never in
the middle of one, and requests written before the test next awaits reach the server in one pass of the
loop, as a burst does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from effectgate.gateway.config.gateway import Limits
from effectgate.gateway.edge.client_slots import ClientSlots
from effectgate.gateway.edge.guard import GuardedHttpToolsProtocol
from effectgate.gateway.edge.penalty_box import PenaltyBox
from effectgate.gateway.edge.turns import Turns

# Generous against a loaded machine: what these tests tell apart is "happens" from "never happens".
WITHIN = 10.0


class App:
    """An ASGI app that notes each request by name (its query string) as it arrives, reads its body, holds
    it while the test holds its name, then answers 200 with the name as the body."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.arrived: collections.defaultdict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self._gates: dict[str, asyncio.Event] = {}

    def hold(self, name: str) -> asyncio.Event:
        """Hold the request ``name`` in the app (a request in flight) until the returned event is set."""
        gate = self._gates[name] = asyncio.Event()
        return gate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        name = scope["query_string"].decode()
        self.seen.append(name)
        self.arrived[name].set()
        while (await receive()).get("more_body"):
            pass
        if name in self._gates:
            await self._gates[name].wait()
        body = name.encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def request(name: str, path: str = "/", *, close: bool = True, extra: bytes = b"") -> bytes:
    """A POST without a body, named ``name`` (its query string); ``close`` asks the server to close after
    answering, so the answer is everything read until the connection ends."""
    head = f"POST {path}?{name} HTTP/1.1\r\nhost: gateway\r\ncontent-length: 0\r\n"
    return head.encode() + (b"connection: close\r\n" if close else b"") + extra + b"\r\n"


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer else 0


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def send(self, data: bytes) -> None:
        """Write ``data`` without waiting: it is in the kernel's buffer before the server runs again."""
        self.writer.write(data)

    async def answer(self) -> bytes:
        """Everything the server sends until it closes the connection (b"": closed unanswered)."""
        chunks = []
        try:
            while chunk := await asyncio.wait_for(self.reader.read(65536), WITHIN):
                chunks.append(chunk)
        except ConnectionResetError:
            # Closed with bytes of ours unread (a refused request still arriving): the answer came before.
            pass
        return b"".join(chunks)

    async def response(self) -> bytes:
        """One answer, head and body (by its content-length), on a connection that stays open."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), WITHIN)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await asyncio.wait_for(self.reader.readexactly(length), WITHIN)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@dataclass
class Served:
    port: int
    clients: list[Client] = field(default_factory=list)

    async def connect(self, source: str = "127.0.0.1") -> Client:
        """A new connection from ``source`` (any 127.0.0.0/8 address: a client of its own)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
        client = Client(reader, writer)
        self.clients.append(client)
        return client

    async def request(self, name: str, path: str = "/", *, source: str = "127.0.0.1") -> Client:
        """A new connection that has sent ``request(name, path)``."""
        client = await self.connect(source)
        client.send(request(name, path))
        return client


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition`` holds; the server runs meanwhile, each check one pass of the loop apart."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {WITHIN}s: {what}")
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def serving(
    app: Any,
    *,
    limits: Limits | None = None,
    box: PenaltyBox | None = None,
    slots: ClientSlots | None = None,
    protocol: type[GuardedHttpToolsProtocol] = GuardedHttpToolsProtocol,
) -> AsyncIterator[Served]:
    """uvicorn serving ``app`` with ``protocol`` (the guard, or a subclass of it) configured with these
    limits, box and slots, as ``guard.configure`` configures it in a gateway process."""
    # guard.configure sets class attributes, once per process; a class per server keeps tests apart.
    guarded = type(
        "Guarded",
        (protocol,),
        {
            "limits": limits or Limits(),
            "box": box,
            "slots": slots,
            "turns": Turns() if box is not None else None,
        },
    )
    # Listening before uvicorn starts: a connection made meanwhile waits in the backlog to be accepted.
    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=guarded,
        interface="asgi3",
        lifespan="off",
        ws="none",
        proxy_headers=False,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=WITHIN,
    )
    server = uvicorn.Server(config)
    serve = asyncio.create_task(server.serve(sockets=[listener]))
    served = Served(listener.getsockname()[1])
    try:
        yield served
    finally:
        for client in served.clients:
            await client.close()
        server.should_exit = True
        await serve
        listener.close()
