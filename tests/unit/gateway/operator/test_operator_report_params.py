"""The report parameter parsers and the payload diff, without a database."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from effectgate.gateway.operator import params
from effectgate.gateway.operator.params import BadParameter
from effectgate.ledger import reports
from effectgate.ledger.jobs import filters
from effectgate.ledger.payload_diffs import MAX_DIFF_ENTRIES, payload_diff
from effectgate.ledger.queries import SQL_DIR, parse
from effectgate.ledger.reports import views

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", NOW - timedelta(hours=24)),
        ("30m", NOW - timedelta(minutes=30)),
        ("90s", NOW - timedelta(seconds=90)),
        ("7d", NOW - timedelta(days=7)),
        ("2w", NOW - timedelta(weeks=2)),
        (" 1h ", NOW - timedelta(hours=1)),
        ("2025-03-01", datetime(2025, 3, 1, tzinfo=UTC)),
        ("2025-03-01T10:30:00Z", datetime(2025, 3, 1, 10, 30, tzinfo=UTC)),
        ("2025-03-01T10:30:00+02:00", datetime(2025, 3, 1, 8, 30, tzinfo=UTC)),
    ],
)
def test_times_are_durations_back_from_now_or_iso_8601(text: str, expected: datetime) -> None:
    assert params.parse_time(text, "since", now=NOW) == expected


def test_a_time_without_a_zone_is_utc() -> None:
    assert params.parse_time("2025-01-01T00:00", "since", now=NOW) == datetime(2025, 1, 1, tzinfo=UTC)
    aware = datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=3)))
    assert params.parse_time(aware.isoformat(), "since", now=NOW) == aware


@pytest.mark.parametrize(
    "text", ["", "  ", "24", "h", "1.5h", "24 h", "-1h", "1y", "tomorrow", "٣h", "9999999d"]
)
def test_bad_times_name_the_parameter(text: str) -> None:
    with pytest.raises(BadParameter) as info:
        params.parse_time(text, "until", now=NOW)
    assert (info.value.code, info.value.parameter) == ("invalid_until", "until")


def test_limits_are_whole_numbers_up_to_the_cap() -> None:
    assert params.parse_limit(None, reports.DEFAULT_LIMIT) == reports.DEFAULT_LIMIT
    assert params.parse_limit("7", 100) == 7
    assert params.parse_limit(str(reports.MAX_LIMIT), 100) == reports.MAX_LIMIT
    for bad in [0, str(reports.MAX_LIMIT + 1), "0", "1e3", "٣", "", " ", 2.0, False]:
        with pytest.raises(BadParameter, match="limit"):
            params.parse_limit(bad, 100)  # type: ignore[arg-type]


def test_states_are_validated_and_deduplicated() -> None:
    assert params.parse_states("parked,failed,parked") == ("failed", "parked")
    assert params.parse_states(None) is None
    for bad in ["", "done", "failed,,parked", ["failed", 3]]:
        with pytest.raises(BadParameter) as info:
            params.parse_states(bad)  # type: ignore[arg-type]
        assert info.value.code == "invalid_state"


def test_the_diff_walks_objects_and_arrays_with_json_pointers() -> None:
    held = {"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "e/f": 1, "g~h": 1, "gone": None}
    rejected = {"a": 1, "b": {"c": [1, 5], "d": "x"}, "e/f": 2, "g~h": True, "new": {"k": 1}}
    entries, truncated = payload_diff(held, rejected)
    assert truncated is False
    assert entries == [
        {"path": "/b/c/1", "change": "changed", "held": 2, "rejected": 5},
        {"path": "/b/c/2", "change": "removed", "held": 3},
        {"path": "/e~1f", "change": "changed", "held": 1, "rejected": 2},
        {"path": "/gone", "change": "removed", "held": None},
        # 1 and true are equal to Python, not to JSON.
        {"path": "/g~0h", "change": "changed", "held": 1, "rejected": True},
        {"path": "/new", "change": "added", "rejected": {"k": 1}},
    ]


def test_the_diff_of_equal_payloads_is_empty_and_of_different_types_is_the_root() -> None:
    assert payload_diff({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) == ([], False)
    assert payload_diff([1], {"a": 1}) == (
        [{"path": "", "change": "changed", "held": [1], "rejected": {"a": 1}}],
        False,
    )


def test_a_long_diff_is_cut_and_says_so() -> None:
    held = {f"k{i:04}": i for i in range(500)}
    rejected = {f"k{i:04}": -i - 1 for i in range(500)}
    entries, truncated = payload_diff(held, rejected)
    assert truncated is True
    assert len(entries) == MAX_DIFF_ENTRIES
    entries, truncated = payload_diff(list(range(300)), [])
    assert truncated is True and len(entries) == MAX_DIFF_ENTRIES


def test_every_report_query_is_used_by_the_reports() -> None:
    names = parse((SQL_DIR / "reports.sql").read_text(encoding="utf-8"))
    source = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (reports, views))
    used = set(re.findall(r'"((?:report|effect|metrics)_[a-z0-9_]+)"', source))
    assert set(names) - used == set(), "queries in reports.sql that no report or view runs"


# --- the bulk job filter: one parser for the API's query, the dashboard's form and the CLI's flags ---


def test_the_bulk_filter_reads_every_parameter_the_same_way_for_every_face() -> None:
    where = params.parse_job_filter(
        {"state": "parked,failed", "kind": "ship", "source": "stripe", "since": "2h", "limit": "50"}, now=NOW
    )
    assert where == filters.JobFilter(
        states=("failed", "parked"), kind="ship", source="stripe", since=NOW - timedelta(hours=2), limit=50
    )


def test_blank_form_fields_count_as_absent_and_an_empty_filter_is_refused_by_code() -> None:
    with pytest.raises(params.BadParameter) as refused:
        params.parse_job_filter({"state": "", "kind": "", "source": None, "since": "", "limit": ""}, now=NOW)
    assert refused.value.code == "filter_required"
    assert params.parse_job_filter({"kind": "ship", "limit": ""}, now=NOW).limit == filters.DEFAULT_LIMIT


@pytest.mark.parametrize("limit", ["0", "100001", "-1", "ten", "1e3"])
def test_a_bulk_limit_outside_one_to_a_hundred_thousand_is_refused(limit: str) -> None:
    with pytest.raises(params.BadParameter) as refused:
        params.parse_job_filter({"kind": "ship", "limit": limit}, now=NOW)
    assert refused.value.code == "invalid_limit"


def test_the_bulk_filter_is_built_in_one_place() -> None:
    """The API, the dashboard and the CLI once each parsed the filter, and the copies differed (the
    dashboard ignored ``limit``); now only ``parse_job_filter`` builds a ``JobFilter`` from text."""
    root = Path(__file__).resolve().parents[4] / "gateway"
    builders = [
        str(path.relative_to(root.parent))
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "JobFilter"
    ]
    assert builders == ["gateway/operator/params.py"]
