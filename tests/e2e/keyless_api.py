"""A downstream API with **no** idempotency support, served on 127.0.0.1 in a thread.

``POST /v1/labels`` makes a new label every time, whatever headers it carries (as many shipping APIs and
Shopify's fulfilment mutation do); ``GET /v1/labels?reference=R`` lists the labels whose ``reference`` is
R, which is what a step's ``find`` searches. ``X-Api-Key`` must match the key it was given.

``POST /_fake/hold {"hold": true}`` makes the next creates store their label and then *not answer* until
released: a worker waiting on that answer has reached the API and recorded nothing, which is the crash
window a test SIGKILLs it in, with no sleep to aim for it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class KeylessApi:
    """The fake's state: every label made, and whether creates are held."""

    api_key: str
    labels: list[dict[str, Any]] = field(default_factory=list)
    hold: bool = False
    # The header names each create arrived with, lower-cased.
    create_headers: list[set[str]] = field(default_factory=list)
    release: asyncio.Event | None = None


def create_app(api: KeylessApi) -> Starlette:
    def release() -> asyncio.Event:
        if api.release is None:
            api.release = asyncio.Event()
        return api.release

    def authorised(request: Request) -> bool:
        return request.headers.get("x-api-key") == api.api_key

    async def labels(request: Request) -> JSONResponse:
        if not authorised(request):
            return JSONResponse(
                {"error": {"type": "authentication_error", "code": "bad_key"}}, status_code=401
            )
        if request.method == "GET":
            reference = request.query_params.get("reference")
            return JSONResponse({"data": [label for label in api.labels if label["reference"] == reference]})
        body = await request.json()
        api.create_headers.append(set(request.headers.keys()))
        label = {
            "id": f"lbl_{len(api.labels) + 1}",
            "reference": body.get("reference"),
            "order": body.get("order"),
        }
        api.labels.append(label)
        if api.hold:
            await release().wait()
        return JSONResponse(label, status_code=201)

    async def hold(request: Request) -> JSONResponse:
        api.hold = bool((await request.json())["hold"])
        if not api.hold:
            release().set()
            api.release = None
        return JSONResponse({"hold": api.hold})

    async def listing(request: Request) -> JSONResponse:
        return JSONResponse({"labels": api.labels})

    return Starlette(
        routes=[
            Route("/v1/labels", labels, methods=["GET", "POST"]),
            Route("/_fake/hold", hold, methods=["POST"]),
            Route("/_fake/labels", listing, methods=["GET"]),
        ]
    )


@contextmanager
def serve(api: KeylessApi) -> Iterator[str]:
    """Serve ``api`` on a loopback port bound before the thread starts; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(api), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
