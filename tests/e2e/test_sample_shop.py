"""The sample shop (docs/examples/shop) from the installed wheel, against local fakes of Stripe, EasyPost and
Shopify: Stripe with manual capture, an EasyPost label and a Shopify fulfilment, once per order.

Everything runs as a user runs it: the wheel with its `stripe` and `easypost` extras in a fresh venv, the
project's own directory as the working directory, `effectgate serve` and `effectgate worker` processes, the
Stripe events signed by Stripe's library and sent in Stripe's order
(https://docs.stripe.com/payments/place-a-hold-on-a-payment-method: `payment_intent.amount_capturable_updated`,
then, after the capture, `payment_intent.succeeded`). Duplicates, a conflict, a worker SIGKILLed inside each
of the three calls (the fake has acted, its answer is held), and an operator's redrive each end with exactly
one capture, one label and one fulfilment per order, counted at the fakes.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import stripe
from psycopg.rows import dict_row

from .installed_wheel import Installed
from .processes import ROOT, free_port, wait_until

SHOP = ROOT / "docs" / "examples" / "shop"
SECRET = "whsec_sample_shop"
LEASE_TTL = "2"


@dataclass
class Shop:
    installed: Installed
    project: Path
    db_url: str
    logs: Path
    urls: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway: str = ""

    def env(self) -> dict[str, str]:
        return self.installed.env(
            DATABASE_URL=self.db_url,
            STRIPE_WEBHOOK_SECRET=SECRET,
            STRIPE_API_KEY="sk_test_shop",
            EASYPOST_API_KEY="EZTK_test_shop",
            SHOPIFY_ACCESS_TOKEN="shpat_test_shop",
            SHOP_LEASE_TTL=LEASE_TTL,
            SHOP_MAX_ATTEMPTS="2",
        )

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [str(self.installed.effectgate), *args],
                cwd=self.project,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, "worker", "--no-migrate")

    def fake(self, name: str, path: str, body: Any) -> Any:
        answer = httpx.post(self.urls[name] + path, json=body, timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def stats(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = httpx.get(self.urls[name] + "/_fake/stats", timeout=10).json()
        return result

    def counts(self, order: str) -> tuple[int, int, int]:
        """(captures, labels, fulfilments) of one order, as the three fakes counted them."""
        return (
            self.stats("stripe")["captures_by_intent"].get(f"pi_{order}", 0),
            self.stats("easypost")["labels_by_reference"].get(self.key(f"ship:{order}", "label"), 0),
            self.stats("shopify")["fulfillments_by_order"].get(shopify_order(order), 0),
        )

    def key(self, effect_key: str, step: str) -> str:
        code = f"from effectgate.handlers.idempotency import idempotency_key as k; print(k('default', {effect_key!r}, {step!r}))"
        done = subprocess.run(
            [str(self.installed.python), "-c", code], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    def send(self, event: dict[str, Any], times: int = 1) -> list[str]:
        """Post `event` `times` times at once; the effect outcomes the gateway answered, sorted."""
        body = json.dumps(event)
        signature = stripe.WebhookSignature.generate_signature_header(body, SECRET)
        headers = {"stripe-signature": signature, "content-type": "application/json"}

        def post(_: int) -> str:
            answer = httpx.post(f"{self.gateway}/webhooks/stripe", content=body, headers=headers, timeout=30)
            assert answer.status_code in (200, 202), answer.text
            return ",".join(e["outcome"] for e in answer.json()["effects"])

        with ThreadPoolExecutor(max_workers=times) as pool:
            return sorted(pool.map(post, range(times)))

    def job(self, effect_key: str) -> dict[str, Any]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            row = conn.execute(
                "SELECT j.id, j.state::text AS state, j.attempt FROM jobs j JOIN effects e ON e.id = j.effect_id "
                "WHERE e.effect_key = %s",
                (effect_key,),
            ).fetchone()
        return row or {"state": None}

    def wait_state(self, effect_key: str, state: str) -> dict[str, Any]:
        wait_until(lambda: self.job(effect_key)["state"] == state, 90, f"{effect_key} to be {state}")
        return self.job(effect_key)

    def kill_inside(self, worker: subprocess.Popen[bytes], reached: Any, what: str) -> None:
        """SIGKILL `worker` once `reached()` says the fake has acted and holds its answer."""
        wait_until(reached, 60, what)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        assert worker.returncode == -signal.SIGKILL


def shopify_order(order: str) -> str:
    return f"gid://shopify/Order/{order}"


def intent_event(
    order: str,
    event_type: str,
    *,
    amount: int = 1000,
    event_id: str | None = None,
    intent: str | None = None,
) -> dict[str, Any]:
    """A Stripe event of a manual-capture intent of `order` (`pi_{order}` unless `intent` says), shaped
    like Stripe's."""
    captured = event_type == "payment_intent.succeeded"
    return {
        "id": event_id or f"evt_{intent or order}_{event_type.rsplit('.', 1)[1]}",
        "object": "event",
        "type": event_type,
        "created": int(time.time()),
        "data": {
            "object": {
                "id": intent or f"pi_{order}",
                "object": "payment_intent",
                "amount": amount,
                "amount_capturable": 0 if captured else amount,
                "amount_received": amount if captured else 0,
                "capture_method": "manual",
                "currency": "usd",
                "status": "succeeded" if captured else "requires_capture",
                "metadata": {"order_id": order, "shopify_order_id": shopify_order(order)},
                "shipping": {
                    "name": "Ada Lovelace",
                    "address": {
                        "line1": "12 St James's Sq",
                        "city": "London",
                        "postal_code": "SW1Y 4LB",
                        "country": "GB",
                    },
                },
            }
        },
    }


