"""The JSON Schema for editors: valid draft 2020-12, accepts the files we ship, refuses typos and wrong types."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from effectgate.gateway.config import schema
from effectgate.gateway.examples import demo
from tests.unit.gateway.config.full_config import FULL, LEGACY

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = [ROOT / "deploy" / "effectgate.toml", ROOT / "docs" / "examples" / "shop" / "effectgate.toml"]


def validator() -> jsonschema.Draft202012Validator:
    document = schema.schema()
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return jsonschema.Draft202012Validator(document)


def errors(data: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(data)]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_files_we_ship_are_valid(path: Path) -> None:
    assert errors(tomllib.loads(path.read_text(encoding="utf-8"))) == []


def test_the_demo_and_every_table_are_valid() -> None:
    assert errors(tomllib.loads(demo.demo_config(host="127.0.0.1", port=8000, fake_port=8001))) == []
    assert errors(tomllib.loads(FULL)) == []
    assert errors(tomllib.loads(LEGACY)) == []


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[gateway]\nclaim_deadlne = 1", "gateway: Additional properties"),
        ("[gateway]\nport = 70000", "gateway.port: 70000 is greater than"),
        ('[gateway]\nport = "80"', "gateway.port: '80' is not of type 'integer'"),
        ("[gateway.penalty_box]\ncooling = 0", "gateway.penalty_box.cooling: 0 is less than"),
        ('[sources.x]\nscheme = "stripe"', "sources.x: 'secrets' is a required property"),
        ('[retention]\npayloads_days = "forever"', "retention.payloads_days"),
        (
            '[downstream.p]\nbase_url = "http://x"\nidempotency_header = true',
            "downstream.p.idempotency_header",
        ),
        ('[[operators]]\nname = "a"\nscopes = ["view"]\nrole = "x"', "operators.0: Additional properties"),
    ],
)
def test_mistakes_are_marked(text: str, where: str) -> None:
    data = tomllib.loads(text)
    data.setdefault("sources", {"s": {"scheme": "stripe", "secrets": ["S"]}})
    found = errors(data)
    assert any(e.startswith(where) for e in found), found


def test_forever_is_a_tombstone_window_only() -> None:
    base = {"sources": {"s": {"scheme": "stripe", "secrets": ["S"]}}}
    assert (
        errors(
            {
                **base,
                "retention": {"tombstones_days": "forever", "sources": {"s": {"tombstones_days": "forever"}}},
            }
        )
        == []
    )
