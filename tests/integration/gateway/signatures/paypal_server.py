"""The fake PayPal API served over TLS on 127.0.0.1, in a thread, for tests that need real HTTPS.

The listening socket is bound before the server thread starts, so a request sent at once waits in the
backlog instead of failing: no polling for readiness.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from effectgate.gateway.fakes.paypal import FakePayPal, create_app
from tests.unit.gateway.signatures.paypal_pki import Pki


@contextmanager
def serve_fake_paypal(fake: FakePayPal, pki: Pki, workdir: Path) -> Iterator[str]:
    """Serve ``fake`` over HTTPS with a server certificate from ``pki``; yields its base URL."""
    chain, key = pki.tls_server("127.0.0.1")
    (workdir / "tls-chain.pem").write_bytes(chain)
    (workdir / "tls-key.pem").write_bytes(key)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(fake),
        log_level="warning",
        ssl_certfile=str(workdir / "tls-chain.pem"),
        ssl_keyfile=str(workdir / "tls-key.pem"),
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
