"""Tests wait for events, not time: no test synchronises with a sleep.

A test that sleeps "long enough" for something to happen passes on a quiet machine and fails on a loaded
one. So every ``time.sleep`` / ``asyncio.sleep`` / ``anyio.sleep`` under ``tests/`` (the benchmarks aside)
must be one of:

- the poll interval of a ``while`` loop, which waits for a condition up to a deadline;
- ``sleep(0)``, a yield to the event loop that waits for no time at all;
- listed in ``ALLOWED`` below, with the reason the passing of time is itself what the code under test
  measures.

Anything else fails here, naming the file, line and function: wait on an ``asyncio.Event``, a barrier, a
file or row the other side writes, or move the clock (the ledger takes ``now``). The scan reads the source
with ``ast``; scripts embedded in strings (subprocess bodies) are not seen.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
SLEEPING_MODULES = frozenset({"time", "asyncio", "anyio", "trio"})

# (file under tests/, enclosing function as outer.inner) -> why time passing is what is tested there.
ALLOWED: dict[tuple[str, str], str] = {
    (
        "integration/ledger/test_shared_pace.py",
        "test_a_429_while_a_call_waits_for_its_turn_voids_that_turn.sleep",
    ): "the pace's own wait for a reserved turn, which signals when it starts: the turn's wait in time is what is tested",
    (
        "e2e/test_penalty_box_turns.py",
        "test_a_genuine_delivery_from_a_boxed_address_is_served_while_the_flood_costs_one_request_a_turn",
    ): "the flood's answers are bounded by its duration (one per 10 ms turn); the flood running for a while is the test",
    (
        "integration/handlers/worker/test_worker_refill.py",
        "test_a_finished_job_whose_slot_a_refill_offered_does_not_wake_another_fetch",
    ): "asserts that no second fetch follows a finish: a stretch in which nothing may happen is what is tested",
    (
        "integration/handlers/worker/test_worker_pools.py",
        "test_more_slots_than_handler_connections_run_every_job_each_step_once.two_steps.call",
    ): "a downstream call that takes time, so that slots overlap their writes and queue for the handlers' pool: the overlap is what is tested",
    (
        "citus/rebalance_run.py",
        "main",
    ): "a measurement script: claims flow for a stretch of time before and after the rebalance; the stretch is the run",
    (
        "citus/chaos_run.py",
        "send_all",
    ): "a chaos script: deliveries are spread over a stretch of time so that kills and the node outage land among them",
    (
        "citus/chaos_run.py",
        "stop_node",
    ): "the Citus worker node stays stopped for a stretch of time; the outage's length is the run",
    (
        "citus/chaos_run.py",
        "main",
    ): "the chaos schedule: SIGKILLs and the node stop land at chosen moments of the run",
    (
        "citus/chaos_handlers.py",
        "charge.capture",
    ): "holds a step open between the capture and its record, so a SIGKILL lands in that window",
    (
        "e2e/test_chaos.py",
        "test_orders_survive_faults_duplicates_and_killed_workers",
    ): "chaos: SIGKILLs land at random moments between deliveries; the random moment is the test",
    (
        "e2e/test_chaos.py",
        "test_declared_effects_act_once_per_key_through_faults_duplicates_and_killed_workers",
    ): "chaos with declared effects: the same random kill moments",
    (
        "integration/handlers/worker/test_worker_runtime.py",
        "test_stop_drains_slices_that_yield_and_leaves_the_rest_to_lease_expiry.polite",
    ): "units of handler work between should_yield() checks; the drain is what ends them",
    (
        "integration/handlers/worker/test_worker_runtime.py",
        "test_stop_drains_slices_that_yield_and_leaves_the_rest_to_lease_expiry.deaf",
    ): "units of handler work that never ask to yield; the drain timeout is what cancels them",
}


@dataclass(frozen=True)
class Sleep:
    path: str
    line: int
    function: str
    source: str


def _is_sleep(node: ast.AST, sleep_names: set[str]) -> bool:
    """``time.sleep`` and friends, called or passed on (``asyncio.to_thread(time.sleep, 1)``)."""
    if isinstance(node, ast.Attribute) and node.attr == "sleep":
        return isinstance(node.value, ast.Name) and node.value.id in SLEEPING_MODULES
    return isinstance(node, ast.Name) and node.id in sleep_names


def _yields_only(call: ast.Call) -> bool:
    """``sleep(0)``: a turn of the event loop, no time."""
    return (
        len(call.args) == 1
        and not call.keywords
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == 0
    )


def sleeps_in(source: str, path: str) -> list[Sleep]:
    """Every sleep in ``source`` that is neither a while loop's poll interval nor ``sleep(0)``."""
    tree = ast.parse(source)
    # ``from time import sleep`` (or ``as nap``) makes a bare name a sleep too.
    sleep_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in SLEEPING_MODULES
        for alias in node.names
        if alias.name == "sleep"
    }
    found: list[Sleep] = []

    def visit(node: ast.AST, function: str, in_while: bool, parent: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            name = node.name if not isinstance(node, ast.Lambda) else "<lambda>"
            # A loop around a function's definition is not a loop around its body.
            function, in_while = (f"{function}.{name}" if function else name), False
        elif isinstance(node, ast.While):
            in_while = True
        if _is_sleep(node, sleep_names) and not in_while:
            called = isinstance(parent, ast.Call) and parent.func is node
            if not (called and isinstance(parent, ast.Call) and _yields_only(parent)):
                shown = ast.unparse(parent if called and parent is not None else node)
                found.append(Sleep(path, getattr(node, "lineno", 0), function, shown))
        for child in ast.iter_child_nodes(node):
            visit(child, function, in_while, node)

    visit(tree, "", False, None)
    return found


def scanned_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "bench" not in p.relative_to(TESTS).parts)


def test_no_test_synchronises_with_a_sleep() -> None:
    offending = []
    for file in scanned_files():
        rel = file.relative_to(TESTS).as_posix()
        for sleep in sleeps_in(file.read_text(encoding="utf-8"), rel):
            if (sleep.path, sleep.function) not in ALLOWED:
                offending.append(
                    f"tests/{sleep.path}:{sleep.line} in {sleep.function or '<module>'}: {sleep.source}"
                )
    assert offending == [], (
        "a sleep outside a polling loop: wait on an event, a barrier or a polled condition with a deadline,"
        " or move the clock (or list it in ALLOWED with the reason time passing is what is tested):\n"
        + "\n".join(offending)
    )


def test_every_allowance_is_still_used() -> None:
    used = {
        (sleep.path, sleep.function)
        for file in scanned_files()
        for sleep in sleeps_in(file.read_text(encoding="utf-8"), file.relative_to(TESTS).as_posix())
    }
    assert set(ALLOWED) - used == set()


def test_the_scan_tells_a_wait_by_the_clock_from_a_poll() -> None:
    source = """
import asyncio, time
from time import sleep as nap

async def race(start):
    await asyncio.sleep(0.05)          # waiting "long enough": flagged
    start.set()
    await asyncio.sleep(0)             # a turn of the loop: fine

def poll(ready, deadline):
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError
        time.sleep(0.05)               # the poll interval: fine

    def nested():
        nap(1)                         # a loop outside the definition does not count: flagged

async def thread():
    await asyncio.to_thread(time.sleep, 1.0)   # passed on, still a sleep: flagged
"""
    found = [(s.line, s.function) for s in sleeps_in(source, "x.py")]
    assert found == [(6, "race"), (17, "poll.nested"), (20, "thread")]
