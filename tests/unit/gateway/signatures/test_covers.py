"""What each scheme's signature covers: the data the gateway acts on, and the table in docs/providers.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.gateway.signatures import SCHEMES, Covers, build_scheme

DOCS = Path(__file__).parents[4] / "docs" / "providers.md"
COLUMNS = ("body", "timestamp", "id", "type", "url")


def documented() -> dict[str, list[str]]:
    text = DOCS.read_text()
    section = text.split("## What each signature covers", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 7 and cells[0] != "`scheme`":
            rows[cells[0].strip("`")] = cells[1:6]
    return rows


def test_every_scheme_has_a_row_and_the_fixed_ones_match_their_covers() -> None:
    rows = documented()
    assert set(rows) == set(SCHEMES)
    for name, cells in rows.items():
        if name == "hmac":
            continue  # its coverage depends on its options: below
        covers = SCHEMES[name].covers
        for column, cell in zip(COLUMNS, cells, strict=True):
            said = cell.startswith("yes")
            assert cell.startswith(("yes", "no", "**no", "**only")), (name, column, cell)
            assert said == getattr(covers, column), (name, column, cell)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, Covers(body=True, timestamp=False, id=True, type=True)),
        ({"timestamp_header": "X-T"}, Covers(body=True, timestamp=True, id=True, type=True)),
        ({"id_header": "X-Id"}, Covers(body=True, timestamp=False, id=False, type=True)),
        ({"type_header": "X-Type"}, Covers(body=True, timestamp=False, id=True, type=False)),
    ],
)
def test_generic_hmac_covers_what_its_options_sign(options: dict[str, str], expected: Covers) -> None:
    scheme = build_scheme("hmac", ["secret"], options={"header": "X-Sig", **options})
    assert scheme.covers == expected


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_covers_of_says_what_the_built_scheme_says_without_its_secrets(name: str) -> None:
    from effectgate.gateway.signatures import covers_of

    secrets = {"adyen": ["44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"]}.get(
        name, ["whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0" if name == "standard-webhooks" else "secret"]
    )
    variants: list[dict[str, str]] = [{}]
    if name == "twilio":
        variants = [{"url": "https://example.test/hook"}]
    if name == "paypal":
        variants = [{"confirm": "off"}]
    if name == "hmac":
        variants = [
            {"header": "X-Sig", **extra} for extra in ({}, {"id_header": "X-Id", "type_header": "X-T"})
        ]
    for options in variants:
        built = build_scheme(name, secrets, options=options)
        assert covers_of(name, options) == built.covers
