"""Nothing held hostage by a frozen or cut-off process (issue 42, section 3).

For each place a process holds a lock or a transaction across a round trip, a real holder — a child process
running the project's own code (tests/integration/ledger/maintenance/frozen_holder.py) on a session configured as every effectgate
session is — takes it and is then frozen (SIGSTOP: its kernel still answers TCP, so only a server-side timeout
helps) or cut off (a proxy that stops forwarding, as a partition does). The test shows another process's work
resumes within the session's ``idle_in_transaction_timeout`` (shortened here to ``TIMEOUT``) and that the
server ended the holder's session. Each was seen to fail with the bound switched off (``TIMEOUT`` 0): the
other process was still waiting at ``DEADLINE``.

Times are measured and bounded generously (``BOUND``), never asserted tight: the claim is "seconds, not until
the holder resumes".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from effectgate.ledger import db, error_kinds, jobs
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcileResult
from tests.integration.jobs_and_workers import claim, job, later, lease_one, scalar

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[4]
# The holder's idle_in_transaction_timeout: short, so each test takes seconds.
TIMEOUT = 3.0
# Measured resume times must be under this: the timeout plus generous slack for a loaded 2-core machine.
BOUND = TIMEOUT + 12.0
# How long the other process keeps trying before the test fails (what a test without the bound runs into).
DEADLINE = BOUND + 5.0


class Holder:
    """A child process holding a lock or transaction at ``place``; ``pid`` its backend's pid."""

    def __init__(self, proc: asyncio.subprocess.Process, backend_pid: int) -> None:
        self.proc = proc
        self.backend_pid = backend_pid

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)


@contextlib.asynccontextmanager
async def holding(place: str, url: str, key: str | None = None) -> AsyncIterator[Holder]:
    """Start the holder and wait for it to say it holds ``place``; killed on the way out, frozen or not."""
    args = [place, url, str(TIMEOUT), *([key] if key else [])]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.ledger.maintenance.frozen_holder",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line.startswith(b"ready "):
            err = await asyncio.wait_for(proc.stderr.read(), 10)
            pytest.fail(f"holder {place} did not start: {line!r} {err.decode(errors='replace')[-2000:]}")
        yield Holder(proc, int(line.split()[1]))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def backend_alive(conn: db.Conn, pid: int) -> bool:
    return bool(await scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid))


