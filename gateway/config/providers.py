"""What each provider does with an answer that is not 2xx, and so what a key conflict should answer.

A key conflict (an effect key already held by a different request) is recorded as a reject and never
run; the answer only tells the sender. For most providers a non-2xx means "try again": they retry the
same event for hours or days and may disable the endpoint, which then loses every *other* event too.
So a source answers a conflict with 200 unless its provider neither retries nor disables (GitHub),
where a 409 shows up, harmlessly, in the provider's delivery log. ``on_conflict`` overrides it per
source. docs/providers.md carries the same table, with sources; a unit test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConflictStatus = Literal[200, 409]
CONFLICT_STATUSES: tuple[ConflictStatus, ...] = (200, 409)


@dataclass(frozen=True, slots=True)
class NonSuccessAnswer:
    """What a provider does after a non-2xx answer, and the conflict answer that follows from it."""

    retries: str
    disables: str
    conflict_status: ConflictStatus


# Keyed by scheme name (gateway.signatures.SCHEMES). An unknown sender (generic HMAC) is assumed to
# retry, the answer that is safe whatever it does.
PROVIDERS: dict[str, NonSuccessAnswer] = {
    "stripe": NonSuccessAnswer(
        "live mode: for up to 3 days with exponential backoff; test mode: 3 times over a few hours",
        "may disable the endpoint after days of failures, and emails the account",
        200,
    ),
    "shopify": NonSuccessAnswer(
        "8 times over 4 hours (since 2024-09-10; 19 times over 48 hours before)",
        "deletes a subscription made through the Admin API after 8 consecutive failures",
        200,
    ),
    "standard-webhooks": NonSuccessAnswer(
        "Svix: 8 attempts over about 27 hours (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h)",
        "Svix disables an endpoint whose every attempt failed for 5 days",
        200,
    ),
    "slack": NonSuccessAnswer(
        "3 times: at once, after 1 minute, after 5 minutes",
        "may turn off the app's event subscriptions when most deliveries fail",
        200,
    ),
    "paypal": NonSuccessAnswer(
        "up to 25 times over 3 days",
        "not documented",
        200,
    ),
    "adyen": NonSuccessAnswer(
        "3 times at once, then from a per-endpoint queue for up to 30 days (2 min … 8 h apart)",
        "none, but the endpoint shows as failing",
        200,
    ),
    "twilio": NonSuccessAnswer(
        "status callbacks: not by default; with connection overrides (#rc=) as configured",
        "none; each failure is an error (11200) in the debugger",
        200,
    ),
    "github": NonSuccessAnswer(
        "never; a failed delivery can be redelivered by hand for 3 days",
        "none",
        409,
    ),
    "hmac": NonSuccessAnswer(
        "unknown: depends on the sender",
        "unknown",
        200,
    ),
}


def default_conflict_status(scheme: str) -> ConflictStatus:
    """The conflict answer for a source of ``scheme`` that does not set ``on_conflict``."""
    provider = PROVIDERS.get(scheme)
    return 200 if provider is None else provider.conflict_status
