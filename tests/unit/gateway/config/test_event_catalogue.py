"""Providers' published event types as data, and the start-up warning for a type a provider does not list."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from pathlib import Path

import pytest

from effectgate.gateway.config import load
from effectgate.gateway.config.event_catalogue import catalogues, parse
from effectgate.gateway.config.handler_checks import TYPE_SHAPES, pattern_can_match
from effectgate.gateway.config.handler_imports import import_handlers
from effectgate.gateway.examples import EXAMPLE_TYPES
from effectgate.gateway.logs import JsonFormatter
from effectgate.handlers.registry import REGISTRY

ENV = {"S1": "whsec_one", "GH": "gh-secret", "SH": "shpss", "HM": "hmac-secret"}
SOURCES = """
[sources.stripe]
scheme = "stripe"
secrets = ["S1"]
[sources.github]
scheme = "github"
secrets = ["GH"]
[sources.shop]
scheme = "shopify"
secrets = ["SH"]
[sources.internal]
scheme = "hmac"
secrets = ["HM"]
options = { header = "X-Sig", type_header = "X-Type" }
"""
EVENT = "handlers.event_type_not_in_catalogue"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory whose handler modules import into an empty registry, restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    for attribute in ("_kinds", "_sweeps"):
        monkeypatch.setattr(REGISTRY, attribute, {})
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _warnings(project: Path, handlers: str, caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The catalogue warnings ``import_handlers`` logs for a module holding ``handlers``, as the JSON
    lines the processes write."""
    name = f"eg_catalogue_{uuid.uuid4().hex[:8]}"
    (project / f"{name}.py").write_text("from effectgate import effect\n\n" + handlers)
    config = project / "effectgate.toml"
    config.write_text(f'[handlers]\nmodules = ["{name}"]\n' + SOURCES)
    with caplog.at_level(logging.WARNING, logger="effectgate.config"):
        import_handlers(load(config, env=ENV))
    formatter = JsonFormatter()
    return [json.loads(formatter.format(r)) for r in caplog.records if r.getMessage() == EVENT]


def test_a_misspelt_stripe_type_is_warned_with_the_nearest_published_name(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = _warnings(
        project,
        "@effect(source='stripe', events=['payment_intent.succeded'], name='shop.ship')\n"
        "async def ship(ctx, ev):\n    return None\n",
        caplog,
    )
    assert len(lines) == 1
    line = lines[0]
    assert {k: line[k] for k in ("level", "effect", "source", "scheme", "event_type", "nearest")} == {
        "level": "warning",
        "effect": "shop.ship",
        "source": "stripe",
        "scheme": "stripe",
        "event_type": "payment_intent.succeded",
        "nearest": "payment_intent.succeeded",
    }
    assert str(line["defined_at"]).endswith(f"{next(project.glob('eg_catalogue_*.py')).name}:3")
    assert str(line["catalogue"]).startswith("https://docs.stripe.com/api/events/types (retrieved 2026-")
    assert "did you mean 'payment_intent.succeeded'?" in str(line["problem"])


def test_published_types_wildcards_and_uncatalogued_schemes_are_not_warned(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = _warnings(
        project,
        "@effect(source='stripe', events=['payment_intent.succeeded', 'charge.dispute.*', 'invoice.pai?'],"
        " name='ok.stripe')\nasync def a(ctx, ev):\n    return None\n\n"
        "@effect(source='github', events=['pull_request.closed', 'push'], name='ok.github')\n"
        "async def b(ctx, ev):\n    return None\n\n"
        "@effect(source='shop', events=['orders/paid'], name='ok.shop')\n"
        "async def c(ctx, ev):\n    return None\n\n"
        "@effect(source='internal', events=['anything.at_all'], name='ok.internal')\n"
        "async def d(ctx, ev):\n    return None\n\n"
        "@effect(source='github', events=['pull_requests.closed'], name='typo.github')\n"
        "async def e(ctx, ev):\n    return None\n\n"
        "@effect(source='shop', events=['order/paid'], name='typo.shop')\n"
        "async def f(ctx, ev):\n    return None\n",
        caplog,
    )
    # GitHub's action is not catalogued, so the suggestion keeps it.
    assert [(line["effect"], line["event_type"], line["nearest"]) for line in lines] == [
        ("typo.github", "pull_requests.closed", "pull_request.closed"),
        ("typo.shop", "order/paid", "orders/paid"),
    ]


def test_a_type_of_the_wrong_shape_is_warned_once_not_twice(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = _warnings(
        project,
        "@effect(source='stripe', events=['PaymentIntentSucceeded'], name='shape')\n"
        "async def a(ctx, ev):\n    return None\n",
        caplog,
    )
    assert lines == []
    assert [r.getMessage() for r in caplog.records] == ["handlers.pattern_never_matches"]


def test_every_catalogue_names_its_page_and_date_and_fits_its_schemes_shape() -> None:
    found = catalogues()
    assert set(found) == {"adyen", "github", "paypal", "shopify", "stripe"}
    for scheme, catalogue in found.items():
        assert catalogue.source.startswith("https://"), scheme
        assert len(catalogue.retrieved) == 10 and catalogue.retrieved.startswith("20"), scheme
        assert len(catalogue.types) >= 30, scheme
        for event_type in catalogue.types:
            assert pattern_can_match(TYPE_SHAPES[scheme], event_type), (scheme, event_type)
        # The examples `effectgate send --example` builds are real types of their provider.
        for example in EXAMPLE_TYPES[scheme]:
            assert catalogue.knows(example), (scheme, example)
    for event_type in (
        "payment_intent.amount_capturable_updated",
        "charge.captured",
        "checkout.session.completed",
        "invoice.paid",
        "customer.subscription.deleted",
        "charge.refunded",
        "refund.created",
        "charge.dispute.created",
    ):
        assert found["stripe"].knows(event_type), event_type
    assert found["paypal"].knows("CHECKOUT.ORDER.APPROVED")
    assert found["paypal"].knows("BILLING.SUBSCRIPTION.RE-ACTIVATED")
    assert found["adyen"].knows("CAPTURE_FAILED")


def test_a_catalogue_without_its_header_is_refused() -> None:
    with pytest.raises(ValueError, match=r"x\.txt: header lacks source, retrieved"):
        parse("# provider: X\n# match: whole type\na.b\n", name="x.txt")
    with pytest.raises(ValueError, match="match must be"):
        parse("# provider: X\n# source: https://x\n# retrieved: 2026-01-01\n# match: prefix\n", name="x")
