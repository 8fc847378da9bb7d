"""Event patterns checked against the shape of their scheme's types: the ones that can never match."""

from __future__ import annotations

import pytest

from effectgate.gateway.config.handler_checks import TYPE_SHAPES, pattern_can_match


@pytest.mark.parametrize(
    ("scheme", "pattern"),
    [
        ("stripe", "payment_intent.amount_capturable_updated"),
        ("stripe", "charge.*"),
        ("stripe", "*"),
        ("github", "pull_request.closed"),
        ("github", "push"),
        ("shopify", "orders/paid"),
        ("shopify", "orders/*"),
        ("slack", "app_mention"),
        ("paypal", "PAYMENT.CAPTURE.COMPLETED"),
        ("paypal", "PAYMENT.CAPTURE.*"),
        ("adyen", "CANCEL_OR_REFUND"),
        ("adyen", "[AC]*"),
    ],
)
def test_a_pattern_of_the_schemes_shape_can_match(scheme: str, pattern: str) -> None:
    assert pattern_can_match(TYPE_SHAPES[scheme], pattern)


@pytest.mark.parametrize(
    ("scheme", "pattern"),
    [
        ("stripe", "PaymentIntent.Succeeded"),
        ("stripe", "payment_intent_succeeded"),
        ("stripe", "orders/*"),
        ("github", "pull_request.closed.merged"),
        ("shopify", "orders.paid"),
        ("shopify", "orders.*"),
        ("slack", "app.mention"),
        ("paypal", "payment.capture.completed"),
        ("adyen", "authorisation"),
        ("adyen", "Capture*"),
    ],
)
def test_a_pattern_that_can_never_match_the_schemes_types_is_found(scheme: str, pattern: str) -> None:
    assert not pattern_can_match(TYPE_SHAPES[scheme], pattern)
