"""The operator surface over real processes: ``effectgate serve`` answering the API, ``/metrics`` and the
dashboard, the dashboard driven in headless Chromium over the DevTools protocol.

Chromium is Debian's ``chromium`` package, which ``.ci/run`` installs. If it is missing, the fixture installs
it with apt-get (as root); where no browser can be had the test fails, saying so: a skipped browser test
would let the dashboard break unseen.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from effectgate.gateway.operator.auth import hash_token
from effectgate.ledger import db
from tests.integration.reports_seed import NOW, deliver, paid, seeded_database

from .processes import Process, free_port

pytestmark = pytest.mark.anyio

VIEW_TOKEN = "e2e-view-token-0123456789"
OPERATE_TOKEN = "e2e-operate-token-0123456789"
INSTALL_SECONDS = 600
# Deadlines, not waits: on a loaded machine a page or the browser only takes longer to come.
BROWSER_START_SECONDS = 120
SETTLE_SECONDS = 60
# What DevTools answers to a script sent while the page it was meant for is being replaced.
NAVIGATING = (
    "Execution context was destroyed",
    "Cannot find context with specified id",
    "Inspected target navigated",
)


@dataclass
class Gateway:
    url: str
    db_url: str


@pytest.fixture
def gateway(pg_server_url: str, template_db: str, tmp_path: Path) -> Iterator[Gateway]:
    """``effectgate serve`` with two operators, over a seeded ledger of its own."""
    config = tmp_path / "effectgate.toml"
    # The seeded ledger lies in 2025: a reconciler on the real clock would repair it under the test.
    config.write_text(
        f"""
[gateway]
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]

[[operators]]
name = "viewer"
token_env = "E2E_VIEW_TOKEN"
scopes = ["view"]

