"""The parts of uvicorn the edge uses that uvicorn does not promise to keep, in one module, with the
releases they are tested in.

uvicorn's public API is its command line, ``uvicorn.run``, ``Config`` and ``Server``; everything under
``uvicorn.protocols`` and ``uvicorn.supervisors`` may change in any release. The edge needs two classes
from there (docs/adr/0009): the connection guard (``guard``) subclasses the httptools protocol, and
``serve --workers N`` (``supervisor``) subclasses the multiprocess supervisor. Every import from those
packages, and every call of one of uvicorn's underscore names, happens here and nowhere else in the
project; ``guard`` and ``supervisor`` import these names from this module. ``tests/unit/gateway/edge/test_uvicorn_private.py``
reads the code to keep it so, and checks that every uvicorn name the three modules use is listed below
and that ``FLOOR`` and ``CEILING`` are pyproject's requirement.

Raising the ceiling: install the new release; diff its ``protocols/http/httptools_impl.py`` and
``supervisors/multiprocess.py`` against the last tested release's, for every name below; diff its
``HttpToolsProtocol.data_received`` against ``feed``; run the guard's tests, which drive a real uvicorn
(``tests/unit/test_guard_*.py``, ``test_one_write.py``), and ``tests/e2e/test_serve_processes.py``; then
move ``CEILING`` and pyproject's bound together.

What is used, and why:

``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, subclassed by ``guard.GuardedHttpToolsProtocol``:

- its constructor, called by uvicorn's server with ``config``, ``server_state``, ``app_state`` and ``_loop``;
  the guard keeps the signature.
- overridden, each calling uvicorn's own: ``connection_made`` (the transport wrapped in ``OneWriteTransport``
  first), ``connection_lost`` (the slot, turn or hold the connection had is given back),
  ``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
  ``on_message_complete`` (httptools' callbacks: the limits act between them), ``on_response_complete``
  (a client's slot freed when its answer is complete).
- replaced: ``data_received``, uvicorn's parser loop, copied as ``feed`` (the limits act per read).
- read: ``loop`` (the guard's timers), ``transport`` (paused, closed and written by the guard), ``client``
  (the peer the box and the slots count), ``url`` (the path the box checks), ``cycle`` (the request being
  read), ``pipeline`` (no slot is freed while pipelined requests wait), ``server_state`` and its
  ``default_headers`` (the guard's own answers carry them), ``parser`` (fed by ``feed``).
- swapped for one request: ``app``, which ``on_headers_complete`` starts (or queues, when pipelined); a
  boxed client's request gets its app wrapped to run in the client's turn.
- called, here only: ``_unset_keepalive_if_required`` (a connection sending bytes is not idle; the
  keep-alive timer stops), ``_should_upgrade``, ``handle_websocket_upgrade`` and
  ``_unsupported_upgrade_warning`` (the parser loop's answer to an ``Upgrade`` header; the warning method
  first appeared in 0.30.6).

``uvicorn.protocols.http.httptools_impl.RequestResponseCycle``, one request's state, reached as the
protocol's ``cycle`` or as the owner of the ``receive`` uvicorn hands the app (``cycle_of``):
``disconnected`` and ``message_event`` (set together, the app waiting in ``receive`` hears a disconnect and
what it sends is dropped; ``disconnected`` alone keeps uvicorn from answering an app that never started
an answer), ``response_started`` and ``response_complete`` (whether an answer has begun, or ended),
``more_body``, ``body`` and ``waiting_for_100_continue`` (whether a request's body is in, before the
request waits for its client's turn).

``uvicorn.protocols.http.flow_control.HIGH_WATER_LIMIT``: how much body uvicorn buffers before it pauses
reading; a request waiting for its turn waits for no more of its body than that.

``uvicorn.supervisors.multiprocess.Multiprocess``, subclassed by ``supervisor.Supervisor``: its constructor
``(config, sockets)`` (0.51 dropped its ``target`` argument: the floor), ``run``; ``keep_subprocess_alive``,
``restart_all`` and ``handle_ttou`` (each may end children) and ``join_all`` overridden to mark ended
children dead in the metrics directory; its ``processes`` and their ``pid`` read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.supervisors.multiprocess import Multiprocess

__all__ = [
    "CEILING",
    "FLOOR",
    "HIGH_WATER_LIMIT",
    "Fed",
    "HttpToolsProtocol",
    "Multiprocess",
    "RequestResponseCycle",
    "cycle_of",
    "feed",
    "unset_keepalive",
]

#: The oldest uvicorn release the names above are tested with (pyproject: ``uvicorn>=FLOOR``).
FLOOR = "0.51"
#: The first release not tested (pyproject: ``uvicorn<CEILING``); raised only as the module says.
CEILING = "0.55"

#: What ``feed`` made of the bytes: parsed (as far as they go), an ``Upgrade`` answered the way uvicorn
#: answers it, or not HTTP (or refused by a parser callback), left for the caller to answer.
Fed = Literal["parsed", "upgrade", "invalid"]


def unset_keepalive(protocol: HttpToolsProtocol) -> None:
    """Stop ``protocol``'s keep-alive timer: bytes arrived, so the connection is not idle."""
    protocol._unset_keepalive_if_required()


def feed(protocol: HttpToolsProtocol, data: bytes) -> Fed:
    """Feed ``data`` to ``protocol``'s parser as uvicorn's ``HttpToolsProtocol.data_received`` does, all but
    its answer to bytes that are not HTTP, which is the caller's (``"invalid"``)."""
    unset_keepalive(protocol)
    try:
        protocol.parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        if protocol._should_upgrade():
            protocol.handle_websocket_upgrade()
        else:
            protocol._unsupported_upgrade_warning()
        return "upgrade"
    except httptools.HttpParserError:
        return "invalid"
    return "parsed"


def cycle_of(receive: Callable[..., Any]) -> RequestResponseCycle | None:
    """The request cycle whose ``receive`` uvicorn handed an app (a bound method of the cycle), or None."""
    cycle = getattr(receive, "__self__", None)
    return cycle if isinstance(cycle, RequestResponseCycle) else None
