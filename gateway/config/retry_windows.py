"""How long each provider keeps retrying a delivery it could not hand over: the floor of the dedupe window.

A tombstone must outlive every automatic retry of its delivery, or a late retry would be claimed again as a
new effect. ``gateway.config_maintenance`` refuses a dedupe window (``[retention] tombstones_days``) shorter than the
window of any configured source's scheme. Sources and the dates they were read are in docs/providers.md;
where a provider's figure is unknown, ``UNKNOWN`` (the longest known window, Adyen's 30 days) applies, and an
operator who knows better states it per source (``[retention.sources.NAME] provider_retry_hours``).
"""

from __future__ import annotations

from dataclasses import dataclass

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
