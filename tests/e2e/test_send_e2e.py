"""``effectgate send`` end to end: the installed CLI signs and posts to one real gateway with every scheme.

The gateway runs the same way as in ``test_schemes_e2e`` (one process, one ledger for the module);
its configuration adds a Standard Webhooks source with an Ed25519 public key and a Twilio source with
a SharedKey. Each locally signable scheme is sent once (202, claimed) and again with the same event
id (200, a duplicate); PayPal is refused plainly before anything is posted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.gateway.signatures import body_event_id, standard_webhooks

from .processes import ROOT, Process, free_port
from .schemes import SECRETS

SIGNING_KEY, PUBLIC_KEY = standard_webhooks.new_ed25519_keys()
ENV = {
    **SECRETS,
    "SVIX_PUBLIC_KEY": PUBLIC_KEY,
    "TWILIO_SHARED_KEY_SECRET": "e2e-twilio-shared-key-secret-3f9c",
    # The sender's private key: only `send` reads it, through --signing-key-env.
    "SW_SIGNING_KEY": SIGNING_KEY,
}


def config(port: int) -> str:
    return f"""
[gateway]
port = {port}

[handlers]
modules = ["tests.e2e.send_handlers"]

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[sources.github]
scheme = "github"
secrets = ["GITHUB_SECRET"]

[sources.standard]
scheme = "standard-webhooks"
secrets = ["SVIX_SECRET"]

[sources.standard_ed25519]
scheme = "standard-webhooks"
secrets = ["SVIX_PUBLIC_KEY"]

[sources.shopify]
scheme = "shopify"
secrets = ["SHOPIFY_SECRET"]

[sources.slack]
scheme = "slack"
secrets = ["SLACK_SECRET"]

[sources.hmac]
scheme = "hmac"
secrets = ["HMAC_SECRET"]
options = {{ header = "X-Signature", prefix = "sha256=", timestamp_header = "X-Timestamp" }}

[sources.twilio]
scheme = "twilio"
secrets = ["TWILIO_SECRET"]
options = {{ url = "http://127.0.0.1:{port}/webhooks/twilio" }}

[sources.twilio_sharedkey]
scheme = "twilio"
secrets = ["TWILIO_SHARED_KEY_SECRET"]
options = {{ url = "http://127.0.0.1:{port}/webhooks/twilio_sharedkey", shared_key = "webhooks_sharedkey_e2e" }}

[sources.adyen]
scheme = "adyen"
secrets = ["ADYEN_HMAC_KEY"]

