"""Declared HTTP effects (issue 22): key templates from the signed payload, the Standard Webhooks signature
(checked with the ``standardwebhooks`` library), the answer mapping, redirects and the answer cap, and
``[effects.NAME]`` validated at start-up with file and key named."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import respx
import standardwebhooks

from effectgate.gateway.config import ConfigError, load, parse
from effectgate.gateway.config.handler_imports import import_handlers
from effectgate.handlers.downstream.forward import ForwardTarget, KeyTemplate, post_signed, register_declared
from effectgate.handlers.errors import TerminalError, TransientError
from effectgate.handlers.event import Event
from effectgate.handlers.plan import PlanFailed, plan_event
from effectgate.handlers.registry import REGISTRY, Registry

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
URL = "http://127.0.0.1:9/hooks/order-paid"
ENV = {"S1": "whsec_one", "ORDERS_SECRET": SECRET}
CONFIG = """
[sources.shop]
scheme = "standard-webhooks"
secrets = ["S1"]

[effects.order-paid]
source = "shop"
events = ["order.paid"]
key = "order-paid:{/data/order_id}"
lock_key = "order:{/data/order_id}"
fingerprint = ["/data/amount"]

[effects.order-paid.forward]
url = "http://127.0.0.1:9/hooks/order-paid"
secret_env = "ORDERS_SECRET"
"""


def test_template_renders_signed_payload_fields_and_refuses_what_it_cannot_fill() -> None:
    template = KeyTemplate("order-paid:{/data/order_id}:{/data/n}")
    assert template.render({"data": {"order_id": "o_1", "n": 3}}) == "order-paid:o_1:3"
    for payload in (
        {"data": {"n": 3}},
        {"data": {"order_id": True, "n": 1}},
        {"data": {"order_id": {}, "n": 1}},
    ):
        with pytest.raises(ValueError, match="key template"):
            template.render(payload)
    for bad in ("no-fields", "a:{data}", "a:{/x", "a:}{/x}"):
        with pytest.raises(ValueError):
            KeyTemplate(bad)


def test_declared_effect_plans_like_a_python_effect_and_an_unfillable_key_fails_the_plan() -> None:
    config = parse(CONFIG, path="eg.toml", env=ENV, role="gateway")
    (declared,) = config.effects
    assert declared.forward.secret is None  # the gateway never forwards, so it reads no secret
    registry = Registry()
    register_declared(registry, declared)
    register_declared(registry, declared)  # loading the configuration twice is no second registration
    event = Event("shop", "evt_1", "order.paid", {"data": {"order_id": "o_1", "amount": 5}})
    (request,) = plan_event(registry, event).effects
    assert (request.effect_key, request.handler, request.lock_key) == (
        "order-paid:o_1",
        "order-paid",
        "order:o_1",
    )
    assert request.fingerprint is not None
    with pytest.raises(PlanFailed):
        plan_event(registry, Event("shop", "evt_2", "order.paid", {"data": {}}))


def test_a_declared_name_taken_by_a_python_handler_is_refused_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "clash_handlers.py").write_text(
        "from effectgate.handlers.registry import effect\n"
        "@effect(source='shop', events=['order.paid'], name='order-paid')\n"
        "async def handle(ctx, event):\n    return None\n"
    )
    config_file = tmp_path / "effectgate.toml"
    config_file.write_text('[handlers]\nmodules = ["clash_handlers"]\n' + CONFIG)
    config = load(config_file, env=ENV)
    REGISTRY.clear()
    try:
        with pytest.raises(
            ConfigError, match=r"effects.order-paid: effect 'order-paid' is already registered"
        ):
            import_handlers(config)
    finally:
        REGISTRY.clear()
        sys.modules.pop("clash_handlers", None)


def test_loading_the_configuration_twice_registers_each_declared_effect_once() -> None:
    registry = Registry()
    for _ in range(2):
        register_declared(registry, parse(CONFIG, path="eg.toml", env=ENV).effects[0])
    assert [k.name for k in registry.kinds()] == ["order-paid"]


def test_worker_reads_the_secret_and_every_mistake_is_named_by_file_and_key() -> None:
    assert parse(CONFIG, path="eg.toml", env=ENV, role="worker").effects[0].forward.secret == SECRET
    with pytest.raises(
        ConfigError,
        match=r"eg.toml: effects.order-paid.forward.secret_env: environment variable ORDERS_SECRET",
    ):
        parse(CONFIG, path="eg.toml", env={"S1": "whsec_one"}, role="worker")
    broken = (
        CONFIG.replace('source = "shop"', 'source = "shpo"')
        .replace('{/data/order_id}"\nlock', '{data}"\nlock')
        .replace(
            'secret_env = "ORDERS_SECRET"',
            'secret_env = "ORDERS_SECRET"\ntimeout = -1\nretry_statuses = [200]\nurll = "x"',
        )
    )
    with pytest.raises(ConfigError) as caught:
        parse(broken, path="eg.toml", env=ENV, role="worker")
    problems = "\n".join(caught.value.problems)
    assert "eg.toml: effects.order-paid.source: 'shpo' is not a configured source" in problems
    assert "eg.toml: effects.order-paid.key: " in problems
    assert "eg.toml: effects.order-paid.forward.timeout: must be >= 0.001" in problems
    assert "eg.toml: effects.order-paid.forward.retry_statuses: " in problems
    assert "eg.toml: effects.order-paid.forward.urll: is not a known setting; did you mean 'url'?" in problems
    no_forward = CONFIG.split("[effects.order-paid.forward]")[0]
    with pytest.raises(ConfigError, match=r"effects.order-paid.forward: is required"):
        parse(no_forward, path="eg.toml", env=ENV)


def test_a_declared_effect_sets_its_own_retry_budget_and_a_cap_below_its_base_is_named() -> None:
    own = CONFIG.replace(
        'fingerprint = ["/data/amount"]',
        'fingerprint = ["/data/amount"]\nmax_attempts = 30\nbackoff_base = 5\nbackoff_cap = 900',
    )
    kind = parse(own, path="eg.toml", env=ENV).effects[0].kind()
    assert (kind.max_attempts, kind.backoff_base, kind.backoff_cap) == (30, 5, 900)
    inherits = parse(CONFIG, path="eg.toml", env=ENV).effects[0].kind()
    assert (inherits.backoff_base, inherits.backoff_cap) == (None, None)
    with pytest.raises(ConfigError) as caught:
        parse(own.replace("backoff_cap = 900", "backoff_cap = 1"), path="eg.toml", env=ENV)
    assert "eg.toml: effects.order-paid: effect 'order-paid': backoff_cap must be >= backoff_base" in str(
        caught.value
    )
    with pytest.raises(ConfigError, match=r"effects.order-paid.backoff_base: must be >= 0.001"):
        parse(own.replace("backoff_base = 5", "backoff_base = 0"), path="eg.toml", env=ENV)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


TARGET = ForwardTarget(url=URL, secret=SECRET, max_answer_bytes=64)


@pytest.mark.anyio
@respx.mock
async def test_request_is_signed_for_standard_webhooks_libraries_and_2xx_is_recorded(
    http: httpx.AsyncClient,
) -> None:
    route = respx.post(URL).mock(return_value=httpx.Response(201, json={"done": 1}))
    answer = await post_signed(http, TARGET, "eg_key", b'{"event":{}}')
    assert answer == {"status": 201, "body": {"done": 1}, "truncated": False}
    request = route.calls.last.request
    assert request.headers["Idempotency-Key"] == request.headers["webhook-id"] == "eg_key"
    # The reference library verifies what we signed: a receiver in any language can.
    standardwebhooks.Webhook(SECRET).verify(request.content, dict(request.headers))


@pytest.mark.anyio
@respx.mock
@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 503])
async def test_retryable_answers_are_transient_and_honour_retry_after(
    http: httpx.AsyncClient, status: int
) -> None:
    respx.post(URL).mock(return_value=httpx.Response(status, headers={"Retry-After": "7"}, text="busy"))
    with pytest.raises(TransientError) as caught:
        await post_signed(http, TARGET, "eg_key", b"{}")
    assert caught.value.retry_after == 7.0


@pytest.mark.anyio
@respx.mock
@pytest.mark.parametrize("status", [302, 400, 418, 422])
async def test_other_answers_are_terminal_with_the_answer_and_redirects_are_not_followed(
    http: httpx.AsyncClient, status: int
) -> None:
    respx.post(URL).mock(
        return_value=httpx.Response(
            status, headers={"Location": "http://elsewhere.example/"}, json={"why": "no"}
        )
    )
    other = respx.post("http://elsewhere.example/").mock(return_value=httpx.Response(200))
    with pytest.raises(TerminalError) as caught:
        await post_signed(http, TARGET, "eg_key", b"{}")
    assert caught.value.code == f"http_{status}"
    assert '{"why":"no"}' in str(caught.value).replace(" ", "")
    assert not other.called


@pytest.mark.anyio
@respx.mock
async def test_the_mapping_is_configurable_and_transport_errors_are_transient(
    http: httpx.AsyncClient,
) -> None:
    # A service whose 409 is a conflict no retry resolves takes 409 out (docs/forwarding.md); a 418 goes in.
    custom = ForwardTarget(url=URL, secret=SECRET, retry_statuses=frozenset({418}))
    respx.post(URL).mock(return_value=httpx.Response(418))
    with pytest.raises(TransientError):
        await post_signed(http, custom, "k", b"{}")
    respx.post(URL).mock(return_value=httpx.Response(409))
    with pytest.raises(TerminalError):
        await post_signed(http, custom, "k", b"{}")
    respx.post(URL).mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(TransientError):
        await post_signed(http, TARGET, "k", b"{}")


@pytest.mark.anyio
@respx.mock
async def test_an_answer_past_the_cap_is_cut_and_marked(http: httpx.AsyncClient) -> None:
    respx.post(URL).mock(return_value=httpx.Response(200, content=json.dumps({"x": "y" * 500}).encode()))
    answer = await post_signed(http, TARGET, "k", b"{}")
    assert answer["truncated"] is True
    assert len(answer["body"]) == 64


def test_secrets_and_targets_are_checked_at_construction() -> None:
    for bad in ({"url": "ftp://x"}, {"url": URL, "timeout": 0}, {"url": URL, "secret": "whsec_!!"}):
        with pytest.raises(ValueError):
            ForwardTarget(**bad)  # type: ignore[arg-type]
    assert SECRET not in repr(TARGET)
