"""A loopback HTTPS server standing in for PayPal's certificate URL; it counts what it serves."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class CertServer:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.hits: list[str] = []

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"


@contextmanager
def serve_certificates(
    files: dict[str, bytes], tls_chain: bytes, tls_key: bytes, workdir: Path
) -> Iterator[CertServer]:
    """Serve ``files`` by path over TLS on 127.0.0.1 (any other path is 404) until the block ends."""
    chain_path, key_path = workdir / "tls-chain.pem", workdir / "tls-key.pem"
    chain_path.write_bytes(tls_chain)
    key_path.write_bytes(tls_key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain_path, key_path)

    holder: list[CertServer] = []

    class Handler(BaseHTTPRequestHandler):
        # A client that connects and never finishes its request (or its TLS handshake) holds only its own
        # thread, and only this long.
        timeout = 5

        def do_GET(self) -> None:
            holder[0].hits.append(self.path)
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/x-pem-file")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # The handshake happens in the request's own thread, on its first read: done in accept(), one client
    # that stalled mid-handshake held the serving loop, and shutdown() at the end of the block waited forever.
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    holder.append(CertServer(server))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
