"""The connection transport that sends an answer's head and body as one write (gateway.one_write)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from effectgate.gateway.edge.guard import GuardedHttpToolsProtocol
from effectgate.gateway.edge.one_write import OneWriteTransport
from tests.unit.gateway.edge.real_uvicorn import serving

pytestmark = pytest.mark.anyio


class Recording:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        if self.closing:
            raise AssertionError("written after close")
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 9) if name == "peername" else default


def wrapped() -> tuple[OneWriteTransport, Recording]:
    inner = Recording()
    return OneWriteTransport(inner, asyncio.get_running_loop()), inner  # type: ignore[arg-type]


async def test_the_writes_of_one_turn_leave_as_one() -> None:
    transport, inner = wrapped()
    transport.write(b"HTTP/1.1 202 Accepted\r\n\r\n")
    transport.write(memoryview(b'{"ok":true}'))
    assert inner.writes == [], "held until the turn ends"
    assert transport.get_write_buffer_size() == 7 + len(b"HTTP/1.1 202 Accepted\r\n\r\n") + 11
    await asyncio.sleep(0)
    assert inner.writes == [b'HTTP/1.1 202 Accepted\r\n\r\n{"ok":true}']
    # A write in a later turn is a write of its own, in order.
    transport.write(b"next")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"next"]


async def test_close_sends_what_is_held_first() -> None:
    transport, inner = wrapped()
    transport.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    transport.close()
    assert inner.writes == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"]
    assert inner.calls == ["close"]
    await asyncio.sleep(0)  # the turn's own send finds nothing left
    assert len(inner.writes) == 1


async def test_abort_drops_what_is_held() -> None:
    transport, inner = wrapped()
    transport.write(b"held")
    transport.abort()
    await asyncio.sleep(0)
    assert inner.writes == [] and inner.calls == ["abort"]


async def test_a_write_to_a_closed_connection_is_dropped_not_raised() -> None:
    transport, inner = wrapped()
    transport.write(b"late")
    inner.closing = True  # the peer went away within the turn
    await asyncio.sleep(0)
    assert inner.writes == []


async def test_other_calls_reach_the_transport() -> None:
    transport, _ = wrapped()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 9)
    assert transport.is_closing() is False


@pytest.mark.parametrize("answers", [1, 3])
async def test_over_a_real_socket_each_answer_arrives_whole_and_in_order(answers: int) -> None:
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair()
    right.setblocking(False)
    inner, _ = await loop.create_connection(asyncio.Protocol, sock=left)
    transport = OneWriteTransport(inner, loop)  # type: ignore[arg-type]
    try:
        for n in range(answers):
            transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n")
            transport.write(str(n).encode())
            expected = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n" + str(n).encode()
            got = b""
            while len(got) < len(expected):
                got += await loop.sock_recv(right, 4096)
            assert got == expected
    finally:
        transport.close()
        right.close()


class Tapped:
    """A connection's real transport, with what is written to it noted on the way."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport, self.writes = transport, writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def test_the_guarded_protocol_sends_an_answer_in_one_write() -> None:
    # uvicorn's own server and cycle answering through the gateway's protocol: head and body reach the
    # socket's transport as one write (without the wrapper, uvicorn writes them in two), on a connection
    # kept alive, so the write is the end of the loop's turn, not the close.
    writes: list[bytes] = []

    class TappedProtocol(GuardedHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(Tapped(transport, writes))  # type: ignore[arg-type]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async with serving(app, protocol=TappedProtocol) as server:
        client = await server.connect()
        client.send(b"POST /webhooks/x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
        answer = await client.response()
    assert len(writes) == 1
    assert writes[0] == answer
    assert answer.startswith(b"HTTP/1.1 202 ") and answer.endswith(b"\r\n\r\n{}")
