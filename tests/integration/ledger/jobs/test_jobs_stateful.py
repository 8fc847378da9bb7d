"""Random interleavings of lease / heartbeat / clock / reconcile / checkpoint / complete / fail / retry /
hand-back / cancel / redrive against a model of one job, with the invariants checked after every step:
the job is in exactly the state the model says, each lease has a token never held before, a stale token's write is
refused and changes nothing, and a job cancelled while it ran never ends succeeded."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.jobs import heartbeats
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig
from tests.integration.jobs_and_workers import T0, claim

TTL = 10
TERMINAL = {"succeeded", "failed", "cancelled", "parked"}


@dataclass
class Model:
    """What the job must look like, computed by hand from the rules in ``docs/state_machine.md``."""

    policy: str
    threshold: int
    state: str = "pending"
    token: int = 0
    attempt: int = 0
    expires: datetime | None = None
    checkpoint: Any = None
    cancel_requested: bool = False
    committed: bool = False
    releases: int = 0
    tokens: list[int] = field(default_factory=list)

    def holds(self, token: int) -> bool:
        return self.state == "running" and token == self.token

    def release(self, *, orphaned: bool) -> None:
        """A hand-back (``orphaned`` false) or a rescued orphan: the poison rule, then the policy."""
        poison = not self.committed and self.releases + 1 >= self.threshold
        self.releases = 0 if self.committed else self.releases + 1
        self.committed = False
        if self.cancel_requested:
            self.state = "cancelled"
        elif poison:
            self.state = "parked"
        elif orphaned and self.policy == "park":
            self.state = "parked"
        else:
            self.state = "pending"
        self.expires = None


def test_random_interleavings_keep_the_job_invariants(db_url: str) -> None:
    with asyncio.Runner() as runner:
        conn = runner.run(db.connect(db_url))
        try:
            _run_machine(runner, conn)
        finally:
            runner.run(conn.close())


def _run_machine(runner: asyncio.Runner, conn: db.Conn) -> None:
    examples = itertools.count()
    # One clock for the whole run, only ever moving forward: the reconciler sees every example's job,
    # and an earlier example's job must never look younger than it is.
    clock = [T0]

    class JobMachine(RuleBasedStateMachine):
        def run(self, coro: Any) -> Any:
            return runner.run(coro)

        @property
        def now(self) -> datetime:
            return clock[0]

        @initialize(policy=st.sampled_from(["redrive", "park"]), threshold=st.integers(1, 3))
        def claim_job(self, policy: str, threshold: int) -> None:
            # A kind of its own per example, so leases only ever reach this example's job.
            self.kind = f"kind{next(examples)}"
            clock[0] += timedelta(days=1)
            self.job_id = self.run(claim(conn, kind=self.kind, orphan_policy=policy, now=self.now))
            self.model = Model(policy, threshold)
            self.cancelled_while_running = False

        def row(self) -> dict[str, Any]:
            row: dict[str, Any] | None = self.run(jobs.get(conn, self.job_id))
            assert row is not None
            return row

        def stale(self, token: int, write: Any) -> None:
            """A write under a token that no longer holds the lease: refused, and nothing changed."""
            before = self.row()
            with pytest.raises(LeaseLost):
                self.run(write)
            assert self.row() == before

        @rule()
        def lease(self) -> None:
            leases = self.run(
                jobs.fetch_and_lease(conn, owner="w", kinds={self.kind: TTL}, limit=1, now=self.now)
            )
            m = self.model
            if m.state != "pending":
                assert leases == []
                return
            [lease] = leases
            # Random, not the last one + 1 (a failover that lost WAL could reissue a counter's next value).
            assert lease.lease_token not in m.tokens and lease.lease_token != m.token
            m.state, m.token, m.attempt = "running", lease.lease_token, m.attempt + 1
            m.expires = self.now + timedelta(seconds=TTL)
            m.tokens.append(m.token)
            assert (lease.lease_token, lease.attempt, lease.checkpoint) == (m.token, m.attempt, m.checkpoint)

        @rule(seconds=st.integers(min_value=0, max_value=2 * TTL))
        def advance_clock(self, seconds: int) -> None:
            clock[0] += timedelta(seconds=seconds)

        @precondition(lambda self: self.model.expires is not None)
        @rule()
        def expire(self) -> None:
            assert self.model.expires is not None
            clock[0] = max(clock[0], self.model.expires + timedelta(seconds=1))

        @rule()
        def reconcile(self) -> None:
            result = self.run(
                Reconciler(ReconcilerConfig(poison_threshold=self.model.threshold)).run_once(
                    conn, now=self.now
                )
            )
            m = self.model
            repaired = {*result.redriven, *result.parked, *result.cancelled}
            if m.state == "running" and m.expires is not None and m.expires < self.now:
                m.release(orphaned=True)
                assert self.job_id in repaired
            else:
                assert self.job_id not in repaired

        @precondition(lambda self: self.model.tokens)
        @rule(data=st.data())
        def heartbeat(self, data: st.DataObject) -> None:
            token = data.draw(st.sampled_from(self.model.tokens))
            write = heartbeats.extend_lease(conn, self.job_id, token, ttl=TTL, now=self.now)
            if not self.model.holds(token):
                return self.stale(token, write)
            assert self.run(write) == self.model.cancel_requested
            self.model.expires = self.now + timedelta(seconds=TTL)

        @precondition(lambda self: self.model.tokens)
        @rule(data=st.data(), value=st.integers(0, 1000))
        def checkpoint(self, data: st.DataObject, value: int) -> None:
            token = data.draw(st.sampled_from(self.model.tokens))
            write = jobs.save_checkpoint(conn, self.job_id, token, {"v": value}, now=self.now)
            if not self.model.holds(token):
                return self.stale(token, write)
            self.run(write)
            self.model.checkpoint, self.model.committed = {"v": value}, True

        @precondition(lambda self: self.model.tokens)
        @rule(data=st.data(), ending=st.sampled_from(["succeeded", "failed"]))
        def finish(self, data: st.DataObject, ending: str) -> None:
            token = data.draw(st.sampled_from(self.model.tokens))
            state: Any = ending
            write = jobs.finish(conn, self.job_id, token, state=state, by="w", now=self.now)
            if not self.model.holds(token):
                return self.stale(token, write)
            reached = self.run(write)
            self.model.state = "cancelled" if self.model.cancel_requested else ending
            self.model.expires = None
            assert reached.state == self.model.state

        @precondition(lambda self: self.model.tokens)
        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            token = data.draw(st.sampled_from(self.model.tokens))
            write = jobs.retry(conn, self.job_id, token, delay=0, error={"type": "X"}, now=self.now)
            if not self.model.holds(token):
                return self.stale(token, write)
            self.run(write)
            self.model.state = "cancelled" if self.model.cancel_requested else "pending"
            self.model.expires = None

        @precondition(lambda self: self.model.tokens)
        @rule(data=st.data())
        def hand_back(self, data: st.DataObject) -> None:
            token = data.draw(st.sampled_from(self.model.tokens))
            write = jobs.hand_back(
                conn, self.job_id, token, poison_threshold=self.model.threshold, by="w", now=self.now
            )
            if not self.model.holds(token):
                return self.stale(token, write)
            self.run(write)
            self.model.attempt -= 1
            self.model.release(orphaned=False)

        # Cancelling a pending job is immediate and final (tested on its own); only cancels that race a
        # running lease are drawn here, so examples do not end at their first step.
        @precondition(lambda self: self.model.state != "pending")
        @rule()
        def cancel(self) -> None:
            result = self.run(jobs.cancel(conn, self.job_id, by="op", now=self.now))
            m = self.model
            if m.state == "pending":
                assert result == "cancelled"
                m.state, m.cancel_requested = "cancelled", True
            elif m.state == "running":
                assert result == "running"
                m.cancel_requested = True
                self.cancelled_while_running = True
            else:
                assert isinstance(result, jobs.Refused) and result.code == "not_cancellable"

        @rule()
        def redrive(self) -> None:
            result = self.run(jobs.redrive(conn, self.job_id, by="test", now=self.now))
            m = self.model
            if m.state in ("failed", "parked"):
                assert result is None
                m.state, m.attempt, m.cancel_requested, m.committed, m.releases = (
                    "pending",
                    0,
                    False,
                    False,
                    0,
                )
            else:
                assert isinstance(result, jobs.Refused) and result.code == "not_redrivable"

        @invariant()
        def matches_the_model(self) -> None:
            row, m = self.row(), self.model
            assert (row["state"], row["lease_token"], row["attempt"], row["checkpoint"]) == (
                m.state,
                m.token,
                m.attempt,
                m.checkpoint,
            )
            assert (row["cancel_requested"], row["releases_without_commit"]) == (
                m.cancel_requested,
                m.releases,
            )
            assert row["lease_expires_at"] == (m.expires if m.state == "running" else None)
            # Exactly one of: live, or terminal with its time and reason of ending.
            assert (row["finished_at"] is not None) == (row["state"] in TERMINAL)

        @invariant()
        def the_token_is_the_last_one_handed_out(self) -> None:
            assert self.row()["lease_token"] == self.model.token

        @invariant()
        def a_job_cancelled_while_running_never_succeeds(self) -> None:
            if self.cancelled_while_running:
                assert self.row()["state"] != "succeeded"

    run_state_machine_as_test(
        JobMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=20,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
