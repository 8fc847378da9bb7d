"""The gateway's connection guard: slow or lying clients are cut off, and their sockets freed.

uvicorn's httptools protocol waits for ever for a request's headers and body: a client that sends a
header byte a second (slowloris), or a ``Content-Length`` it never honours, holds a socket and a parser
until it goes away by itself. It also has no limit on the size of the request head. This protocol is
uvicorn's, with three limits added per connection:

- ``header_timeout``: the whole request head (request line and headers) must arrive within this many
  seconds of the connection opening, or of the first byte of the next request on a kept-alive one. A
  connection that sends nothing at all is held no longer either. Past it: ``408`` and the socket closed.
- ``body_timeout``: the whole body must arrive within this many seconds of the head. Past it: ``408``
  (or a bare close if an answer has started) and the socket closed; the app's read ends as a client
  disconnect.
- ``max_header_bytes``: a request head larger than this is answered ``431`` and the socket closed. A
  chunked body's trailer (the header lines after its last chunk) is held to the same limit: the
  parser buffers a trailer line whole before it reports it, so a trailer that drips for ever would
  otherwise grow the process until the body timeout.

It also enforces the penalty box (``edge.penalty_box``). In its ``one_at_a_time`` mode (the default) a
boxed peer's new requests take turns (``edge.turns``): one in flight per process, the others waiting unread
before a byte of them is parsed, each then read and answered as usual, so a genuine delivery from a
boxed address still gets through while the flood behind it costs one request at a time. In ``held``
mode a request from a peer boxed for the source its path names is refused once its head is parsed,
before its body is read or the app hears of it: the connection is held, reading paused, until the
header timeout closes it without an answer (so a flood client waits rather than sends). Either way at
most ``PenaltyBox.hold`` connections wait or are held at once per process; past that one is closed at
once. ``configure`` raises the process's file limit first, and a derived ``hold`` follows it.

And it shares each process's request slots fairly between clients (``edge.client_slots``): a peer with
``client_concurrency`` requests in flight (head received, answer not yet complete) has its next request
wait, unread, until one of its own finishes, so one client's hundreds of connections take no more of the
event loop than that many requests, while other clients' requests go straight through. Trusted proxies
(``forwarded_allow_ips``) are not limited: every client behind them shares their address.

The limits, the box and the slots are class attributes, set once per process by ``configure`` before the server
starts (the ``serve --workers N`` children do it in their app factory, before the first connection).

484 lines (``wc -l``), on purpose: what is left here is one class, uvicorn's protocol with the limits added
(``GuardedHttpToolsProtocol``, about 380 of them), whose timer, parser callbacks and penalty-box waits share
one connection's state and answer through one ``_refuse``. The bookkeeping across connections moved out: the
slots (``client_slots``) and the turns (``turns``). What it uses of uvicorn's protocol and request cycle,
which uvicorn does not promise to keep, is listed in ``uvicorn_private``, which it imports them from, with the
uvicorn releases they are tested in.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from typing import Any
from urllib.parse import unquote

from .. import metrics
from ..config.gateway import Limits
from .client_slots import ClientSlots
from .one_write import OneWriteTransport
from .penalty_box import PenaltyBox, raise_file_limit
from .turns import TURN_INTERVAL, Turns
from .uvicorn_private import (
    HIGH_WATER_LIMIT,
    HttpToolsProtocol,
    RequestResponseCycle,
    cycle_of,
    feed,
    unset_keepalive,
)

log = logging.getLogger("effectgate.gateway")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, a body timeout and a head-size limit."""

    limits = Limits()
    box: PenaltyBox | None = None
    slots: ClientSlots | None = None
    turns: Turns | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        # The source a boxed client asked for (set when its request line is refused), and whether this
        # connection is being held for it.
        self._boxed_source: str | None = None
        self._holding = False
        # Per-client slots: whether this connection holds one (a request in flight), and the bytes it
        # received while waiting for one (None: not waiting).
        self._slot = False
        self._queued: list[bytes] | None = None
        # Boxed clients (one_at_a_time): what this connection's request waits on for its client's turn.
        self._turn_waiter: asyncio.Future[bool] | None = None
        self._reading_head = True
        self._head_bytes = 0
        self._head_size = 0
        self._refusal: tuple[int, str] | None = None
        # Chunked bodies: True from a chunk's size line until its data starts. While it holds at the end
        # of a read, the parser is in a chunk line or (after the last chunk) in the trailer, and the
        # bytes it has taken that were not body are counted in _framing against max_header_bytes.
        self._after_chunk_header = False
        self._framing = 0
        self._body_in_read = 0

    # -- the timer: one per connection, for the head or the body being read -----------------------

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._holding or what == "turn":
            # A boxed client's held connection, or its request that waited for a turn in vain: closed
            # without an answer, as it was held without one.
            self.transport.close()
            return
        log.info("connection.timed_out", extra={"reading": what, "client": _address(self.client)})
        cycle = self.cycle
        if what == "body" and cycle is not None:
            # The app waits in receive(): it hears a disconnect, and whatever it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                # It answered before reading the whole body (a 413, say): no second status line.
                self.transport.close()
                return
        elif cycle is not None and not cycle.response_complete:
            # The head of a pipelined request is late while an earlier answer is being written.
            self.transport.close()
            return
        self._refuse(408, f"the request {what} did not arrive within the time allowed")

    def _refuse(self, status: int, detail: str) -> None:
        self._disarm()
        body = json.dumps({"error": _CODES[status], "detail": detail}).encode("ascii")
        head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}".encode("ascii")]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [
            b"content-type: application/json",
            b"content-length: " + str(len(body)).encode("ascii"),
            b"connection: close",
        ]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()

    # -- the protocol interface ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # An answer's head and body, written by uvicorn in two calls, leave in one (gateway.edge.one_write).
        super().connection_made(OneWriteTransport(transport, self.loop))  # type: ignore[arg-type]
        self._arm(self.limits.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release_slot()
        self._stop_waiting()
        box = self.box
        if self._queued is not None and self.slots is not None and self.client is not None:
            self._queued = None
            self.slots.forget(self.client[0], self)
        if box is not None and self.client is not None:
            box.forget(*self.client)
            if self._holding:
                self._holding = False
                box.held -= 1
        super().connection_lost(exc)

    def _in_turn(self, app: Any, box: PenaltyBox, turns: Turns, source: str) -> Any:
        """``app`` for one request of a boxed client: run in the client's turn, once its body is in."""
        assert self.client is not None
        client, port = self.client

        async def in_turn(scope: Any, receive: Any, send: Any) -> None:
            cycle = cycle_of(receive)
            if not await self._wait_for_turn(cycle, box, turns, source):
                return
            taken = self.loop.time()
            given_back = False

            def give_back() -> None:
                # Never passed on at once: a 401 runs start to end without yielding, so every request
                # of the client made ready in this pass of the loop would find the turn free.
                nonlocal given_back
                if not given_back:
                    given_back = True
                    delay = max(0.0, taken + TURN_INTERVAL - self.loop.time())
                    self.loop.call_later(delay, turns.release, client)

            # Given back when the request authenticates (PenaltyBox.authenticated), else when answered.
            box.turn(client, port, give_back)
            try:
                await app(scope, receive, send)
            finally:
                box.turn(client, port, None)
                give_back()

        return in_turn

    async def _wait_for_turn(
        self, cycle: RequestResponseCycle | None, box: PenaltyBox, turns: Turns, source: str
    ) -> bool:
        """Wait until this request's body is in (or fills uvicorn's buffer), then for its client's turn;
        False when the connection was lost or closed meanwhile (past ``hold`` waiting requests)."""
        # The body first, outside the turn: a body or trailer that drips holds only its own connection
        # (until the body timeout), never the turn the client's other requests wait for.
        while (
            cycle is not None
            and not cycle.waiting_for_100_continue
            and cycle.more_body
            and len(cycle.body) < HIGH_WATER_LIMIT
            and not cycle.disconnected
        ):
            cycle.message_event.clear()
            await cycle.message_event.wait()
        if cycle is not None and cycle.disconnected:
            return False
        assert self.client is not None
        client = self.client[0]
        if turns.take(client):
            return True
        if box.held >= box.hold:
            # Past the limit the client's longest-waiting request gives up its place (closed unanswered),
            # else this one: newest first, the newest is the likeliest to be served. Given up at once, not
            # when its connection is lost (a later loop pass): every request of a burst would otherwise
            # find the same oldest one, and hold would bound nothing.
            metrics.penalty_box_refusal(source, "closed")
            oldest = turns.oldest(client)
            if oldest is None:
                if cycle is not None:
                    # Nothing to answer: uvicorn neither logs a response never started nor sends a 500.
                    cycle.disconnected = True
                self.transport.close()
                return False
            oldest._stop_waiting()
            oldest.transport.close()
        metrics.penalty_box_refusal(source, "waited")
        # Waiting for the turn is not being in flight: the client's slots (shared with a genuine sender on
        # its address, whose proven connections skip the turn) stay free for requests that can run.
        self._release_slot()
        waiter: asyncio.Future[bool] = self.loop.create_future()
        self._turn_waiter = waiter
        turns.wait(client, self)
        box.held += 1
        # Waits at most the header timeout, then closed without an answer (``_timed_out``).
        self._arm(self.limits.header_timeout, "turn")
        try:
            got = await waiter
        finally:
            # Still counted if it got the turn (or was cancelled); else _stop_waiting has uncounted it.
            if self._turn_waiter is waiter:
                self._stop_waiting()
        if not got and cycle is not None:
            # Given up (its connection closing, maybe not yet lost): nothing to answer, nothing to log.
            cycle.disconnected = True
        elif got and cycle is not None and cycle.more_body:
            self._arm(self.limits.body_timeout, "body")
        elif got:
            self._disarm()
        return got

    def _stop_waiting(self) -> None:
        """This request waits for its client's turn no more: forgotten by the turns and no longer counted
        in ``held``, at once (its waiter resolved False unless the turn passed to it)."""
        waiter = self._turn_waiter
        if waiter is None:
            return
        self._turn_waiter = None
        if self.turns is not None and self.client is not None:
            self.turns.forget(self.client[0], self)
        if self.box is not None:
            self.box.held -= 1
        if not waiter.done():
            waiter.set_result(False)

    def _hold_boxed(self, box: PenaltyBox, source: str) -> None:
        """Refuse a boxed client's request: hold the connection unread, or close it past the hold limit."""
        if box.held >= box.hold:
            metrics.penalty_box_refusal(source, "closed")
            self._disarm()
            self.transport.close()
            return
        metrics.penalty_box_refusal(source, "held")
        box.held += 1
        self._holding = True
        self.transport.pause_reading()
        # The head's timer (armed when the request began) closes it; a connection whose head began in an
        # earlier read may have none yet.
        if self._deadline is None:
            self._arm(self.limits.header_timeout, "headers")

    def _cut_body(self, status: int, detail: str) -> None:
        """Refuse a request whose body (or trailer) is being read: the app hears a disconnect."""
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self._disarm()
                self.transport.close()
                return
        self._refuse(status, detail)

    def _release_slot(self) -> None:
        if self._slot and self.slots is not None and self.client is not None:
            self._slot = False
            self.slots.finish(self.client[0])

    def on_response_complete(self) -> None:
        if not self.pipeline:
            self._release_slot()
        super().on_response_complete()

    def admit(self) -> None:
        """A slot of this client's came free: read what arrived while this connection waited."""
        if self._queued is None or self.transport.is_closing():
            return
        data = b"".join(self._queued)
        self._queued = None
        self.transport.resume_reading()
        self._feed(data)

    def data_received(self, data: bytes) -> None:
        if self._queued is not None:
            self._queued.append(data)
            return
        slots = self.slots
        if (
            slots is not None
            and not self._slot
            and self.client is not None
            and slots.full(self.client[0])
            and slots.limits(self.client[0])
        ):
            # This client has its share of requests in flight: this one waits, unread, for one of them,
            # at most the header timeout (then 408), as a head that does not arrive would.
            self._queued = [data]
            self.transport.pause_reading()
            unset_keepalive(self)
            if self._deadline is None:
                self._arm(self.limits.header_timeout, "headers")
            slots.wait(self.client[0], self)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
        self._body_in_read = 0
        # uvicorn's parser loop (uvicorn_private.feed), with its answer to bytes that are not HTTP ours: a
        # parser callback refuses a request by raising, which the parser reports as such bytes.
        fed = feed(self, data)
        if fed == "upgrade":
            return
        if fed == "invalid":
            if self._boxed_source is not None and self.box is not None:
                self._hold_boxed(self.box, self._boxed_source)
            elif self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                log.info("connection.invalid_request", extra={"client": _address(self.client)})
                self._refuse(400, "the request is not valid HTTP/1.1")
            return
        if self._reading_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"the request head exceeds {self.limits.max_header_bytes} bytes")
        elif self._after_chunk_header and not self._reading_head:
            # Counted per read, not per byte: a read that also held the body's last chunks counts
            # their framing too, which only a client sending thousands of tiny chunks would notice.
            self._framing += len(data) - self._body_in_read
            if self._framing > self.limits.max_header_bytes:
                log.info("connection.trailer_too_large", extra={"client": _address(self.client)})
                self._cut_body(431, f"the request trailer exceeds {self.limits.max_header_bytes} bytes")

    # -- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # Bytes of this chunk before the message began are not the head's: count from the next chunk.
        self._reading_head = True
        self._head_size = 0
        # The next request on a kept-alive connection gets its own time for its head.
        if self._deadline is None:
            self._arm(self.limits.header_timeout, "headers")

    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.limits.max_header_bytes:
            self._refusal = (431, f"the request head exceeds {self.limits.max_header_bytes} bytes")
            raise _Refused

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        box = self.box
        turn_for: str | None = None
        # Checked once the head is whole (a request line may arrive in pieces), before any body is read
        # or the app hears of the request.
        if box is not None and box.active and self.client is not None and self.url.startswith(_WEBHOOKS):
            source = unquote(self.url[len(_WEBHOOKS) :].partition(b"?")[0].decode("latin-1"))
            if box.refuses(self.client[0], self.client[1], source) > 0:
                if box.settings.mode == "held":
                    self._boxed_source = source
                    raise _Refused
                if self.slots is None or self.slots.limits(self.client[0]):
                    turn_for = source
        self._reading_head = False
        self._head_bytes = 0
        slots = self.slots
        if slots is not None and not self._slot and self.client is not None and slots.limits(self.client[0]):
            self._slot = True
            slots.start(self.client[0])
        self._arm(self.limits.body_timeout, "body")
        if turn_for is None or box is None or self.turns is None:
            super().on_headers_complete()
            return
        # uvicorn starts (or queues, when pipelined) the app it finds in self.app for this request.
        app = self.app
        self.app = self._in_turn(app, box, self.turns, turn_for)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_chunk_header(self) -> None:
        self._after_chunk_header = True
        self._framing = 0

    def on_body(self, body: bytes) -> None:
        self._after_chunk_header = False
        self._body_in_read += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._after_chunk_header = False
        self._framing = 0
        super().on_message_complete()


_WEBHOOKS = b"/webhooks/"
_CODES = {400: "invalid_request", 408: "request_timeout", 431: "header_too_large"}


def _address(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


def configure(
    limits: Limits, box: PenaltyBox | None = None, slots: ClientSlots | None = None
) -> type[GuardedHttpToolsProtocol]:
    """Set this process's limits, penalty box (the app's, ``app.state.penalty_box``; None: no box) and
    per-client request slots (None: no limit); returns the protocol class to hand to uvicorn (``http=``).

    With a box, the process's file limit is raised to its hard limit first (``raise_file_limit``): the box
    keeps a flood's connections waiting instead of closing them, one descriptor each.
    """
    GuardedHttpToolsProtocol.limits = limits
    GuardedHttpToolsProtocol.box = box
    GuardedHttpToolsProtocol.slots = slots
    GuardedHttpToolsProtocol.turns = Turns() if box is not None else None
    if box is not None:
        box.use_file_limit(raise_file_limit())
    return GuardedHttpToolsProtocol


#: The protocol as uvicorn's ``http`` option names it in a child process, which imports it by name.
PROTOCOL_PATH = f"{__name__}:GuardedHttpToolsProtocol"
