"""Request bodies read with a limit that holds before a byte is buffered, whatever the framing.

Every body the gateway reads goes through ``read_body``: a declared ``Content-Length`` over the limit is
refused before anything is read, and a chunked body (no length) is refused as soon as what arrived passes
the limit, so an unauthenticated sender can make a process hold at most ``limit`` bytes plus one chunk.
Past the limit the answer is 413 ``payload_too_large`` (an HTML page on the dashboard).
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

# The operator plane's forms (sign-in, sign-out, job actions, bulk) and API calls carry a few fields at
# most; no operator endpoint takes a document.
MAX_OPERATOR_BODY_BYTES = 4096


class BodyTooLarge(Exception):
    """The request body is over the limit; ``limit`` says which."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body exceeds {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read only while it stays within ``limit`` bytes; ``BodyTooLarge`` as soon as it does not."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """As ``read_body``, for a raw ASGI route: the body from ``receive``, ``declared`` its Content-Length
    header. ``ClientDisconnect`` when the client goes away first (as Starlette's ``Request.stream``)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        if not message.get("more_body", False):
            # Most bodies come in one message: no copy then.
            return b"".join([*chunks, chunk]) if chunks else chunk
        chunks.append(chunk)