[[operators]]
name = "oncall"
token_sha256 = "{hash_token(OPERATE_TOKEN)}"
scopes = ["view", "operate"]
"""
    )
    port = free_port()
    with seeded_database(pg_server_url, template_db) as db_url:
        env = {"DATABASE_URL": db_url, "E2E_STRIPE_SECRET": "whsec_e2e", "E2E_VIEW_TOKEN": VIEW_TOKEN}
        process = Process(
            ["serve", "--config", str(config), "--no-migrate", "--port", str(port)],
            env,
            tmp_path / "gateway.log",
        )
        try:
            process.wait_http(f"http://127.0.0.1:{port}/readyz")
            yield Gateway(f"http://127.0.0.1:{port}", db_url)
        finally:
            process.stop()
        log = process.log_path.read_text(errors="replace")
        for token in (VIEW_TOKEN, OPERATE_TOKEN):
            assert token not in log, "an operator token reached the gateway log"


async def test_the_api_and_metrics_of_a_real_gateway(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        view = {"Authorization": f"Bearer {VIEW_TOKEN}"}
        body = (await client.get("/api/effects/order-paid:1234", headers=view)).json()
        assert [s["idempotency_key"] for s in body["steps"]] == ["eg_capture_key"]
        failed = (await client.get("/api/jobs?state=failed", headers=view)).json()["items"][0]["id"]
        forbidden = await client.post(f"/api/jobs/{failed}/redrive", headers=view)
        assert (forbidden.status_code, forbidden.json()["error"]) == (403, "insufficient_scope")
        done = await client.post(
            f"/api/jobs/{failed}/redrive", headers={"Authorization": f"Bearer {OPERATE_TOKEN}"}
        )
        assert done.json() == {"job_id": failed, "state": "pending"}
        metrics = await client.get("/metrics")
        assert "effectgate_ledger_up 1" in metrics.text
        assert 'effectgate_jobs{state="pending",kind="fulfil_order"} 1' in metrics.text


# -- the browser -----------------------------------------------------------------------------------


def find_or_install_chromium() -> str | None:
    found = shutil.which("chromium")
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(
            ["apt-get", "update"], env=env, capture_output=True, timeout=INSTALL_SECONDS, check=False
        )
        subprocess.run(
            ["apt-get", "install", "-y", "chromium"],
            env=env,
            capture_output=True,
            timeout=INSTALL_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_or_install_chromium()
    if path is None:
        pytest.fail(
            "no Chromium here and none could be installed: install Debian's chromium "
            "(apt-get install chromium, as root), as .ci/run does"
        )
    return path


@pytest.fixture
def devtools_page(chromium_path: str, tmp_path: Path) -> Iterator[str]:
    """A headless Chromium; yields the DevTools WebSocket URL of its blank page."""
    port = free_port()
    log = (tmp_path / "chromium.log").open("wb")
    browser = subprocess.Popen(
        [
            chromium_path,
            "--headless=new",
            "--no-sandbox",  # running as root in a container
            "--disable-gpu",
            "--no-first-run",
            # The machine has no network but loopback: Chromium's own background traffic only fails slowly.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            f"--remote-debugging-port={port}",
            f"--user-data-dir={tmp_path / 'profile'}",
            "about:blank",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + BROWSER_START_SECONDS
        while True:
            try:
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=1).json()
                pages = [t for t in targets if t["type"] == "page"]
                if pages:
                    yield pages[0]["webSocketDebuggerUrl"]
                    break
            except httpx.TransportError:
                pass
            if browser.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"Chromium did not start:\n{(tmp_path / 'chromium.log').read_text(errors='replace')}"
                )
            time.sleep(0.1)
    finally:
        browser.terminate()
        try:
            browser.wait(timeout=10)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait()
        log.close()


class Page:
    """The DevTools protocol, just enough of it: run script in the page, wait for navigations."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        await self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        with anyio.fail_after(SETTLE_SECONDS):
            while True:
                message = json.loads(await self.ws.recv())
                if message.get("id") == my_id:
                    if "error" in message:
                        raise AssertionError(f"{method}: {message['error']}")
                    result: dict[str, Any] = message["result"]
                    return result

    async def eval(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def settle(self, action: str) -> str:
        """Run ``action`` (script that navigates) and wait until the next document has loaded."""
        await self.eval("window.__old_document = true")
        await self.eval(action)
        with anyio.fail_after(SETTLE_SECONDS):
            while True:
                # Asked mid-navigation, the old document's script context may be gone before the new
                # one exists: that answer is "not yet", not a failure.
                try:
                    loaded = await self.eval("!window.__old_document && document.readyState === 'complete'")
                except AssertionError as exc:
                    if not any(gone in str(exc) for gone in NAVIGATING):
                        raise
                    loaded = False
                if loaded:
                    return str(await self.eval("location.pathname + location.search"))
                await anyio.sleep(0.05)

    async def goto(self, url: str) -> str:
        return await self.settle(f"location.href = {json.dumps(url)}")

    async def text(self) -> str:
        return str(await self.eval("document.body.innerText"))


@pytest.fixture
async def page(devtools_page: str) -> AsyncIterator[Page]:
    async with connect(devtools_page, max_size=2**24) as ws:
        yield Page(ws)


async def test_an_operator_answers_the_three_questions_and_redrives_in_the_browser(
    gateway: Gateway, page: Page
) -> None:
    window = "since=2025-03-03T12:00:00Z&until=2025-03-04T12:00:00Z"
    assert await page.goto(f"{gateway.url}/ui/duplicates?{window}&source=stripe") == (
        "/ui/login?next=%2Fui%2Fduplicates%3Fsince%3D2025-03-03T12%3A00%3A00Z%26until%3D2025-03-04T12%3A00%3A00Z"
        "%26source%3Dstripe"
    )
    landed = await page.settle(
        f"document.querySelector('input[name=token]').value = {json.dumps(OPERATE_TOKEN)};"
        "document.querySelector('form').submit()"
    )
    assert landed.startswith("/ui/duplicates?")
    # Which webhooks did Stripe send twice that day?
    text = await page.text()
    assert "order-paid:1234" in text and "ship:9" not in text

    # What was rejected and why?
    await page.goto(f"{gateway.url}/ui/rejects?{window}")
    text = await page.text()
    assert "/data/object/amount changed: 1000 → 999" in text
    assert "signature_invalid" in text

    # Did order 1234's capture happen, with which key, and what did the provider answer?
    await page.goto(f"{gateway.url}/ui/")
    await page.goto(f"{gateway.url}/ui/effects/order-paid%3A1234")
    steps = await page.eval(
        "[...document.querySelectorAll('table')[1].rows].slice(1).map(r => [...r.cells].map(c => c.innerText))"
    )
    assert steps[0][:3] == ["capture", "succeeded", "eg_capture_key"]
    assert json.loads(steps[0][3]) == {"id": "pi_1234", "status": "succeeded"}

    # The charts are drawn by the server: three SVGs, one bar per hour.
    await page.goto(f"{gateway.url}/ui/?{window}")
    assert await page.eval("document.querySelectorAll('svg').length") == 3
    assert await page.eval("document.querySelectorAll('svg rect').length") == 72

    # Redrive the failed job with its button.
    await page.goto(f"{gateway.url}/ui/jobs?state=failed")
    landed = await page.settle("document.querySelector('button[name=redrive]').click()")
    assert landed.endswith("?done=redriven")
    assert "Redriven: the job is pending again." in await page.text()
    assert "pending" in await page.eval(
        "document.querySelector('table:not(:first-of-type), table').innerText"
    )


# -- at 1280 px ------------------------------------------------------------------------------------

SCREEN_WIDTH = 1280


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: EFFECTGATE_SCREENSHOTS (to keep and look at), else the test's tmp dir."""
    directory = Path(os.environ.get("EFFECTGATE_SCREENSHOTS") or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def test_every_page_fits_a_1280_px_screen_and_is_photographed(
    gateway: Gateway, page: Page, shots: Path
) -> None:
    """Each page at 1280 px: nothing wider than the screen, photographed for a human to look at."""
    window = "since=2025-03-03T12:00:00Z&until=2025-03-04T12:00:00Z"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        root = await client.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")
        view = {"Authorization": f"Bearer {VIEW_TOKEN}"}
        failed = (await client.get("/api/jobs?state=failed", headers=view)).json()["items"][0]["id"]
    # One effect whose key and event id are long single words, delivered twice: the tables must still fit.
    long_key = "order-paid:" + "9" * 240
    conn = await db.connect(gateway.db_url)
    async with conn:
        for _ in range(2):
            await deliver(
                conn, paid("9" * 240), long_key, NOW - timedelta(hours=6), event_id="evt_" + "x" * 120
            )
    await page.call(
        "Emulation.setDeviceMetricsOverride",
        width=SCREEN_WIDTH,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    await page.goto(f"{gateway.url}/ui/login")
    await page.settle(
        f"document.querySelector('input[name=token]').value = {json.dumps(OPERATE_TOKEN)};"
        "document.querySelector('form').submit()"
    )
    pages = {
        "overview": f"/ui/?{window}",
        "rejects": f"/ui/rejects?{window}",
        "failed-job": f"/ui/jobs/{failed}",
        "effect": "/ui/effects/order-paid%3A1234",
        "duplicates": f"/ui/duplicates?{window}",
        "jobs": "/ui/jobs",
        "delivery-outcomes": f"/ui/delivery-outcomes?{window}",
    }
    widths = {}
    for name, path in pages.items():
        assert await page.goto(gateway.url + path) == path
        # The stylesheet is loaded under the CSP (no inline style is allowed): the header is dark.
        assert await page.eval("getComputedStyle(document.querySelector('header')).backgroundColor") == (
            "rgb(29, 35, 48)"
        )
        widths[name] = await page.eval(
            "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        )
        height = await page.eval("document.documentElement.scrollHeight")
        shot = await page.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": SCREEN_WIDTH, "height": min(height, 6000), "scale": 1},
        )
        (shots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    assert {name: w for name, w in widths.items() if w > SCREEN_WIDTH} == {}, widths

    # A failed job's error reads as type, message and a folded traceback, not as escaped JSON.
    await page.goto(f"{gateway.url}/ui/jobs/{failed}")
    assert await page.eval("document.querySelector('.errorbox .type').innerText") == "TerminalError"
    assert "card declined" in await page.eval("document.querySelector('.errorbox').innerText")
    assert await page.eval("document.querySelector('.errorbox details').open") is False
    assert "most recent call last" in await page.eval("document.querySelector('.errorbox pre').textContent")
    assert "{" not in await page.eval("document.querySelector('.errorbox').innerText")

    # The overview puts what needs a human first, then the rates.
    await page.goto(f"{gateway.url}/ui/?{window}")
    cards = await page.eval(
        "[...document.querySelectorAll('.card')].map(c => c.innerText.replace(/\\s+/g, ' '))"
    )
    assert cards[:2] == ["1 failed jobs", "0 parked jobs"]
    rates = await page.eval(
        "[...document.querySelectorAll('table')[0].rows].slice(1).map(r => [...r.cells].map(c => c.innerText))"
    )
    assert [r[0] for r in rates] == ["stripe", "shopify"]
    assert rates[0][8].strip() == "42.9 %"  # duplicates / deliveries for stripe: 3 of 7 (after refused)
