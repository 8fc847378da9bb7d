"""The guard's limits and its copy of uvicorn's parser loop, through a real uvicorn (tests/unit/gateway/edge/real_uvicorn.py):
a late head or body is answered 408, an oversized head or trailer 431, bytes that are not HTTP 400, and a
request asking to upgrade to another protocol is served as plain HTTP after uvicorn's warning, the calls
uvicorn_private.feed makes on uvicorn's behalf. tests/e2e/test_serve_processes.py asks the same of
``serve --workers 2``; these run without a database, in every ``make test-lowest``."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from effectgate.gateway.config.gateway import Limits
from tests.unit.gateway.edge.real_uvicorn import App, serving, status

pytestmark = pytest.mark.anyio

# Short, since each 408 test lasts one timeout; they tell "cut off" from "held for ever".
TIMEOUT = 0.5


async def test_a_head_that_does_not_arrive_in_time_is_answered_408() -> None:
    app = App()
    async with serving(app, limits=Limits(header_timeout=TIMEOUT)) as server:
        client = await server.connect()
        client.send(b"POST /?slow HTTP/1.1\r\nhost: gateway\r\nx-slow: a")
        answer = await client.answer()
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"error": "request_timeout"' in answer
    assert app.seen == []


async def test_a_body_shorter_than_its_content_length_is_answered_408_and_the_app_hears_a_disconnect() -> (
    None
):
    heard: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            heard.append(message["type"])
            if not message.get("more_body"):
                return

    async with serving(app, limits=Limits(body_timeout=TIMEOUT)) as server:
        client = await server.connect()
        client.send(b"POST /?short HTTP/1.1\r\nhost: gateway\r\ncontent-length: 10\r\n\r\n{}")
        answer = await client.answer()
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"error": "request_timeout"' in answer
    assert heard == ["http.request", "http.disconnect"]


async def test_an_oversized_head_is_answered_431() -> None:
    app = App()
    async with serving(app, limits=Limits(max_header_bytes=1024)) as server:
        client = await server.connect()
        client.send(b"POST /?big HTTP/1.1\r\nhost: gateway\r\nx-big: " + b"a" * 2048 + b"\r\n\r\n")
        answer = await client.answer()
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"error": "header_too_large"' in answer
    assert app.seen == []


async def test_a_trailer_past_the_head_limit_is_answered_431(caplog: pytest.LogCaptureFixture) -> None:
    # The parser buffers a trailer line whole before it reports it: only the guard's count of the bytes
    # after the last chunk bounds it.
    app = App()
    with caplog.at_level(logging.INFO, logger="effectgate.gateway"):
        async with serving(app, limits=Limits(max_header_bytes=1024)) as server:
            client = await server.connect()
            client.send(
                b"POST /?trailer HTTP/1.1\r\nhost: gateway\r\ntransfer-encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n0\r\nx-drip: " + b"a" * 2048
            )
            answer = await client.answer()
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"error": "header_too_large"' in answer
    assert "connection.trailer_too_large" in [r.getMessage() for r in caplog.records]


async def test_bytes_that_are_not_http_are_answered_400() -> None:
    app = App()
    async with serving(app) as server:
        client = await server.connect()
        client.send(b"HELLO THERE\r\n\r\n")
        answer = await client.answer()
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"error": "invalid_request"' in answer
    assert app.seen == []


async def test_a_request_asking_to_upgrade_to_another_protocol_is_served_as_plain_http(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The parser stops at an Upgrade header; uvicorn's loop, which the guard's feed copies, asks
    # _should_upgrade (a WebSocket only, and none is configured here), warns through
    # _unsupported_upgrade_warning and leaves the request to the app as HTTP/1.1.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        async with serving(app) as server:
            client = await server.connect()
            client.send(
                b"GET /?up HTTP/1.1\r\nhost: gateway\r\nconnection: upgrade, http2-settings\r\n"
                b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            )
            answer = await client.response()
    assert status(answer) == 200 and answer.endswith(b"\r\n\r\nok")
    assert "Unsupported upgrade request." in [r.getMessage() for r in caplog.records]
