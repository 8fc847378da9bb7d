"""Operator-plane bodies are bounded before they are read: a 413 with nothing pulled past the limit.

The attack, measured before the fix: a 300 MiB ``/ui/login`` body was read whole, answered 401 and grew
the process by 581 MiB. Here the body is an ASGI stream that counts what the app pulls from it, declared
(``Content-Length``) or chunked (no length), so "not read" is a count, not a guess about memory.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette

from effectgate.gateway.app import create_app
from effectgate.gateway.bodies import MAX_OPERATOR_BODY_BYTES
from effectgate.gateway.config import parse
from effectgate.handlers.registry import Registry

pytestmark = pytest.mark.anyio

CONFIG = """
[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[[operators]]
name = "admin"
token_env = "ADMIN_TOKEN"
scopes = ["operate"]
"""
ENV = {"STRIPE_SECRET": "whsec_bodies", "ADMIN_TOKEN": "admin-token-0123456789abcdef"}
CHUNK = 1024
HUGE = 300 * 1024 * 1024


class Sender:
    """An ASGI body of ``total`` bytes in ``CHUNK``-byte pieces, produced only as the app pulls them."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.pulled = 0

    async def receive(self) -> dict[str, Any]:
        if self.pulled >= self.total:
            return {"type": "http.disconnect"}
        piece = min(CHUNK, self.total - self.pulled)
        self.pulled += piece
        return {"type": "http.request", "body": b"t" * piece, "more_body": self.pulled < self.total}


def app() -> Starlette:
    # No lifespan and no database: nothing on these paths may need either before the body is refused.
    return create_app(parse(CONFIG, env=ENV), Registry(), "postgresql://nobody@127.0.0.1:1/none")


async def post(path: str, sender: Sender, *, declared: bool) -> tuple[int, dict[str, str], bytes]:
    headers = [(b"host", b"gateway"), (b"content-type", b"application/x-www-form-urlencoded")]
    if declared:
        headers.append((b"content-length", str(sender.total).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("gateway", 80),
    }
    answer: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app()(scope, sender.receive, send)
    return answer["status"], answer["headers"], answer["body"]


@pytest.mark.parametrize("path", ["/ui/login", "/ui/logout", "/api/jobs/redrive", "/api/kinds/k/pause"])
async def test_a_declared_oversized_body_is_413_before_a_byte_is_read(path: str) -> None:
    sender = Sender(HUGE)
    status, headers, body = await post(path, sender, declared=True)
    assert status == 413
    assert sender.pulled == 0
    check_answer(path, headers, body)


@pytest.mark.parametrize("path", ["/ui/login", "/ui/logout", "/api/jobs/redrive", "/api/kinds/k/pause"])
async def test_a_chunked_oversized_body_is_413_once_it_passes_the_limit(path: str) -> None:
    sender = Sender(HUGE)
    status, headers, body = await post(path, sender, declared=False)
    assert status == 413
    # What arrived up to the limit, and the one chunk that passed it: nothing more was pulled.
    assert sender.pulled <= MAX_OPERATOR_BODY_BYTES + CHUNK
    check_answer(path, headers, body)


def check_answer(path: str, headers: dict[str, str], body: bytes) -> None:
    if path.startswith("/ui/"):
        assert headers["content-type"].startswith("text/html")
        assert b"payload_too_large" in body
    else:
        assert json.loads(body)["error"] == "payload_too_large"


async def test_a_sign_in_form_within_the_limit_is_still_read_and_checked() -> None:
    sender = Sender(MAX_OPERATOR_BODY_BYTES)
    status, _, _ = await post("/ui/login", sender, declared=True)
    # A well-sized form with no valid token: refused as a sign-in, not as a size.
    assert status == 401
    assert sender.pulled == MAX_OPERATOR_BODY_BYTES
