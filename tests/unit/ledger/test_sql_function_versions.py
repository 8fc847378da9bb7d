"""Running code calls only versioned SQL functions (docs/adr/0017-versioned-sql-functions.md).

During a rolling upgrade two releases share one schema, so a function that running code calls is never changed
in place: its behaviour is frozen under a name ending ``_vN`` and a change is a new N. This reads the migrations
(which functions the project defines, and drops) and every named block of ledger/sql (which of them are called),
from the files alone; tests/integration/ledger/test_sql_function_versions.py checks the same calls against a migrated
database, so a function created some other way cannot slip past.
"""

from __future__ import annotations

import re
from pathlib import Path

from effectgate.ledger.queries import load
from tests.unit.ledger.sql_functions import (
    VERSIONED,
    called_names,
    creations,
    defined_functions,
    project_calls,
)

ROOT = Path(__file__).parents[3]


def test_the_parser_sees_what_the_migrations_define_and_what_ledger_sql_calls() -> None:
    # Not vacuous: the functions of 0006, 0008 and 0017 are found, and the calls this release makes.
    ever, live = defined_functions()
    assert {"job_release_verdict", "job_release_verdict_v1", "history_partition_drop_v1"} <= ever
    assert {"job_release_count_v1", "history_partition_create_v1"} <= live
    assert set(project_calls()) == {
        "job_release_verdict_v1",
        "job_release_count_v1",
        "history_partition_create_v2",
        "history_partition_drop_v2",
        "effect_claim_tenant_v1",
        "job_attempt_outcome_v1",
    }
    assert called_names("SELECT f_v1(x), 'g(' FROM t") == {"f_v1"}


def test_every_function_ledger_sql_calls_is_versioned_and_still_defined() -> None:
    _, live = defined_functions()
    unversioned = {
        name: sorted(blocks) for name, blocks in project_calls().items() if not VERSIONED.search(name)
    }
    assert unversioned == {}, "ledger/sql calls unversioned functions; call (or create) their _vN names"
    dropped = {name: sorted(blocks) for name, blocks in project_calls().items() if name not in live}
    assert dropped == {}, "ledger/sql calls functions a migration dropped"


def test_no_python_module_calls_a_project_function_outside_ledger_sql() -> None:
    # Python reaches SQL through the named blocks of ledger/sql only; a project function named in a string of
    # Python code would escape the check above.
    ever, _ = defined_functions()
    pattern = re.compile(r"\b(" + "|".join(sorted(ever)) + r")\s*\(")
    found = {
        str(path.relative_to(ROOT)): pattern.findall(path.read_text(encoding="utf-8"))
        for folder in ("ledger", "gateway", "handlers")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_a_versioned_function_is_created_once_and_never_replaced() -> None:
    # A process of the release that calls f_v1 may run while the next release migrates: f_v1's behaviour is
    # frozen; a change is f_v2 in a new migration (CREATE OR REPLACE of f_v1 would change running code).
    twice = {name: files for name, files in creations().items() if VERSIONED.search(name) and len(files) > 1}
    assert twice == {}
    assert creations()["job_release_verdict_v1"] == ["0017_versioned_sql_functions.sql"]


def test_the_attempt_outcome_rule_is_only_called_never_spelled_out_again() -> None:
    # Issue 52: the job state -> attempt outcome CASE was written in each statement that closes an attempt. Every
    # block that reads an attempt's outcome off the job's state calls the one function (migration 0028); a block
    # that spells a state's outcome out again ("WHEN done.state = 'parked' THEN 'parked'") fails here.
    assert project_calls()["job_attempt_outcome_v1"] == {
        "job_finish_if_leased",
        "job_retry_if_leased",
        "job_hand_back_if_leased",
    }
    spelled = re.compile(r"\bWHEN\s+[\w.]*state\s*=\s*'(\w+)'\s+THEN\s+'\1'", re.IGNORECASE)
    assert {block for block, sql in load().items() if spelled.search(sql)} == set()
