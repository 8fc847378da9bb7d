"""The delivery plane's answers, built as bytes and sent as two ASGI messages.

Ingress is a raw ASGI route (``gateway.ingress``): on its hot path a Starlette ``Response`` object, its
header bookkeeping and a fresh JSON encoder per answer cost more than the answer itself. An ``Answer`` is
the status, the encoded body and the headers, sent exactly as Starlette's ``JSONResponse`` would send them
(``content-length`` and ``content-type``, no more), so a sender sees the same bytes as before.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

# Starlette's JSONResponse encoding (compact, UTF-8, no NaN), made once: json.dumps with options builds a
# new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_JSON = (b"content-type", b"application/json")
_TEXT = (b"content-type", b"text/plain; charset=utf-8")


class Answer:
    """A complete HTTP answer: status, body, headers (``content-length`` included)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, content_type: tuple[bytes, bytes] = _JSON) -> None:
        self.status = status
        self.body = body
        self.headers = [(b"content-length", b"%d" % len(body)), content_type]

    def header(self, name: str, value: str) -> Answer:
        """This answer with one more header (names lowercase, as ASGI wants them)."""
        self.headers.append((name.encode("latin-1"), value.encode("latin-1")))
        return self

    async def send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def json_answer(status: int, content: Any) -> Answer:
    """``content`` as a JSON answer."""
    return Answer(status, _ENCODER.encode(content).encode("utf-8"))


def text_answer(status: int, body: bytes) -> Answer:
    """``body`` as a plain-text answer (a provider that reads the body, such as Adyen's ``[accepted]``)."""
    return Answer(status, body, _TEXT)


def error_answer(status: int, code: str, detail: str, **extra: Any) -> Answer:
    """Every error answer has this shape: ``{"error": CODE, "detail": …}`` (as ``ingress.error``)."""
    return json_answer(status, {"error": code, "detail": detail, **extra})


# Seconds a sender is asked to wait after a 503 that wrote nothing (overloaded, claim_timeout, a refusal that
# could not be kept): long enough for a queue to drain, short enough that a provider's next try comes soon.
RETRY_AFTER = "1"


def retry_later(code: str, detail: str) -> Answer:
    """A 503 ``code`` with ``Retry-After``: nothing was written, the sender should try again."""
    return error_answer(503, code, detail).header("retry-after", RETRY_AFTER)
