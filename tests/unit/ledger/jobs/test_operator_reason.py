"""An operator's reason (ledger/jobs/audit.py ``check_note``, and ``resolutions.check_reason`` where one is
required): printable text of at most 500 characters, stripped, checked in that one function (issue 52)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effectgate.ledger.errors import InvalidParameter
from effectgate.ledger.jobs import audit, resolutions

ROOT = Path(__file__).parents[4]


@pytest.mark.parametrize("reason", ["a\x00b", "line\nbreak", "tab\there", "x" * 501])
def test_a_reason_that_is_not_printable_or_too_long_is_refused_by_both(reason: str) -> None:
    for check in (audit.check_note, resolutions.check_reason):
        with pytest.raises(InvalidParameter) as refused:
            check(reason)
        assert (refused.value.code, refused.value.detail) == (
            "invalid_reason",
            "expected printable text of at most 500 characters",
        )


def test_an_empty_reason_is_none_where_optional_and_refused_where_required() -> None:
    assert audit.check_note(None) is None and audit.check_note("   ") is None
    with pytest.raises(InvalidParameter, match="a reason is required to resolve a job by hand"):
        resolutions.check_reason("   ")
    longest = " " + "x" * audit.MAX_REASON_LENGTH + " "
    assert audit.check_note(longest) == resolutions.check_reason(longest) == longest.strip()


def test_the_reason_rule_is_written_once() -> None:
    # Issue 52: the rule was written in resolutions.py, audit.py and three times in gateway/operator/api.py, with a
    # constant of 500 in each. Any other module that tests printability against a length of a reason, or names
    # a 500-character limit for one, writes the rule again: it calls audit.check_note instead.
    again = re.compile(
        r"isprintable\(\)[^\n]*(?:REASON|NOTE)|(?:REASON|NOTE)\w*\s*=\s*500|printable text of at most"
    )
    found = sorted(
        str(path.relative_to(ROOT))
        for folder in ("ledger", "gateway", "handlers")
        for path in (ROOT / folder).rglob("*.py")
        if again.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["ledger/jobs/audit.py"]
