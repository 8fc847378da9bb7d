"""Stripe's SDK errors map onto the handler outcomes (handlers/providers/stripe.py's table)."""

from __future__ import annotations

import pytest
import stripe

from effectgate.handlers import TerminalError, TransientError, UnrecoverableError
from effectgate.handlers.providers.stripe import outcome_of, stripe_client


def test_rate_limit_and_connection_errors_are_transient_and_honour_retry_after() -> None:
    limited = outcome_of(stripe.RateLimitError("slow down", http_status=429, headers={"Retry-After": "3"}))
    assert type(limited) is TransientError and limited.retry_after == 3
    lock = outcome_of(stripe.RateLimitError("lock_timeout", http_status=429, headers={"retry-after": "1.5"}))
    assert type(lock) is TransientError and lock.retry_after == 1.5
    gone = outcome_of(stripe.APIConnectionError("reset"))
    assert type(gone) is TransientError and gone.retry_after is None


@pytest.mark.parametrize("status", [None, 409, 500, 503])
def test_api_errors_without_a_verdict_are_transient(status: int | None) -> None:
    assert type(outcome_of(stripe.APIError("boom", http_status=status))) is TransientError


def test_card_and_invalid_request_errors_are_terminal_with_stripes_code() -> None:
    card = outcome_of(stripe.CardError("declined", "card", "card_declined", http_status=402))
    assert type(card) is TerminalError and card.code == "card_declined"
    invalid = outcome_of(
        stripe.InvalidRequestError("state", None, "payment_intent_unexpected_state", http_status=400)
    )
    assert type(invalid) is TerminalError and invalid.code == "payment_intent_unexpected_state"
    auth = outcome_of(stripe.AuthenticationError("bad key", http_status=401))
    assert type(auth) is TerminalError and auth.code == "http_401"


def test_an_idempotency_error_is_unrecoverable() -> None:
    error = outcome_of(stripe.IdempotencyError("other params", http_status=400))
    assert isinstance(error, UnrecoverableError) and error.code == "idempotency_error"


def test_the_client_refuses_a_blank_key() -> None:
    with pytest.raises(ValueError, match="api_key"):
        stripe_client(" ")
