"""``effectgate send`` and ``effectgate demo-delivery``: post a signed delivery to a running gateway, as a
source's provider would (the signing itself is ``gateway/cli/sending.py``'s)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

from .. import embedded
from ..config import DEFAULT_CONFIG_FILE, Config, load
from ..examples import EXAMPLE_TYPES, demo
from . import flags
from . import sending as send
from .common import EXIT_FAILURE, EXIT_OK, UsageError, config_path


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
    source = send.find_source(config, args.source)
    url = send.check_url(args.url) if args.url is not None else send.default_url(config.gateway)
    signing_key = send.signing_key_from(args.signing_key_env)
    event_id = send.check_token("--event-id", args.event_id)
    event_type = send.check_token("--event-type", args.event_type)
    if args.example:
        send.check_token("--example", args.example)
    if args.event_file is not None:
        delivery = send.file_delivery(source, args.event_file, event_type=event_type, event_id=event_id)
        where = f"--event-file {args.event_file}"
    else:
        if event_type is not None:
            raise UsageError("--event-type: with --example the type is its argument (--example TYPE)")
        delivery = send.example_delivery(source, args.example or None, event_id)
        where = f"--example {delivery.event_type}"
    outgoing = send.sign(source, delivery, url=url, signing_key=signing_key, where=where)
    print(
        f"effectgate: POST {outgoing.url}  source {source.name} ({source.scheme_name}), "
        f"type {outgoing.event_type or '-'}, event id {outgoing.event_id or 'in the body'}",
        file=sys.stderr,
    )
    try:
        response = send.post(outgoing)
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
