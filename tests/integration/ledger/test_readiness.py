"""/readyz follows Postgres through an outage: back within 2 s of the database, one connection however many
probes arrive. The outage is a TCP proxy between the gateway and the real Postgres, cut and restored on the
same port (issue 37, item 4)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.handlers.registry import Registry
from effectgate.ledger.readiness import APPLICATION_NAME

pytestmark = pytest.mark.anyio

CONFIG = """
[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""
ENV = {"STRIPE_SECRET": "whsec_test_readiness"}
# Each probe's whole check is bounded by min(pool_timeout, READYZ_TIMEOUT).
POOL_TIMEOUT = 1.0
OUTAGE = 4.0


class PgProxy:
    """Forwards 127.0.0.1:``port`` to the Postgres of ``target``. ``cut()`` closes the listener and every
    proxied connection; ``cut(hold=True)`` closes the connections but keeps accepting, answering nothing (a
    server that hangs); ``restore()`` forwards again on the same port. Counts connections by the
    ``application_name`` of their startup message, so the probe's are told from the pools'."""

    def __init__(self, target: str) -> None:
        params = conninfo_to_dict(target)
        self.host = str(params.get("host") or "127.0.0.1")
        self.target_port = int(params.get("port") or 5432)
        self.port = 0
        self.holding = False
        self.accepted: Counter[str] = Counter()
        # Statements each application sent: a simple query ("Q") or an extended-protocol execute ("E").
        self.statements: Counter[str] = Counter()
        self.open_now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, target: str) -> str:
        # Plain startup messages (no SSL or GSS negotiation first), so the proxy can read application_name.
        return make_conninfo(
            target, host="127.0.0.1", port=self.port, sslmode="disable", gssencmode="disable"
        )

    async def cut(self, *, hold: bool = False) -> None:
        self.holding = hold
        if not hold and self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def restore(self) -> None:
        await self.cut()
        self.holding = False
        await self.listen()

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self.host}/.s.PGSQL.{self.target_port}")
        return await asyncio.open_connection(self.host, self.target_port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        name: str | None = None
        try:
            (length,) = struct.unpack("!I", await reader.readexactly(4))
            startup = await reader.readexactly(length - 4)
            pairs = startup[4:].split(b"\0")
            name = dict(zip(pairs[0::2], pairs[1::2], strict=False)).get(b"application_name", b"").decode()
            self.accepted[name] += 1
            self.open_now[name] += 1
            self.peak[name] = max(self.peak[name], self.open_now[name])
            if self.holding:
                await reader.read()  # until the client gives up or cut() closes it
                return
            up_reader, up_writer = await self._upstream()
            self._writers.add(up_writer)
            up_writer.write(struct.pack("!I", length) + startup)
            await asyncio.gather(self._count(name, reader, up_writer), _pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if name is not None:
                self.open_now[name] -= 1
            writer.close()

    async def _count(self, name: str, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        # After the startup message every client message is a type byte and a length: forwarded whole, counted.
        try:
            while True:
                head = await source.readexactly(5)
                kind, length = head[:1], struct.unpack("!I", head[1:])[0]
                rest = await source.readexactly(length - 4)
                if kind in (b"Q", b"E"):
                    self.statements[name] += 1
                sink.write(head + rest)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        sink.close()


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[PgProxy]:
    p = PgProxy(db_url)
    await p.listen()
    yield p
    await p.cut()


@pytest.fixture
async def client(proxy: PgProxy, db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse(CONFIG, env=ENV), Registry(), proxy.url(db_url), pool_timeout=POOL_TIMEOUT)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield c


async def ready_within(client: httpx.AsyncClient, seconds: float) -> float:
    """Seconds until /readyz answered 200, polled; fails past ``seconds``."""
    start = time.monotonic()
    deadline = start + seconds
    while True:
        r = await client.get("/readyz")
        if r.status_code == 200:
            return time.monotonic() - start
        if time.monotonic() > deadline:
            pytest.fail(f"/readyz still {r.status_code} {r.json()} {seconds:g} s after Postgres was back")
        await asyncio.sleep(0.05)


async def test_readiness_is_back_within_two_seconds_of_postgres(
    proxy: PgProxy, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/readyz")).status_code == 200
    await proxy.cut()
    # Probed through an outage of some seconds, as a kubelet probes: long enough for a pool's reconnect
    # backoff (1, 2, 4 s, ...) to grow past the 2 s allowed, which it did when a pool stood behind /readyz
    # (15-33 s after longer outages, every replica out of the load balancer at once).
    outage_ends = time.monotonic() + OUTAGE
    while time.monotonic() < outage_ends:
        r = await client.get("/readyz")
        assert (r.status_code, r.json()["error"]) == (503, "ledger_unavailable")
        await asyncio.sleep(0.25)
    await proxy.restore()
    assert await ready_within(client, 2.0) < 2.0


async def test_concurrent_probes_in_an_outage_share_one_connection_attempt(
    proxy: PgProxy, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/readyz")).status_code == 200
    assert proxy.accepted[APPLICATION_NAME] == 1
    # A server that accepts and never answers: the costly outage, each attempt waits out its timeout.
    await proxy.cut(hold=True)
    start = time.monotonic()
    answers = await asyncio.gather(*(client.get("/readyz") for _ in range(50)))
    elapsed = time.monotonic() - start
    assert {(r.status_code, r.json()["error"]) for r in answers} == {(503, "ledger_unavailable")}
    # One attempt for all 50, and all answered within one probe's bound, not 50 of them queued.
    assert proxy.accepted[APPLICATION_NAME] == 2
    assert proxy.peak[APPLICATION_NAME] == 1
    assert elapsed < POOL_TIMEOUT + 1.0
    await proxy.restore()
    assert await ready_within(client, 2.0) < 2.0
    assert proxy.peak[APPLICATION_NAME] == 1


async def test_a_probe_on_a_migrated_ledger_sends_one_statement(
    proxy: PgProxy, client: httpx.AsyncClient
) -> None:
    # Probed every few seconds by every kubelet and load balancer: one trivial statement each, not the
    # migration check's several, once the connection has found the ledger migrated.
    assert (await client.get("/readyz")).status_code == 200
    before = proxy.statements[APPLICATION_NAME]
    for _ in range(20):
        assert (await client.get("/readyz")).status_code == 200
    assert proxy.statements[APPLICATION_NAME] - before == 20
    # A new connection (after an outage, perhaps to another server) asks about migrations again.
    await proxy.cut()
    assert (await client.get("/readyz")).status_code == 503
    await proxy.restore()
    await ready_within(client, 2.0)
    assert proxy.statements[APPLICATION_NAME] - before > 21