[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ confirm = "off" }}
"""


@dataclass
class Gateway:
    url: str
    db_url: str
    config: Path
    tmp: Path

    def send(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the installed CLI, as a user would, from a directory that is not the checkout."""
        return subprocess.run(
            [sys.executable, "-m", "effectgate.gateway.cli", "send", "--config", str(self.config), *args],
            cwd=self.tmp,
            env={**os.environ, **ENV, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def effects(self, source: str) -> list[str]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            rows = conn.execute(
                "SELECT effect_key FROM effects WHERE handler = %s ORDER BY effect_key", (f"send.{source}",)
            ).fetchall()
        return [row["effect_key"] for row in rows]


@pytest.fixture(scope="module")
def gateway(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("send")
    port = free_port()
    path = tmp / "effectgate.toml"
    path.write_text(config(port))
    env = {"DATABASE_URL": module_db_url, "EFFECTGATE_LOG_LEVEL": "INFO", **ENV}
    process = Process(["serve", "--config", str(path), "--no-migrate"], env, tmp / "gateway.log")
    try:
        process.wait_http(f"http://127.0.0.1:{port}/readyz")
        assert ROOT != tmp
        yield Gateway(f"http://127.0.0.1:{port}", module_db_url, path, tmp)
    finally:
        process.stop()


def answer(result: subprocess.CompletedProcess[str]) -> tuple[int, int, Any]:
    """(exit code, HTTP status, body) from what `send` printed: ``<status> <body>`` on stdout."""
    status, _, body = result.stdout.strip().partition(" ")
    assert status.isdigit(), result.stdout + result.stderr
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body
    return result.returncode, int(status), parsed


# Sources whose provider does not sign the id header (docs/providers.md): keyed on the body's digest.
UNSIGNED_IDS = {"github", "shopify", "twilio", "twilio_sharedkey"}

SCHEMES = [
    ("stripe", ["--example", "payment_intent.succeeded"]),
    ("github", ["--example", "issues.opened"]),
    ("standard", ["--example", "invoice.paid"]),
    ("standard_ed25519", ["--example", "user.created", "--signing-key-env", "SW_SIGNING_KEY"]),
    ("shopify", ["--example", "orders/create"]),
    ("slack", ["--example", "app_mention"]),
    ("hmac", ["--example", "thing.happened"]),
    ("twilio", ["--example", "delivered"]),
    ("twilio_sharedkey", ["--example", "delivered"]),
    ("adyen", ["--example", "AUTHORISATION"]),
]


@pytest.mark.parametrize(("source", "args"), SCHEMES, ids=[s for s, _ in SCHEMES])
def test_send_is_accepted_then_a_duplicate(gateway: Gateway, source: str, args: list[str]) -> None:
    event_id = f"e2e-send-{source}-1"
    first = gateway.send("--source", source, *args, "--event-id", event_id)
    second = gateway.send("--source", source, *args, "--event-id", event_id)
    code, status, body = answer(first)
    assert (code, status) == (0, 202), first.stdout + first.stderr
    assert f"/webhooks/{source}" in first.stderr and "Traceback" not in first.stderr
    again_code, again_status, again_body = answer(second)
    assert (again_code, again_status) == (0, 200), second.stdout + second.stderr
    if source == "adyen":
        assert body == again_body == "[accepted]"
        event_id = f"{event_id}:AUTHORISATION"
    else:
        if source in UNSIGNED_IDS:
            # The id header is unsigned: the gateway identifies the event by its signed body instead.
            [event_id] = body["event_ids"]
            assert event_id.startswith("sha256:")
        assert body["event_ids"] == again_body["event_ids"] == [event_id]
        assert [e["outcome"] for e in again_body["effects"]] == ["duplicate"]
    assert gateway.effects(source) == [f"{source}:{event_id}:send.{source}"]


def test_twilio_json_from_a_file(gateway: Gateway) -> None:
    path = gateway.tmp / "twilio.json"
    path.write_text(json.dumps({"MessageSid": "SM_e2e_json", "status": "delivered"}))
    args = ["--source", "twilio", "--event-file", str(path), "--event-id", "idem-e2e-json"]
    first, second = gateway.send(*args), gateway.send(*args)
    assert answer(first)[:2] == (0, 202), first.stdout + first.stderr
    assert answer(second)[:2] == (0, 200), second.stdout + second.stderr
    body = path.read_bytes()
    assert f"twilio:{body_event_id(body)}:send.twilio" in gateway.effects("twilio")
    assert f"event id {body_event_id(body)}" in first.stderr


def test_without_an_event_id_each_send_is_a_new_event(gateway: Gateway) -> None:
    runs = [
        gateway.send("--source", "stripe", "--example", "charge.refunded", "--url", gateway.url)
        for _ in (1, 2)
    ]
    ids = set()
    for run in runs:
        code, status, body = answer(run)
        assert (code, status) == (0, 202), run.stdout + run.stderr
        ids.update(body["event_ids"])
    assert len(ids) == 2


def test_slack_url_verification_is_answered_with_its_challenge(gateway: Gateway) -> None:
    code, status, body = answer(gateway.send("--source", "slack", "--example", "url_verification"))
    assert (code, status) == (0, 200)
    assert set(body) == {"challenge"}


def test_paypal_is_refused_plainly_and_nothing_is_posted(gateway: Gateway) -> None:
    result = gateway.send("--source", "paypal", "--example")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "effectgate: --source paypal: PayPal cannot be signed locally" in result.stderr
    assert "Traceback" not in result.stderr
    assert gateway.effects("paypal") == []


def test_a_wrong_secret_is_the_gateways_401_and_exit_1(gateway: Gateway) -> None:
    result = gateway.send("--source", "stripe", "--example", env={"STRIPE_SECRET": "whsec_not_the_gateways"})
    code, status, body = answer(result)
    assert (code, status, body["error"]) == (1, 401, "signature_invalid")


def test_mistakes_are_exit_2_naming_the_flag_or_file(gateway: Gateway) -> None:
    missing = gateway.tmp / "missing.json"
    cases = [
        (["--source", "stripe", "--event-file", str(missing)], f"--event-file {missing}: cannot read"),
        (["--source", "nope", "--example"], "--source: no source named 'nope'"),
        (["--source", "standard_ed25519", "--example"], "--signing-key-env: required"),
        (["--source", "stripe", "--example", "--url", "localhost:8000"], "--url: expected http://"),
        (["--source", "stripe"], "one of the arguments --example --event-file is required"),
    ]
    for args, message in cases:
        result = gateway.send(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_an_unreachable_gateway_is_exit_1(gateway: Gateway) -> None:
    result = gateway.send("--source", "stripe", "--example", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert "cannot reach" in result.stderr and "Traceback" not in result.stderr
