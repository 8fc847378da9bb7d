"""What a drain costs: CPU per job of the consumer and of its Postgres backends, statements per job, and optionally
a py-spy profile of the consumer, for ``tests.bench.worker_vs_pgqueuer --cost``.

CPU is read from /proc (user + system seconds), so Postgres must run on this host. The backends are the
database's client backends but the bench's own connections; Postgres's shared processes (WAL writer,
checkpointer) are not counted, for either queue. Statements per job (BEGIN and COMMIT among them), and the most
frequent ones with their planning and execution time per job, come from ``pg_stat_statements`` when the server
preloads it (``shared_preload_libraries``), else they are not given. (Not ``pg_stat_database``'s commits: a
backend flushes those up to 10 s after it goes idle.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from .backlog import BENCH_APPLICATION
from .ingress_cost import cpu_seconds

RECORD = ("py-spy", "record", "--rate", "200", "--format", "raw")
BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
    f" AND application_name <> '{BENCH_APPLICATION}'"
)
# Every statement of this database but the bench's own: its reads of these counters and its polls, whose text
# carries /* bench */ (pg_stat_statements is per server: a query of another database is not this drain's).
STATEMENTS = r"""
SELECT s.queryid, left(regexp_replace(s.query, '\s+', ' ', 'g'), 70) AS query, s.calls,
       s.total_exec_time + s.total_plan_time AS ms
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query NOT LIKE '%pg_stat_%' AND s.query NOT LIKE '%/* bench */%'
"""
# How many statements a drain's line names, the most frequent first.
TOP_STATEMENTS = 6


@dataclass(frozen=True)
class Cost:
    """Per job: the consumer's and its backends' CPU in µs, and statements (None: not counted), with the most
    frequent statements' texts and calls per job."""

    consumer_us: float
    postgres_us: float
    statements: float | None
    top: tuple[tuple[str, float, float], ...] = ()

    def line(self) -> str:
        statements = "n/a" if self.statements is None else f"{self.statements:.3f}"
        return (
            f"CPU per job {self.consumer_us:.0f} µs consumer + {self.postgres_us:.0f} µs Postgres, "
            f"{statements} statements per job"
        )

    def breakdown(self) -> list[str]:
        return [f"    {calls:.4f}/job {us:6.1f} µs/job  {query}" for query, calls, us in self.top]


class Meter:
    """Counters read when a drain starts (``start``) and when it ended (``stop``), on one connection of its own."""

    def __init__(self, url: str, consumer: int | None, spy: Path | None = None) -> None:
        # consumer: the consumer's pid, or None for this process (PgQueuer runs in the bench's own).
        self.conn = psycopg.connect(url, autocommit=True, application_name=BENCH_APPLICATION)
        self.consumer = consumer
        self.spy = spy
        self._spying: subprocess.Popen[bytes] | None = None
        self._statements = self._has_statements()
        self._before: tuple[float, dict[int, float], dict[int, tuple[str, int, float]] | None] | None = None

    def _has_statements(self) -> bool:
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.conn.execute(STATEMENTS).fetchone()
        except psycopg.Error:
            return False
        return True

    def _consumer_cpu(self) -> float:
        if self.consumer is not None:
            return cpu_seconds(self.consumer)
        times = os.times()
        return times.user + times.system

    def _backends(self) -> dict[int, float]:
        return {pid: cpu_seconds(pid) for (pid,) in self.conn.execute(BACKENDS).fetchall()}

    def _statements_now(self) -> dict[int, tuple[str, int, float]] | None:
        if not self._statements:
            return None
        rows = self.conn.execute(STATEMENTS).fetchall()
        return {queryid: (query, calls, ms) for queryid, query, calls, ms in rows}

    def start(self) -> None:
        if self.spy is not None and self.consumer is not None:
            self._spying = subprocess.Popen(
                [*RECORD, "--pid", str(self.consumer), "--output", str(self.spy)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        self._before = (self._consumer_cpu(), self._backends(), self._statements_now())

    def stop(self, jobs: int) -> Cost:
        """The cost per job since ``start``."""
        assert self._before is not None, "start() first"
        consumer_cpu = self._consumer_cpu()
        backends = self._backends()
        statements = self._statements_now()
        if self._spying is not None:
            self._spying.send_signal(signal.SIGINT)  # py-spy writes its profile when interrupted
            self._spying.wait(60)
        was_consumer, was_backends, was_statements = self._before
        # A backend opened during the drain counts from 0; one that closed during it is lost (pools keep theirs).
        postgres = sum(cpu - was_backends.get(pid, 0.0) for pid, cpu in backends.items())
        self.conn.close()
        calls: dict[str, float] = {}
        micros: dict[str, float] = {}
        if statements is not None and was_statements is not None:
            for queryid, (query, n, ms) in statements.items():
                _, was_n, was_ms = was_statements.get(queryid, ("", 0, 0.0))
                calls[query] = calls.get(query, 0) + (n - was_n) / jobs
                micros[query] = micros.get(query, 0) + 1000 * (ms - was_ms) / jobs
        top = sorted(((q, c, micros[q]) for q, c in calls.items() if c > 0), key=lambda qc: -qc[1])
        top = top[:TOP_STATEMENTS]
        return Cost(
            consumer_us=1e6 * (consumer_cpu - was_consumer) / jobs,
            postgres_us=1e6 * postgres / jobs,
            statements=sum(calls.values()) if statements is not None else None,
            top=tuple(top),
        )