@pytest.fixture(scope="module")
def with_extras(installed: Installed) -> Installed:
    subprocess.run(
        [
            str(installed.python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{installed.wheel}[stripe,easypost]",
        ],
        check=True,
        capture_output=True,
    )
    return installed


@pytest.fixture
def shop(with_extras: Installed, db_url: str, tmp_path: Path) -> Iterator[Shop]:
    project = tmp_path / "shop"
    project.mkdir()
    shutil.copy(SHOP / "shop_effects.py", project)
    logs = tmp_path / "logs"
    logs.mkdir()
    s = Shop(with_extras, project, db_url, logs)
    try:
        for name, module in (
            ("stripe", "providers"),
            ("easypost", "easypost"),
            ("shopify", "shopify"),
        ):
            port = free_port()
            code = f"from effectgate.gateway.fakes.{module} import serve; serve('127.0.0.1', {port})"
            with (logs / f"fake_{name}.log").open("wb") as log:
                s.procs.append(
                    subprocess.Popen(
                        [str(with_extras.python), "-c", code],
                        cwd=tmp_path,
                        env=with_extras.env(),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            s.urls[name] = f"http://127.0.0.1:{port}"
        for url in s.urls.values():
            wait_until(lambda url=url: _answers(url + "/_fake/stats"), 60, f"{url} to answer")
        config = (SHOP / "effectgate.toml").read_text()
        config = config.replace("https://api.stripe.com", s.urls["stripe"])
        config = config.replace("https://api.easypost.com", s.urls["easypost"])
        config = config.replace("https://your-shop.myshopify.com", s.urls["shopify"])
        config += "backoff_base = 0.05\nbackoff_cap = 0.2\n\n[reconciler]\ntick = 0.3\n"
        (project / "effectgate.toml").write_text(config)
        port = free_port()
        s.gateway = f"http://127.0.0.1:{port}"
        s.start("serve", "serve", "--no-migrate", "--port", str(port))
        wait_until(lambda: _answers(s.gateway + "/readyz"), 60, "serve to answer /readyz")
        yield s
    finally:
        for url in s.urls.values():
            for path, body in (("/_fake/hold", {"hold": False}), ("/_fake/faults", {"mode": "none"})):
                try:
                    httpx.post(url + path, json=body, timeout=5)
                except httpx.HTTPError:
                    pass
        for proc in s.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in s.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_duplicates_and_a_conflict_capture_label_and_fulfil_once(shop: Shop) -> None:
    shop.worker("worker")
    capturable = intent_event("1001", "payment_intent.amount_capturable_updated")
    assert shop.send(capturable, times=8) == ["accepted"] + ["duplicate"] * 7
    shop.wait_state("capture:pi_1001", "succeeded")
    succeeded = intent_event("1001", "payment_intent.succeeded")
    assert shop.send(succeeded, times=8) == ["accepted"] + ["duplicate"] * 7
    # The capturable event again with another amount under a new id: the same order, another request.
    # Stripe's source answers a conflict 200 (Stripe disables endpoints that keep failing); it is rejected.
    other = intent_event(
        "1001", "payment_intent.amount_capturable_updated", amount=999, event_id="evt_1001_b"
    )
    assert shop.send(other) == ["rejected"]  # the same intent (capture:pi_1001), another amount
    shop.wait_state("ship:1001", "succeeded")
    assert shop.send(succeeded) == ["duplicate"]
    assert shop.counts("1001") == (1, 1, 1)


def test_a_worker_killed_inside_each_call_still_captures_labels_and_fulfils_once(shop: Shop) -> None:
    # Stripe: the capture is made and its answer held; the rescuer replays it under the same key.
    shop.fake("stripe", "/_fake/faults", {"mode": "hang_after_effect", "paths": ["/v1/payment_intents"]})
    doomed = shop.worker("doomed-capture")
    shop.send(intent_event("2002", "payment_intent.amount_capturable_updated"))
    shop.kill_inside(doomed, lambda: shop.stats("stripe")["captures"] == 1, "the capture to reach Stripe")
    shop.fake("stripe", "/_fake/faults", {"mode": "none"})
    rescuer = shop.worker("rescuer-capture")
    assert shop.wait_state("capture:pi_2002", "succeeded")["attempt"] == 2
    rescuer.send_signal(signal.SIGTERM)
    rescuer.wait(timeout=30)

    # EasyPost: the label is bought and the answer held; the rescuer finds it by reference.
    shop.fake("easypost", "/_fake/hold", {"hold": True})
    doomed = shop.worker("doomed-label")
    shop.send(intent_event("2002", "payment_intent.succeeded"))
    shop.kill_inside(doomed, lambda: shop.stats("easypost")["labels"] == 1, "the label to be bought")
    shop.fake("easypost", "/_fake/hold", {"hold": False})

    # Shopify: the rescuer gets past the label and is killed inside fulfillmentCreate in turn.
    shop.fake("shopify", "/_fake/hold", {"hold": True})
    doomed = shop.worker("doomed-fulfil")
    shop.kill_inside(doomed, lambda: shop.stats("shopify")["fulfillments"] == 1, "the fulfilment to be made")
    shop.fake("shopify", "/_fake/hold", {"hold": False})
    shop.worker("rescuer-ship")
    assert shop.wait_state("ship:2002", "succeeded")["attempt"] == 3
    assert shop.counts("2002") == (1, 1, 1)
    assert shop.stats("stripe")["replays"] == 1


def test_a_redrive_after_the_fulfilment_failed_makes_no_second_label(shop: Shop) -> None:
    shop.worker("worker")
    shop.send(intent_event("3003", "payment_intent.amount_capturable_updated"))
    shop.wait_state("capture:pi_3003", "succeeded")
    shop.fake("shopify", "/_fake/outage", {"outage": True})
    shop.send(intent_event("3003", "payment_intent.succeeded"))
    job = shop.wait_state("ship:3003", "failed")  # two attempts, both 503: the label was bought once
    assert shop.counts("3003") == (1, 1, 0)
    shop.fake("shopify", "/_fake/outage", {"outage": False})
    redrive = subprocess.run(
        [str(shop.installed.effectgate), "jobs", "redrive", str(job["id"])],
        cwd=shop.project,
        env=shop.env(),
        capture_output=True,
        text=True,
    )
    assert redrive.returncode == 0, redrive.stdout + redrive.stderr
    shop.wait_state("ship:3003", "succeeded")
    assert shop.counts("3003") == (1, 1, 1)


def test_a_reauthorisation_on_a_new_intent_is_captured_and_the_order_ships_once(shop: Shop) -> None:
    """An authorisation can be gone before its capture (canceled or expired:
    https://docs.stripe.com/payments/place-a-hold-on-a-payment-method), and the customer pays again on a
    new PaymentIntent for the same order. The capture is keyed per intent, so the new one is captured
    (keyed per order it was `rejected` and its hold lapsed); the shipment is keyed per order, so a second
    intent's success for a shipped order is a key conflict, recorded and never shipped."""
    shop.worker("worker")
    shop.fake("stripe", "/_fake/payment_intents", {"id": "pi_4004_lapsed", "status": "canceled"})
    lapsed = intent_event("4004", "payment_intent.amount_capturable_updated", intent="pi_4004_lapsed")
    assert shop.send(lapsed) == ["accepted"]
    shop.wait_state("capture:pi_4004_lapsed", "failed")  # Stripe refuses: payment_intent_unexpected_state

    assert shop.send(intent_event("4004", "payment_intent.amount_capturable_updated")) == ["accepted"]
    shop.wait_state("capture:pi_4004", "succeeded")
    assert shop.send(intent_event("4004", "payment_intent.succeeded")) == ["accepted"]
    shop.wait_state("ship:4004", "succeeded")
    paid_twice = intent_event("4004", "payment_intent.succeeded", intent="pi_4004_twice")
    assert shop.send(paid_twice) == ["rejected"]
    assert shop.counts("4004") == (1, 1, 1)
    assert shop.stats("stripe")["captures_by_intent"] == {"pi_4004": 1}
