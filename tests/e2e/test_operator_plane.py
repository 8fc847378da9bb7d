"""The operator plane attacked over real sockets: apart from the public listener, and throttled per
client through trusted forwarding only, without ever locking the right token out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .conftest import SECRET, event, headers
from .processes import Process, free_port

TOKEN = "e2e-operator-token-0123456789"
LIMIT = 5


@dataclass
class Gateway:
    process: Process
    public: str
    operator: str


def start(db_url: str, tmp: Path, extra: str = "", *args: str, apart: bool = True) -> Gateway:
    port, op_port = free_port(), free_port()
    config = tmp / "effectgate.toml"
    config.write_text(
        f"""
[sources.shop]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]

[[operators]]
name = "ops"
token_env = "E2E_OPERATOR_TOKEN"
scopes = ["operate"]

[operator]
{f'listen = "127.0.0.1:{op_port}"' if apart else ""}
throttle_limit = {LIMIT}

{extra}
"""
    )
    env = {
        "DATABASE_URL": db_url,
        "E2E_STRIPE_SECRET": SECRET,
        "E2E_OPERATOR_TOKEN": TOKEN,
        "EFFECTGATE_LOG_LEVEL": "INFO",
    }
    process = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port), *args], env, tmp / "serve.log"
    )
    gateway = Gateway(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{op_port if apart else port}")
    process.wait_http(f"{gateway.public}/readyz")
    return gateway


@pytest.fixture
def apart(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    gateway = start(db_url, tmp_path, "", "--workers", "2")
    try:
        yield gateway
    finally:
        gateway.process.stop()


OPERATOR_PATHS = ["/", "/ui/", "/ui/login", "/api/duplicates", "/api/openapi.json", "/metrics", "/nope"]


def test_the_public_listener_serves_webhooks_and_probes_only(apart: Gateway) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in OPERATOR_PATHS:
        for method in ("GET", "POST"):
            answer = httpx.request(method, apart.public + path, headers=bearer, timeout=10)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"] == "not_found"
    # A sign-in attempt never reaches the form reader on the public side.
    assert httpx.post(f"{apart.public}/ui/login", data={"token": TOKEN}, timeout=10).status_code == 404
    assert httpx.get(f"{apart.public}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{apart.public}/readyz", timeout=10).status_code == 200
    body = event("plane-1", "evt_plane_1")
    delivered = httpx.post(f"{apart.public}/webhooks/shop", content=body, headers=headers(body), timeout=30)
    assert delivered.status_code < 300, delivered.text


def test_the_operator_listener_serves_the_operator_plane_and_no_webhooks(apart: Gateway) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{apart.operator}/api/duplicates", headers=bearer, timeout=10).status_code == 200
    assert httpx.get(f"{apart.operator}/metrics", timeout=10).status_code == 200
    assert httpx.get(f"{apart.operator}/ui/login", timeout=10).status_code == 200
    assert httpx.get(f"{apart.operator}/healthz", timeout=10).status_code == 200
    body = event("plane-2", "evt_plane_2")
    misrouted = httpx.post(f"{apart.operator}/webhooks/shop", content=body, headers=headers(body), timeout=10)
    assert misrouted.status_code == 404
    # The operator listener has the same connection guard as the public one.
    big = httpx.get(f"{apart.operator}/healthz", headers={"X-Big": "a" * 20_000}, timeout=10)
    assert (big.status_code, big.json()["error"]) == (431, "header_too_large")


def _sign_in(base: str, token: str, forwarded: str | None = None) -> int:
    extra = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    return httpx.post(f"{base}/ui/login", data={"token": token}, headers=extra, timeout=10).status_code


@pytest.mark.parametrize(
    ("trusted", "last_hop"),
    [
        # No proxy trusted (the default): X-Forwarded-For is the client's own writing and is ignored.
        ("", None),
        # The test is the trusted proxy; the real client is the address it appends. What the client
        # wrote before it rotates freely and must not matter.
        ('[gateway]\nforwarded_allow_ips = ["127.0.0.1"]', "203.0.113.9"),
        # Every hop trusted: the right-most hop (the nearest proxy's view) counts, not the left-most.
        ('[gateway]\nforwarded_allow_ips = ["*"]', "203.0.113.9"),
    ],
    ids=["untrusted-peer", "trusted-proxy", "trust-everyone"],
)
def test_rotating_x_forwarded_for_does_not_escape_the_throttle(
    db_url: str, tmp_path: Path, trusted: str, last_hop: str | None
) -> None:
    gateway = start(db_url, tmp_path, trusted, apart=False)
    try:
        statuses = []
        for i in range(LIMIT + 10):
            rotated = f"198.51.{i // 250}.{i % 250 + 1}"
            forwarded = rotated if last_hop is None else f"{rotated}, {last_hop}"
            statuses.append(_sign_in(gateway.operator, f"wrong-{i:04}-0123456789", forwarded))
        assert statuses == [401] * LIMIT + [429] * 10
        bearer = {"Authorization": "Bearer wrong-token-0123456789", "X-Forwarded-For": "192.0.2.77"}
        api = httpx.get(f"{gateway.operator}/api/duplicates", headers=bearer, timeout=10)
        if last_hop is None:
            # One client, whatever it writes: the API shares the sign-in's count.
            assert (api.status_code, api.json()["error"]) == (429, "too_many_failures")
            assert int(api.headers["retry-after"]) >= 1
        # The right token from the throttled client still signs in: no one is locked out.
        forwarded = "192.0.2.1" if last_hop is None else f"192.0.2.1, {last_hop}"
        assert _sign_in(gateway.operator, TOKEN, forwarded) == 303
        right = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": forwarded}
        assert httpx.get(f"{gateway.operator}/api/duplicates", headers=right, timeout=10).status_code == 200
    finally:
        gateway.process.stop()


def test_behind_a_trusted_proxy_each_client_has_its_own_count(db_url: str, tmp_path: Path) -> None:
    gateway = start(db_url, tmp_path, '[gateway]\nforwarded_allow_ips = ["127.0.0.1"]', apart=False)
    try:
        attacker = [
            _sign_in(gateway.operator, f"wrong-{i}-0123456789", "203.0.113.9") for i in range(LIMIT + 3)
        ]
        assert attacker[-1] == 429
        # Another client behind the same proxy is not throttled by the attacker's failures.
        assert _sign_in(gateway.operator, "honest-typo-0123456789", "203.0.113.10") == 401
        # A bearer-API flood from one client is throttled as sign-ins are.
        wrong = {"Authorization": "Bearer wrong-token-0123456789", "X-Forwarded-For": "203.0.113.11"}
        api = [
            httpx.get(f"{gateway.operator}/api/duplicates", headers=wrong, timeout=10).status_code
            for _ in range(LIMIT + 3)
        ]
        assert api == [401] * LIMIT + [429] * 3
    finally:
        gateway.process.stop()
