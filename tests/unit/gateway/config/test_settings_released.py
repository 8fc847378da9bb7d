"""A released configuration key does not disappear without a CHANGELOG line naming it.

``tests/data/settings_released.txt`` holds the paths of ``gateway/config/settings.py`` ``SETTINGS`` as of the
release its first line names. Every one of them that the declaration no longer has must be named, in
backticks, in the CHANGELOG section of a later release (or ``## Unreleased``): its full dotted path
(``gateway.penalty_box.replays``, or ``sources.NAME.on_refusal`` for ``sources.*.on_refusal``) or its last
component (``replays``). An operator upgrading then learns that a key of theirs is gone.

At a release, after the CHANGELOG's section is written and the version bumped, refresh the baseline with
``python -m tests.unit.gateway.config.test_settings_released --write`` (docs/development.md, "Releasing").
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

from effectgate.gateway.config.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[4]
BASELINE = ROOT / "tests" / "data" / "settings_released.txt"
CHANGELOG = ROOT / "CHANGELOG.md"

_RELEASE_LINE = re.compile(r"# effectgate (\S+):")


def read_baseline(text: str) -> tuple[str, list[str]]:
    """The release the baseline was taken at, and its keys (comments and blank lines skipped)."""
    first = text.splitlines()[0] if text else ""
    found = _RELEASE_LINE.match(first)
    if found is None:
        raise ValueError(f"the baseline's first line must be '# effectgate VERSION: …', got {first!r}")
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return found[1], keys


def later_sections(changelog: str, release: str) -> str:
    """The text of every CHANGELOG section above ``## release`` (the releases after it, and Unreleased)."""
    heading = re.search(rf"^## {re.escape(release)}$", changelog, re.MULTILINE)
    if heading is None:
        raise ValueError(f"CHANGELOG.md has no '## {release}' section, the baseline's release")
    first = re.search(r"^## ", changelog, re.MULTILINE)
    assert first is not None  # the heading above is one
    return changelog[first.start() : heading.start()]


def spellings(path: str) -> set[str]:
    """How a CHANGELOG line may name ``path``: in full (``*`` as written or as ``NAME``, ``[]`` dropped)
    or by its last component."""
    full = path.replace("[]", "")
    return {full, full.replace("*", "NAME"), path.rpartition(".")[2]}


def named(path: str, text: str) -> bool:
    return any(f"`{spelling}`" in text for spelling in spellings(path))


def undocumented_removals(
    release: str, baseline: Iterable[str], declared: Iterable[str], changelog: str
) -> list[str]:
    """The keys of ``baseline`` missing from ``declared`` that no CHANGELOG section after ``release`` names."""
    after = later_sections(changelog, release)
    present = set(declared)
    return [path for path in baseline if path not in present and not named(path, after)]


def baseline_text(release: str) -> str:
    lines = [
        f"# effectgate {release}: the keys of effectgate.toml as released (gateway/config/settings.py SETTINGS).",
        "# Written by `python -m tests.unit.gateway.config.test_settings_released --write` at the release; do not edit.",
        *(s.path for s in SETTINGS),
    ]
    return "\n".join(lines) + "\n"


def test_a_released_key_that_is_gone_is_named_in_a_later_release() -> None:
    release, keys = read_baseline(BASELINE.read_text())
    missing = undocumented_removals(release, keys, (s.path for s in SETTINGS), CHANGELOG.read_text())
    assert not missing, (
        f"keys of effectgate {release} no longer declared in gateway/config/settings.py and named in no later "
        f"CHANGELOG section (in backticks, full path or last component): {missing}"
    )


def test_the_baseline_is_of_a_release_and_lists_each_key_once() -> None:
    release, keys = read_baseline(BASELINE.read_text())
    later_sections(CHANGELOG.read_text(), release)  # raises when the release has no section
    assert len(keys) == len(set(keys)), "a key listed twice"


CHANGELOG_SAMPLE = """# Changelog

## Unreleased

- Something else entirely (`tolerance` stays).

## 0.3.0

- `[gateway] old_knob` is gone; `sources.NAME.legacy_mode` too.

## 0.2.0

- Added `gateway.penalty_box.replays`.
"""


@pytest.mark.parametrize(
    ("removed", "changelog", "flagged"),
    [
        # Removed after 0.3.0 and named nowhere: caught.
        ("gateway.penalty_box.replays", CHANGELOG_SAMPLE, ["gateway.penalty_box.replays"]),
        # Named by its last component in a later section.
        ("gateway.penalty_box.replays", CHANGELOG_SAMPLE.replace("`tolerance`", "`replays`"), []),
        # Named by its full path, the wildcard written as NAME.
        ("sources.*.scheme", CHANGELOG_SAMPLE.replace("`tolerance`", "`sources.NAME.scheme`"), []),
        # Named only in the baseline's own release or an older one: that is not news of its removal.
        ("sources.*.legacy_mode", CHANGELOG_SAMPLE, ["sources.*.legacy_mode"]),
        # Named without backticks: prose that happens to hold the word does not count.
        ("gateway.host", CHANGELOG_SAMPLE.replace("(`tolerance` stays)", "(host stays)"), ["gateway.host"]),
    ],
)
def test_the_check_fails_on_a_made_up_removal(removed: str, changelog: str, flagged: list[str]) -> None:
    baseline = ["gateway.host", "gateway.penalty_box.replays", "sources.*.scheme", "sources.*.legacy_mode"]
    declared = [k for k in baseline if k != removed]
    assert undocumented_removals("0.3.0", baseline, declared, changelog) == flagged


def test_the_real_check_catches_a_key_dropped_from_the_declaration() -> None:
    release, keys = read_baseline(BASELINE.read_text())
    dropped = keys[0]
    declared = [s.path for s in SETTINGS if s.path != dropped]
    changelog = CHANGELOG.read_text()
    assert dropped not in undocumented_removals(release, keys, [s.path for s in SETTINGS], changelog)
    # Every spelling taken out of the later sections, so only the removal itself decides.
    scrubbed = changelog
    for spelling in spellings(dropped):
        scrubbed = scrubbed.replace(f"`{spelling}`", spelling)
    assert undocumented_removals(release, keys, declared, scrubbed) == [dropped]


def test_a_baseline_without_its_release_is_refused() -> None:
    with pytest.raises(ValueError, match="first line"):
        read_baseline("gateway.host\n")
    with pytest.raises(ValueError, match=r"no '## 9\.9\.9' section"):
        later_sections(CHANGELOG_SAMPLE, "9.9.9")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.unit.gateway.config.test_settings_released --write")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    BASELINE.write_text(baseline_text(version))
    print(f"{BASELINE.relative_to(ROOT)}: {len(SETTINGS)} keys of effectgate {version}")
