"""``effectgate send``: a signed test delivery to a running gateway, the loop ``stripe trigger`` gives.

The body is an example event or a file; it is signed with the configured source's scheme and first
secret, exactly as the provider would sign it, and posted to ``{url}/webhooks/{source}``. Every
mistake in what was asked (a source, a file, a flag) is a ``SendError`` naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ..config import Config
from ..config.gateway import GatewayConfig
from ..config.sources import Source
from ..examples import example
from ..signatures import Signer, SigningError, body_event_id
from ..signatures.base import FORM_CONTENT_TYPE, JSON_CONTENT_TYPE

SEND_TIMEOUT = 30.0


class SendError(Exception):
    """What was asked cannot be sent; the message names the flag, file or configuration key."""


@dataclass(frozen=True, slots=True)
class Unsigned:
    """A body to sign, with the event id and type a scheme may carry in headers (None: the scheme's
    choice, a fresh id) and the content type it is sent with."""

    body: bytes
    content_type: str
    event_id: str | None
    event_type: str | None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A signed delivery, ready to post: where to, the bytes and the headers, and what it carries."""

    url: str
    body: bytes
    headers: dict[str, str]
    event_id: str | None
    event_type: str | None


def default_url(gateway: GatewayConfig) -> str:
    """The gateway's own address from its configuration; a wildcard listen address means this host."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(gateway.host, gateway.host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{gateway.port}"


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an absolute http(s) URL; SendError naming ``--url``."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError:
        raise SendError(f"--url: not a valid URL: {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SendError(f"--url: expected http://HOST:PORT or https://…, got {url!r}")
    return url.rstrip("/")


def check_token(flag: str, value: str | None) -> str | None:
    """``value`` if it can travel in a header as providers send ids and types: printable ASCII, no spaces."""
    if value is not None and not _is_token(value):
        raise SendError(f"{flag}: expected 1-200 printable ASCII characters without spaces, got {value!r}")
    return value


def _is_token(value: str) -> bool:
    return 0 < len(value) <= 200 and all("!" <= c <= "~" for c in value)


def find_source(config: Config, name: str) -> Source:
    """The configured source ``name``; SendError listing the configured ones otherwise."""
    source = config.sources.get(name)
    if source is None:
        known = ", ".join(sorted(config.sources))
        raise SendError(f"--source: no source named {name!r} in {config.path}; configured: {known}")
    return source


def example_delivery(source: Source, event_type: str | None, event_id: str | None) -> Unsigned:
    """The example event of ``event_type`` for the source's scheme, with ``event_id`` or a fresh one."""
    built = example(source.scheme_name, event_type, event_id)
    return Unsigned(built.body, built.content_type, built.event_id, built.event_type)


def file_delivery(source: Source, path: str, *, event_type: str | None, event_id: str | None) -> Unsigned:
    """The body of the file at ``path``, sent byte for byte: JSON, or for Twilio JSON or a form.

    ``event_id`` is used by schemes that carry the id in a header; without it they send a fresh one, as
    a new provider delivery would. Schemes reading the id from the body send the body as written. The
    type is ``event_type``, else the body's ``type`` field when it has one."""
    try:
        body = Path(path).read_bytes()
    except OSError as exc:
        raise SendError(f"--event-file {path}: cannot read: {exc.strerror or exc}") from None
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if source.scheme_name != "twilio":
            raise SendError(f"--event-file {path}: not valid JSON: {str(exc)[:120]}") from None
        # Twilio posts forms; a trailing newline from an editor would become part of the last value.
        content_type = FORM_CONTENT_TYPE
        body = body.rstrip(b"\r\n")
        document = None
    else:
        content_type = JSON_CONTENT_TYPE
    body_type = document.get("type") if isinstance(document, dict) else None
    if event_type is None and isinstance(body_type, str) and _is_token(body_type):
        event_type = body_type
    return Unsigned(body, content_type, event_id, event_type)


def sign(
    source: Source,
    delivery: Unsigned,
    *,
    url: str,
    signing_key: str | None,
    where: str,
    now: float | None = None,
) -> Outgoing:
    """Sign ``delivery`` with the source's scheme and first secret; ``where`` names the body's origin
    (the file or the example) in an error."""
    scheme = source.scheme
    if not isinstance(scheme, Signer):
        raise SendError(f"--source {source.name}: scheme {source.scheme_name!r} has no signer")
    try:
        signed = scheme.sign(
            delivery.body,
            event_id=delivery.event_id,
            event_type=delivery.event_type,
            content_type=delivery.content_type,
            signing_key=signing_key,
            now=now,
        )
    except SigningError as exc:
        raise SendError(_name_the_input(str(exc), source, where)) from None
    headers = dict(signed.headers)
    # The event id the ledger records: where the provider's id header is unsigned, the gateway keys the
    # event on the signed body's digest instead, so that is the id to look for.
    sent_id = (
        _header(headers, _ID_HEADERS) or delivery.event_id if scheme.covers.id else body_event_id(signed.body)
    )
    return Outgoing(f"{url}/webhooks/{source.name}", signed.body, headers, sent_id, delivery.event_type)


# The headers a scheme carries an event id in, to report what was sent when the id was fresh.
_ID_HEADERS = ("X-GitHub-Delivery", "X-Shopify-Webhook-Id", "webhook-id", "I-Twilio-Idempotency-Token")


def _header(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in headers:
            return headers[name]
    return None


def _name_the_input(message: str, source: Source, where: str) -> str:
    # The signer names its inputs by parameter; the user knows them by flag or file.
    for parameter, flag in (
        ("event_type:", "--event-type:"),
        ("signing_key:", "--signing-key-env:"),
        ("body:", f"{where}:"),
    ):
        if message.startswith(parameter):
            return f"--source {source.name}: {flag}{message[len(parameter) :]}"
    return f"--source {source.name}: {message}"


def signing_key_from(env_name: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The private key held in the environment variable ``env_name`` (``--signing-key-env``)."""
    if env_name is None:
        return None
    value = (os.environ if env is None else env).get(env_name)
    if not value:
        raise SendError(f"--signing-key-env: environment variable {env_name} is not set (or empty)")
    return value.strip()


def post(outgoing: Outgoing, *, timeout: float = SEND_TIMEOUT) -> httpx.Response:
    """POST the signed delivery; ``httpx.HTTPError`` when the gateway cannot be reached."""
    return httpx.post(outgoing.url, content=outgoing.body, headers=outgoing.headers, timeout=timeout)
