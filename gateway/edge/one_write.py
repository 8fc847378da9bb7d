"""A connection's transport whose writes within one turn of the event loop leave as one.

uvicorn writes an answer's head when the app sends ``http.response.start`` and its body when the app sends
``http.response.body``: two ``send`` system calls and two TCP segments for an answer of a few hundred
bytes, and the client reads twice. The gateway's answers send both messages in the same turn of the loop
(``gateway.ingress.answers``), so holding the head until the turn ends sends the answer in one piece. Anything
written later (a streamed body, a slow app) goes out at the end of the turn it was written in, as before;
``close`` sends what is held first, ``abort`` drops it as it drops the transport's own buffer.

Measured with ``python -m tests.bench.ingress_cost`` (the note of issue 18 has the figures).
"""

from __future__ import annotations

import asyncio
from typing import Any


class OneWriteTransport:
    """``transport`` with the writes of one loop turn joined; every other call goes to it unchanged."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = [bytes(data)]
            self._loop.call_soon(self._send_held)
        else:
            self._held.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _send_held(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = sum(len(chunk) for chunk in self._held) if self._held else 0
        return held + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