async def resumed(attempt: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until ``attempt()`` first succeeds, polling; fails the test at ``DEADLINE``."""
    started = time.monotonic()
    while not await attempt():
        if time.monotonic() - started > DEADLINE:
            pytest.fail(f"{what}: still held after {DEADLINE:g} s (the holder's session was never ended)")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def reconcile_until_owned(conn: db.Conn, service: str) -> tuple[float, ReconcileResult]:
    """Passes of another process's reconciler until it runs ``service``: the seconds that took, the pass."""
    passes: list[ReconcileResult] = []

    async def owned() -> bool:
        # A clock a minute ahead: leases taken on the real clock have expired by then.
        passes.append(await Reconciler().run_once(conn, now=later(60)))
        return service not in passes[-1].skipped

    elapsed = await resumed(owned, f"{service} held by a frozen process")
    assert len(passes) > 1, f"the first pass already ran {service}: the holder held nothing"
    return elapsed, passes[-1]


@pytest.mark.parametrize("service", ["lease_rescuer", "pending_waker", "partitions", "retention"])
async def test_a_frozen_maintenance_holder_is_ended_within_the_bound(
    db_url: str, conn: db.Conn, service: str
) -> None:
    # The rescuer and the waker hold a transaction-scoped lock inside their transaction; the partition and
    # retention keepers a session-level one, idle outside any transaction between their own commits.
    job_id = await claim(conn)
    await lease_one(conn, ttl=30)
    async with holding(service, db_url) as holder:
        holder.freeze()
        elapsed, result = await reconcile_until_owned(conn, service)
        assert elapsed < BOUND
        assert not await backend_alive(conn, holder.backend_pid)
    if service == "lease_rescuer":
        # The dead worker's job is taken over by the other process, not after the frozen one resumes.
        assert job_id in result.redriven
        assert (await job(conn, job_id))["state"] == "pending"


async def test_a_frozen_claim_batch_frees_its_keys_within_the_bound(db_url: str, conn: db.Conn) -> None:
    # A claim batch's rounds share one transaction; a key it inserted is held by the unique index until commit,
    # so another gateway's claim of the same key waits on it.
    key = f"frozen-{uuid.uuid4().hex[:8]}"
    async with holding("claim", db_url, key) as holder:
        holder.freeze()
        with pytest.raises(Exception) as held:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '300ms'")
                await claim(conn, key)
        assert error_kinds.error_kind(held.value.__cause__ or held.value) == "lock_timeout"
        started = time.monotonic()
        job_id = await asyncio.wait_for(claim(conn, key), DEADLINE)
        elapsed = time.monotonic() - started
        assert elapsed < BOUND
        assert not await backend_alive(conn, holder.backend_pid)
    assert (await job(conn, job_id))["state"] == "pending"


async def test_a_frozen_fetch_frees_its_jobs_within_the_bound(db_url: str, conn: db.Conn) -> None:
    # A fetch inside a transaction (a finish batch's refill) locks the rows it leased until commit; another
    # worker's fetch skips them (SKIP LOCKED) and finds nothing while the holder lives.
    job_id = await claim(conn)
    async with holding("fetch", db_url) as holder:
        holder.freeze()
        assert await jobs.fetch_and_lease(conn, owner="w2", kinds={"k": 30.0}, limit=10) == []
        leased: list[jobs.Lease] = []

        async def fetched() -> bool:
            leased.extend(await jobs.fetch_and_lease(conn, owner="w2", kinds={"k": 30.0}, limit=10))
            return bool(leased)

        assert await resumed(fetched, "a job leased by a frozen fetch") < BOUND
        assert [lease.job_id for lease in leased] == [job_id]
        assert not await backend_alive(conn, holder.backend_pid)


class BlackholeProxy:
    """A TCP proxy to Postgres that can stop forwarding in both directions while keeping every socket open:
    to each side the other simply goes silent, as across a partition (the proxy's own kernel still answers
    TCP keepalives, so only a timeout on the server ends the session, as for a frozen process)."""

    def __init__(self, host: str, port: int) -> None:
        # The embedded server listens on a Unix socket (host a directory); a TEST_DATABASE_URL may name TCP.
        self.target = (host, port)
        self.cut = False
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        host, port = self.target
        if host.startswith("/"):
            server_r, server_w = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            server_r, server_w = await asyncio.open_connection(host, port)
        self.writers += [client_w, server_w]
        await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if not self.cut:
                    writer.write(data)
                    await writer.drain()
        # An end seen after the cut is not passed on either: the other side hears nothing.
        if not self.cut:
            writer.close()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.parametrize("service", ["lease_rescuer", "partitions"])
async def test_a_holder_cut_off_by_the_network_is_ended_within_the_bound(
    db_url: str, conn: db.Conn, service: str
) -> None:
    # The rescuer's transaction-scoped lock (idle in transaction) and the partition keeper's session-level one
    # (idle outside a transaction), each held by a process whose network to Postgres then goes silent.
    params = conninfo_to_dict(db_url)
    proxy = BlackholeProxy(str(params.get("host") or "localhost"), int(params.get("port") or 5432))
    port = await proxy.start()
    try:
        async with holding(
            service, make_conninfo(db_url, host="127.0.0.1", hostaddr="", port=port)
        ) as holder:
            proxy.cut = True
            elapsed, _ = await reconcile_until_owned(conn, service)
            assert elapsed < BOUND
            assert not await backend_alive(conn, holder.backend_pid)
    finally:
        await proxy.close()


async def test_every_session_carries_the_server_side_bound(conn: db.Conn) -> None:
    assert await scalar(conn, "SELECT current_setting('idle_in_transaction_session_timeout')") == "30s"
    assert db.DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT == 30.0


async def test_a_keeper_gives_its_session_back_without_an_idle_bound(conn: db.Conn) -> None:
    # idle_session_timeout bounds a session only while it holds a keeper's lock: a pooled connection left
    # with it would be ended for sitting idle in the pool, where idling is its job.
    before = await scalar(conn, "SELECT current_setting('idle_session_timeout')")
    result = await Reconciler().run_once(conn)
    assert not result.service_errors and not result.skipped
    assert await scalar(conn, "SELECT current_setting('idle_session_timeout')") == before


async def test_a_session_the_server_ended_is_a_lost_connection(conn: db.Conn, db_url: str) -> None:
    # What a frozen process meets when it resumes: its next statement fails. That must read as the lost
    # connection it is (LedgerUnavailable, error kind "connection": retried by the writes that retry, logged
    # as one line without a traceback), not as a bug in the statement.
    ended = await db.connect(db_url, idle_in_transaction_timeout=0.5)
    pid = ended.info.backend_pid

    async def gone() -> bool:
        return not await backend_alive(conn, pid)

    with pytest.raises(db.LedgerUnavailable) as caught:
        async with db.translate_errors(), ended.transaction():
            await ended.execute("SELECT 1")
            await resumed(gone, "an idle-in-transaction session")
            await ended.execute("SELECT 1")
    assert error_kinds.error_kind(caught.value.__cause__ or caught.value) == "connection"
    await ended.close()


async def test_a_keeper_session_the_server_ended_is_a_lost_connection(conn: db.Conn, db_url: str) -> None:
    ended = await db.connect(db_url, idle_in_transaction_timeout=0.5)
    pid = ended.info.backend_pid

    async def gone() -> bool:
        return not await backend_alive(conn, pid)

    async def frozen_between_commits() -> None:
        await resumed(gone, "an idle session holding a keeper's lock")
        await ended.execute("SELECT 1")

    result = ReconcileResult()
    await Reconciler._service(ended, "partitions", frozen_between_commits, result, session=True)
    assert "partitions" in result.service_errors
    # The maintenance loop logs service_errors as one line each (maintain_forever, on_result): no traceback.
    assert "Traceback" not in result.service_errors["partitions"]
    await ended.close()
