"""What each provider does that the configuration must follow: what it does with an answer that is not 2xx
(and so what a key conflict should answer), and how long it keeps retrying a delivery (the floor of the
dedupe window).

A key conflict (an effect key already held by a different request) is recorded as a reject and never
run; the answer only tells the sender. For most providers a non-2xx means "try again": they retry the
same event for hours or days and may disable the endpoint, which then loses every *other* event too.
So a source answers a conflict with 200 unless its provider neither retries nor disables (GitHub),
where a 409 shows up, harmlessly, in the provider's delivery log. ``on_conflict`` overrides it per
source. docs/providers.md carries the same table, with sources; a unit test keeps the two in step.

A tombstone must outlive every automatic retry of its delivery, or a late retry would be claimed again as a
new effect. ``config.maintenance`` refuses a dedupe window (``[retention] tombstones_days``) shorter than the
window of any configured source's scheme. Sources and the dates they were read are in docs/providers.md;
where a provider's figure is unknown, ``UNKNOWN`` (the longest known window, Adyen's 30 days) applies, and an
operator who knows better states it per source (``[retention.sources.NAME] provider_retry_hours``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConflictStatus = Literal[200, 409]
CONFLICT_STATUSES: tuple[ConflictStatus, ...] = (200, 409)
#: What a verified delivery that cannot become effects is answered (``on_refusal``): a 2xx with the refusal in
#: the body once it is kept ("acknowledge"), or the refusal's own 4xx ("reject").
RefusalAnswer = Literal["acknowledge", "reject"]
REFUSAL_ANSWERS: tuple[RefusalAnswer, ...] = ("acknowledge", "reject")


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


def default_refusal_answer(scheme: str) -> RefusalAnswer:
    """The answer to a refused delivery of a source of ``scheme`` that does not set ``on_refusal``: the same
    reasoning as a conflict's. A provider that retries a non-2xx for days, and may disable the endpoint, is
    told "acknowledge" once the refused delivery is kept; one that neither retries nor disables (GitHub) is
    answered the 4xx, which shows in its delivery log."""
    return "reject" if default_conflict_status(scheme) == 409 else "acknowledge"


def default_conflict_status(scheme: str) -> ConflictStatus:
    """The conflict answer for a source of ``scheme`` that does not set ``on_conflict``."""
    provider = PROVIDERS.get(scheme)
    return 200 if provider is None else provider.conflict_status


HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class RetryWindow:
    """The longest a provider retries (``seconds``; ``None`` when unknown) and what that figure rests on."""

    seconds: float | None
    basis: str


UNKNOWN = 30 * DAY

RETRY_WINDOWS: dict[str, RetryWindow] = {
    "stripe": RetryWindow(3 * DAY, "live mode retries with backoff for up to 3 days"),
    "shopify": RetryWindow(4 * HOUR, "8 tries over 4 hours (since September 2024; 48 hours before)"),
    # Svix's schedule: at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h ≈ 27.6 h.
    "standard-webhooks": RetryWindow(
        28 * HOUR, "Svix: about 27 hours; an endpoint failing 5 days is disabled"
    ),
    # No automatic retry, but a delivery of the past 3 days can be redelivered by hand or through the API,
    # and that redelivery must still be a duplicate.
    "github": RetryWindow(3 * DAY, "no automatic retry; manual redelivery of the past 3 days"),
    "slack": RetryWindow(1 * HOUR, "3 retries (at once, after 1 min, after 5 min); 1 hour kept as the floor"),
    "twilio": RetryWindow(
        1 * HOUR, "no delayed retries; connection-override retries (#rc, at most 5) within seconds"
    ),
    "adyen": RetryWindow(30 * DAY, "3 retries, then a retry queue for up to 30 days"),
    "paypal": RetryWindow(None, "not confirmed from PayPal's documentation here; unknown"),
    "hmac": RetryWindow(None, "generic scheme: depends on the sender; unknown"),
}


def retry_window(scheme: str) -> float:
    """The dedupe floor for ``scheme``: its provider's retry window, or ``UNKNOWN`` when that is unknown."""
    window = RETRY_WINDOWS.get(scheme)
    if window is None or window.seconds is None:
        return UNKNOWN
    return window.seconds
