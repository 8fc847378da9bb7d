"""``effectgate send`` and ``effectgate demo-delivery``: post a signed delivery to a running gateway, as a
source's provider would (for ``send``, the loop ``stripe trigger`` gives).

The body is an example event or a file; it is signed with the configured source's scheme and first
secret, exactly as the provider would sign it, and posted to ``{url}/webhooks/{source}``. Every
mistake in what was asked (a source, a file, a flag) is a ``SendError`` naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from .. import embedded
from ..config import DEFAULT_CONFIG_FILE, Config, load
from ..config.gateway import GatewayConfig
from ..config.sources import Source
from ..examples import EXAMPLE_TYPES, demo, example
from ..exit_codes import EXIT_FAILURE, EXIT_OK
from ..signatures import Signer, SigningError, body_event_id
from ..signatures.base import FORM_CONTENT_TYPE, JSON_CONTENT_TYPE
from . import flags
from .common import UsageError, config_path

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


def cmd_demo_delivery(args: argparse.Namespace) -> int:
    # Stripe's order for a manual capture: amount_capturable_updated (capture), then succeeded (ship).
    code = EXIT_OK
    for body, headers in demo.example_deliveries(args.url, args.order):
        try:
            response = httpx.post(
                f"{args.url.rstrip('/')}/webhooks/stripe", content=body, headers=headers, timeout=10
            )
        except httpx.HTTPError as exc:
            print(f"effectgate: cannot reach {args.url}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"{response.status_code} {response.text}")
        if response.status_code >= 300:
            code = EXIT_FAILURE
    return code


def _send_config(args: argparse.Namespace) -> Config:
    # Only the configuration is needed, not the handler modules: sending runs no user code. Where
    # `up` would run its demo (no configuration anywhere), send to the demo it wrote, with its secrets.
    if (
        args.config is None
        and "EFFECTGATE_CONFIG" not in os.environ
        and not Path(DEFAULT_CONFIG_FILE).exists()
    ):
        demo_config = embedded.home_dir() / "demo.toml"
        if demo_config.exists():
            print(
                f"effectgate: using the demo configuration of `effectgate up`: {demo_config}", file=sys.stderr
            )
            return load(demo_config, env={**demo.DEMO_ENV, **os.environ})
    return load(config_path(args))


def cmd_send(args: argparse.Namespace) -> int:
    config = _send_config(args)
    source = find_source(config, args.source)
    url = check_url(args.url) if args.url is not None else default_url(config.gateway)
    signing_key = signing_key_from(args.signing_key_env)
    event_id = check_token("--event-id", args.event_id)
    event_type = check_token("--event-type", args.event_type)
    if args.example:
        check_token("--example", args.example)
    if args.event_file is not None:
        delivery = file_delivery(source, args.event_file, event_type=event_type, event_id=event_id)
        where = f"--event-file {args.event_file}"
    else:
        if event_type is not None:
            raise UsageError("--event-type: with --example the type is its argument (--example TYPE)")
        delivery = example_delivery(source, args.example or None, event_id)
        where = f"--example {delivery.event_type}"
    outgoing = sign(source, delivery, url=url, signing_key=signing_key, where=where)
    print(
        f"effectgate: POST {outgoing.url}  source {source.name} ({source.scheme_name}), "
        f"type {outgoing.event_type or '-'}, event id {outgoing.event_id or 'in the body'}",
        file=sys.stderr,
    )
    try:
        response = post(outgoing)
    except httpx.InvalidURL as exc:
        raise UsageError(f"--url: {exc}") from exc
    except httpx.HTTPError as exc:
        print(f"effectgate: cannot reach {outgoing.url}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{response.status_code} {response.text}")
    return EXIT_OK if 200 <= response.status_code < 300 else EXIT_FAILURE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``send`` and ``demo-delivery`` to the command line."""
    sd = flags.with_config(
        sub.add_parser(
            "send",
            help="sign an example event or a file as a source's provider would, and post it to the gateway",
            description=(
                "Sign a delivery with the source's scheme and first secret, post it to "
                "URL/webhooks/SOURCE and print the answer (exit 0 on 2xx, 1 otherwise). "
                "Examples (any other TYPE gets a generic body): "
                + "; ".join(f"{scheme}: {', '.join(types)}" for scheme, types in EXAMPLE_TYPES.items())
                + ". PayPal cannot be signed locally."
            ),
        )
    )
    sd.add_argument("--source", required=True, help="the configured source to send to ([sources.NAME])")
    body = sd.add_mutually_exclusive_group(required=True)
    body.add_argument(
        "--example",
        nargs="?",
        const="",
        metavar="TYPE",
        help="send an example event of TYPE (default: the scheme's first example type)",
    )
    body.add_argument(
        "--event-file", metavar="FILE", help="send this file's body (JSON; for Twilio JSON or a form)"
    )
    sd.add_argument(
        "--event-id",
        help="the event id (default: a fresh one each run); send the same id again to see a duplicate",
    )
    sd.add_argument(
        "--event-type",
        help="with --event-file: the type for schemes that send it in a header (GitHub, Shopify)",
    )
    sd.add_argument("--url", help="the gateway's base URL (default: from [gateway] host and port)")
    sd.add_argument(
        "--signing-key-env",
        metavar="VAR",
        help="environment variable holding the whsk_ private key, for a standard-webhooks source "
        "configured with a whpk_ public key (Ed25519)",
    )
    sd.set_defaults(func=cmd_send)

    dd = sub.add_parser(
        "demo-delivery",
        help="post a manual-capture payment's two signed Stripe deliveries to a running gateway, in Stripe's order",
    )
    dd.add_argument("--url", default="http://127.0.0.1:8000")
    dd.add_argument("--order", default="1234")
    dd.set_defaults(func=cmd_demo_delivery)
