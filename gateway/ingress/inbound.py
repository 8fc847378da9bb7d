"""A delivery request as the ingress pipeline sees it (``Inbound``), which requests are deliveries
(``webhook_source``), and how a step of the pipeline ends the request early (``Refused``)."""

from __future__ import annotations

import itertools
import os
import uuid

from starlette.datastructures import Headers, State
from starlette.types import Receive, Scope

from .answers import Answer

# Request ids unique across processes without a uuid4 (an os.urandom call) per request: a random prefix per
# process (a forked child draws its own), then a counter.
_request_id_prefix = uuid.uuid4().hex[:16]
_request_numbers = itertools.count()


def _new_request_id() -> str:
    return f"{_request_id_prefix}{next(_request_numbers):016x}"


def _new_request_id_prefix() -> None:
    global _request_id_prefix
    _request_id_prefix = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_new_request_id_prefix)


_PREFIX = "/webhooks/"


def webhook_source(scope: Scope) -> str | None:
    """The source a ``POST /webhooks/{source}`` request names, or None for any other request (the
    Starlette routes answer those: the probes, the operator plane, a 405 for another method)."""
    path: str = scope["path"]
    if scope["method"] != "POST" or not path.startswith(_PREFIX) or scope.get("root_path"):
        return None
    name = path[len(_PREFIX) :]
    # As the route's {source} convertor: one non-empty path segment.
    return name if name and "/" not in name else None


class Inbound:
    """One delivery request on its way through the pipeline: what every step reads."""

    __slots__ = ("client", "headers", "name", "receive", "request_id", "scope", "state")

    def __init__(self, state: State, scope: Scope, receive: Receive, name: str) -> None:
        self.state = state
        self.scope = scope
        self.receive = receive
        self.name = name
        self.headers = Headers(scope=scope)
        self.request_id = self.headers.get("x-request-id") or _new_request_id()
        # The peer, or the client a trusted proxy forwarded for (uvicorn's proxy headers rewrite the scope).
        self.client: tuple[str, int] | None = scope.get("client")


class Refused(Exception):
    """A step's early answer: the pipeline stops there and sends it."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
