"""docs/providers.md stays true: every scheme is in its table, and every example is a valid source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effectgate.gateway.config import parse
from effectgate.gateway.signatures import SCHEMES

DOC = (Path(__file__).parents[4] / "docs" / "providers.md").read_text()
EXAMPLES = re.findall(r"```toml\n(.*?)```", DOC, flags=re.DOTALL)
# A plausible value per scheme for every secret variable an example names.
SECRET_VALUES = {
    "standard-webhooks": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "adyen": "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
}


def test_every_scheme_has_a_row_and_an_example() -> None:
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", DOC, flags=re.MULTILINE))
    assert set(SCHEMES) <= rows
    examples = {m for block in EXAMPLES for m in re.findall(r'^scheme = "([a-z-]+)"', block, re.MULTILINE)}
    assert examples == set(SCHEMES)


@pytest.mark.parametrize("block", EXAMPLES, ids=[re.findall(r"\[sources\.(\w+)\]", b)[0] for b in EXAMPLES])
def test_each_example_is_a_source_the_gateway_accepts(block: str) -> None:
    scheme = re.findall(r'^scheme = "([a-z-]+)"', block, re.MULTILINE)[0]
    variables = re.findall(r'"([A-Z][A-Z0-9_]+)"', block)
    env = dict.fromkeys(variables, SECRET_VALUES.get(scheme, "a-test-secret"))
    config = parse(block, path="providers.md", env=env)
    [source] = config.sources.values()
    assert source.scheme_name == scheme
