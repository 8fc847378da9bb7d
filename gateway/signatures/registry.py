"""The scheme names a source's configuration may use, and the one way to build a scheme from it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .adyen import AdyenScheme
from .base import Covers, Scheme, SchemeConfigError
from .generic_hmac import HmacScheme
from .github import GitHubScheme
from .paypal import PayPalScheme
from .shopify import ShopifyScheme
from .slack import SlackScheme
from .standard_webhooks import StandardWebhooksScheme
from .stripe import StripeScheme
from .twilio import TwilioScheme

SCHEMES: Mapping[str, type[Scheme]] = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            AdyenScheme,
            GitHubScheme,
            HmacScheme,
            PayPalScheme,
            ShopifyScheme,
            SlackScheme,
            StandardWebhooksScheme,
            StripeScheme,
            TwilioScheme,
        )
    }
)
"""Every scheme by its configuration name; read-only so a plugin cannot swap a verifier at run time."""


def build_scheme(
    name: str,
    secrets: Sequence[str],
    *,
    tolerance: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> Scheme:
    """Build the scheme ``name`` from a source's configuration: its ``secrets`` (several during a
    rotation, tried in order), ``tolerance`` in seconds (None for the scheme's default; refused by
    schemes that sign no timestamp) and scheme-specific ``options``. Every mistake, including an
    unknown scheme or option, raises ``SchemeConfigError`` naming it, at start-up rather than on the
    first delivery."""
    cls = SCHEMES.get(name)
    if cls is None:
        raise SchemeConfigError(f"scheme: unknown scheme {name!r}; known: {', '.join(sorted(SCHEMES))}")
    accepted = _keyword_options(cls)
    given = dict(options or {})
    for option in given:
        if option not in accepted or option == "tolerance":
            known = ", ".join(sorted(accepted - {"tolerance"})) or "none"
            raise SchemeConfigError(f"{option}: unknown option for scheme {name!r}; accepted: {known}")
    if tolerance is not None:
        if "tolerance" not in accepted:
            raise SchemeConfigError(f"tolerance: scheme {name!r} signs no timestamp, so it has no tolerance")
        given["tolerance"] = tolerance
    # Every scheme's constructor takes the secrets then keyword-only options; the Protocol cannot say so.
    factory: Callable[..., Scheme] = cls
    return factory(secrets, **given)


def _keyword_options(cls: type[Scheme]) -> frozenset[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def covers_of(name: str, options: Mapping[str, Any] | None = None) -> Covers:
    """What the scheme ``name`` configured with ``options`` signs, without building it (no secrets): for a
    process that holds no webhook secrets but must still know which event fields are signed. Equal to the
    built scheme's ``covers`` (a unit test checks it)."""
    if name == HmacScheme.name:
        opts = options or {}
        return Covers(
            body=True,
            timestamp=opts.get("timestamp_header") is not None,
            id=opts.get("id_header") is None,
            type=opts.get("type_header") is None,
        )
    return SCHEMES[name].covers
