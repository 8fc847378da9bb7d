"""The operator API over the real app and a real ledger: auth, every answer validated against the
OpenAPI document it serves, job control, and the JSON error shape for every bad parameter."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import quote

import httpx
import pytest
from openapi_spec_validator import validate as validate_openapi

from effectgate.gateway.app import create_app
from effectgate.gateway.bodies import MAX_OPERATOR_BODY_BYTES
from effectgate.gateway.config import parse
from effectgate.gateway.operator import documents, reporting
from effectgate.gateway.operator.openapi import DOCUMENT
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.reports.spec import ReportQuery
from tests.integration.gateway.operator.operator_app import (
    CONFIG,
    OPERATE,
    OPERATE_TOKEN,
    VIEW,
    VIEW_TOKEN,
    check,
    gateway,
)
from tests.integration.reports_seed import NOW, seed

pytestmark = pytest.mark.anyio

WINDOW = f"since={quote((NOW - timedelta(hours=24)).isoformat())}&until={quote(NOW.isoformat())}"


@pytest.fixture
async def api(seeded_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app over the module's seeded ledger; tests using it only read."""
    async with gateway(seeded_url) as client:
        yield client


def test_the_document_is_valid_openapi_3_1() -> None:
    validate_openapi(DOCUMENT)
    assert DOCUMENT["openapi"].startswith("3.1")


def test_every_route_is_documented_and_every_documented_path_is_routed() -> None:
    app = create_app(parse(CONFIG, env={"STRIPE_SECRET": "x", "VIEW_TOKEN": VIEW_TOKEN}), Registry(), "")
    mount = next(r for r in app.routes if getattr(r, "path", "") == "/api")
    routed = {
        ("/api" + r.path.replace("{key:path}", "{key}"), method.lower())
        for r in mount.routes  # type: ignore[attr-defined]
        for method in r.methods - {"HEAD"}
    }
    documented = {(path, method) for path, ops in DOCUMENT["paths"].items() for method in ops}
    assert routed == documented


async def test_every_documented_answer_is_real_and_matches_the_document(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    done, failed = ids["order-paid:1234"], ids["order-paid:1"]
    # A second failed job, for the resolutions (the first is redriven and cancelled below).
    [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={"ship_order": 30}, limit=1)
    await jobs.finish(conn, lease.job_id, lease.lease_token, state="failed", by="w")
    unresolved = lease.job_id
    seen: set[tuple[str, str, str]] = set()
    cases: list[tuple[str, str, str, dict[str, str] | None, int]] = [
        ("get", "/api/openapi.json", "/api/openapi.json", VIEW, 200),
        ("get", "/api/openapi.json", "/api/openapi.json", None, 401),
        ("get", f"/api/duplicates?{WINDOW}", "/api/duplicates", VIEW, 200),
        ("get", "/api/duplicates?limit=0", "/api/duplicates", VIEW, 400),
        ("get", "/api/duplicates", "/api/duplicates", None, 401),
        ("get", f"/api/rejects/conflicts?{WINDOW}", "/api/rejects/conflicts", VIEW, 200),
        ("get", "/api/rejects/conflicts?sort=amount", "/api/rejects/conflicts", VIEW, 400),
        ("get", "/api/rejects/conflicts", "/api/rejects/conflicts", {"Authorization": "Bearer nope"}, 401),
        ("get", f"/api/rejects/auth?{WINDOW}", "/api/rejects/auth", OPERATE, 200),
        ("get", "/api/rejects/auth?tenant=acme", "/api/rejects/auth", VIEW, 400),
        ("get", "/api/rejects/auth", "/api/rejects/auth", {"Authorization": "Basic eDp5"}, 401),
        ("get", "/api/effects/order-paid:1234", "/api/effects/{key}", VIEW, 200),
        ("get", "/api/effects/order-paid:9", "/api/effects/{key}", VIEW, 404),
        ("get", "/api/effects/order-paid:1234?tenant=", "/api/effects/{key}", VIEW, 400),
        ("get", "/api/effects/order-paid:1234", "/api/effects/{key}", None, 401),
        ("get", "/api/jobs?state=failed,parked", "/api/jobs", VIEW, 200),
        ("get", "/api/jobs?state=done", "/api/jobs", VIEW, 400),
        ("get", "/api/jobs", "/api/jobs", None, 401),
        ("get", f"/api/jobs/{done}", "/api/jobs/{job_id}", VIEW, 200),
        ("get", "/api/jobs/999999", "/api/jobs/{job_id}", VIEW, 404),
        ("get", "/api/jobs/abc", "/api/jobs/{job_id}", VIEW, 400),
        ("get", f"/api/jobs/{done}", "/api/jobs/{job_id}", None, 401),
        ("post", f"/api/jobs/{failed}/redrive", "/api/jobs/{job_id}/redrive", OPERATE, 200),
        ("post", f"/api/jobs/{done}/redrive", "/api/jobs/{job_id}/redrive", OPERATE, 409),
        ("post", "/api/jobs/999999/redrive", "/api/jobs/{job_id}/redrive", OPERATE, 404),
        ("post", f"/api/jobs/{failed}/redrive?force=maybe", "/api/jobs/{job_id}/redrive", OPERATE, 400),
        ("post", f"/api/jobs/{failed}/redrive", "/api/jobs/{job_id}/redrive", None, 401),
        ("post", f"/api/jobs/{failed}/redrive", "/api/jobs/{job_id}/redrive", VIEW, 403),
        ("post", f"/api/jobs/{failed}/cancel", "/api/jobs/{job_id}/cancel", OPERATE, 200),
        ("post", f"/api/jobs/{done}/cancel", "/api/jobs/{job_id}/cancel", OPERATE, 409),
        ("post", "/api/jobs/999999/cancel", "/api/jobs/{job_id}/cancel", OPERATE, 404),
        ("post", "/api/jobs/0/cancel", "/api/jobs/{job_id}/cancel", OPERATE, 400),
        ("post", f"/api/jobs/{failed}/cancel", "/api/jobs/{job_id}/cancel", None, 401),
        ("post", f"/api/jobs/{failed}/cancel", "/api/jobs/{job_id}/cancel", VIEW, 403),
        (
            "post",
            f"/api/jobs/{unresolved}/resolve?reason=by%20hand",
            "/api/jobs/{job_id}/resolve",
            OPERATE,
            200,
        ),
        ("post", f"/api/jobs/{done}/resolve?reason=x", "/api/jobs/{job_id}/resolve", OPERATE, 409),
        ("post", "/api/jobs/999999/resolve?reason=x", "/api/jobs/{job_id}/resolve", OPERATE, 404),
        ("post", f"/api/jobs/{unresolved}/resolve", "/api/jobs/{job_id}/resolve", OPERATE, 400),
        ("post", f"/api/jobs/{unresolved}/resolve?reason=x", "/api/jobs/{job_id}/resolve", None, 401),
        ("post", f"/api/jobs/{unresolved}/resolve?reason=x", "/api/jobs/{job_id}/resolve", VIEW, 403),
        ("post", "/api/jobs/resolve?state=failed&dry_run=true&reason=x", "/api/jobs/resolve", OPERATE, 200),
        ("post", "/api/jobs/resolve?state=failed", "/api/jobs/resolve", OPERATE, 400),
        ("post", "/api/jobs/resolve?state=failed&reason=x", "/api/jobs/resolve", None, 401),
        ("post", "/api/jobs/resolve?state=failed&reason=x", "/api/jobs/resolve", VIEW, 403),
        ("post", "/api/jobs/redrive?state=failed&dry_run=true", "/api/jobs/redrive", OPERATE, 200),
        ("post", "/api/jobs/redrive", "/api/jobs/redrive", OPERATE, 400),
        ("post", "/api/jobs/redrive?state=failed", "/api/jobs/redrive", None, 401),
        ("post", "/api/jobs/redrive?state=failed", "/api/jobs/redrive", VIEW, 403),
        ("post", "/api/jobs/cancel?kind=nope&source=stripe", "/api/jobs/cancel", OPERATE, 200),
        ("post", "/api/jobs/cancel?state=done", "/api/jobs/cancel", OPERATE, 400),
        ("post", "/api/jobs/cancel?kind=nope", "/api/jobs/cancel", None, 401),
        ("post", "/api/jobs/cancel?kind=nope", "/api/jobs/cancel", VIEW, 403),
        (
            "post",
            "/api/kinds/ship_order/pause?reason=carrier%20down",
            "/api/kinds/{kind}/pause",
            OPERATE,
            200,
        ),
        ("post", "/api/kinds/ship_order/pause?reason=%01", "/api/kinds/{kind}/pause", OPERATE, 400),
        ("post", "/api/kinds/ship_order/pause", "/api/kinds/{kind}/pause", None, 401),
        ("post", "/api/kinds/ship_order/pause", "/api/kinds/{kind}/pause", VIEW, 403),
        ("get", "/api/kinds/paused", "/api/kinds/paused", VIEW, 200),
        ("get", "/api/kinds/paused?kind=x", "/api/kinds/paused", VIEW, 400),
        ("get", "/api/kinds/paused", "/api/kinds/paused", None, 401),
        ("post", "/api/kinds/ship_order/resume", "/api/kinds/{kind}/resume", OPERATE, 200),
        ("post", "/api/kinds/ship_order/resume", "/api/kinds/{kind}/resume", OPERATE, 409),
        ("post", "/api/kinds/ship_order/resume?force=1", "/api/kinds/{kind}/resume", OPERATE, 400),
        ("post", "/api/kinds/ship_order/resume", "/api/kinds/{kind}/resume", None, 401),
        ("post", "/api/kinds/ship_order/resume", "/api/kinds/{kind}/resume", VIEW, 403),
    ]
    for spec in reports.REPORTS:
        # Every report, by its spec: a page, a bad parameter, and no token.
        path = "/api" + reporting.api_path(spec)
        cases += [
            ("get", f"{path}?{WINDOW}", path, VIEW, 200),
            ("get", f"{path}?limit=0", path, VIEW, 400),
            ("get", f"{path}?{spec.filters[0].name}=", path, VIEW, 400),
            ("get", path, path, None, 401),
        ]
    async with gateway(db_url) as client:
        for method, url, template, headers, status in cases:
            response = await client.request(method, url, headers=headers)
            assert response.status_code == status, (method, url, response.text)
            check(response, template, method)
            seen.add((template, method, str(status)))
    async with gateway(db_url, keep_open=False) as client:
        for template, ops in DOCUMENT["paths"].items():
            for method, op in ops.items():
                if "503" in op["responses"]:
                    url = template.replace("{key}", "k").replace("{job_id}", "1")
                    response = await client.request(method, url, headers=OPERATE)
                    assert response.status_code == 503
                    assert check(response, template, method)["error"] == "ledger_unavailable"
                    seen.add((template, method, "503"))
    async with gateway(db_url) as client:
        for template, ops in DOCUMENT["paths"].items():
            for method, op in ops.items():
                if "413" in op["responses"]:
                    url = template.replace("{key}", "k").replace("{job_id}", "1").replace("{kind}", "k")
                    too_big = b"x" * (MAX_OPERATOR_BODY_BYTES + 1)
                    response = await client.request(method, url, headers=OPERATE, content=too_big)
                    assert response.status_code == 413
                    assert check(response, template, method)["error"] == "payload_too_large"
                    seen.add((template, method, "413"))
        wrong = {"Authorization": "Bearer wrong-token-0123456789"}
        for _ in range(client._transport.app.state.auth_throttle.limit):  # type: ignore[attr-defined]
            assert (await client.get("/api/kinds/paused", headers=wrong)).status_code == 401
        for template, ops in DOCUMENT["paths"].items():
            for method, op in ops.items():
                if "429" in op["responses"]:
                    url = template.replace("{key}", "k").replace("{job_id}", "1").replace("{kind}", "k")
                    response = await client.request(method, url, headers=wrong)
                    assert response.status_code == 429
                    assert check(response, template, method)["error"] == "too_many_failures"
                    seen.add((template, method, "429"))
    documented = {
        (template, method, status)
        for template, ops in DOCUMENT["paths"].items()
        for method, op in ops.items()
        for status in op["responses"]
    }
    assert documented - seen == set(), "documented answers no test produced"


async def test_the_api_answers_exactly_what_the_report_says(api: httpx.AsyncClient, seeded: db.Conn) -> None:
    body = check(await api.get(f"/api/duplicates?{WINDOW}&source=stripe", headers=VIEW), "/api/duplicates")
    query = ReportQuery(since=NOW - timedelta(hours=24), until=NOW, filters={"source": "stripe"})
    page = await reports.run(seeded, reports.DUPLICATES, query)
    assert body == documents.jsonable(reporting.document(page))
    assert [i["effect_key"] for i in body["items"]] == ["order-paid:1234"]
    assert body["items"][0]["last_seen_at"] == "2025-03-04T11:00:00Z"


async def test_pages_follow_the_cursor(api: httpx.AsyncClient) -> None:
    url = f"/api/duplicates?{WINDOW}&limit=1"
    first = check(await api.get(url, headers=VIEW), "/api/duplicates")
    second = check(await api.get(f"{url}&cursor={first['next_cursor']}", headers=VIEW), "/api/duplicates")
    assert [i["effect_key"] for i in first["items"] + second["items"]] == ["order-paid:1234", "ship:9"]
    assert second["next_cursor"] is None


async def test_conflicts_carry_the_field_diff(api: httpx.AsyncClient) -> None:
    body = check(await api.get(f"/api/rejects/conflicts?{WINDOW}", headers=VIEW), "/api/rejects/conflicts")
    [item] = body["items"]
    assert item["diff"] == [
        {"path": "/coupon", "change": "added", "rejected": "X"},
        {"path": "/data/object/amount", "change": "changed", "held": 1000, "rejected": 999},
    ]


async def test_lineage_answers_did_the_capture_happen_with_which_key(api: httpx.AsyncClient) -> None:
    body = check(await api.get("/api/effects/order-paid%3A1234", headers=VIEW), "/api/effects/{key}")
    assert body["job"]["state"] == "succeeded"
    assert [d["outcome"] for d in body["deliveries"]] == ["accepted", "duplicate", "duplicate", "rejected"]
    [step] = body["steps"]
    assert (step["name"], step["idempotency_key"], step["result"]["status"]) == (
        "capture",
        "eg_capture_key",
        "succeeded",
    )
    acme = check(await api.get("/api/effects/ship:9?tenant=acme", headers=VIEW), "/api/effects/{key}")
    assert acme["effect"]["tenant"] == "acme"


@pytest.mark.parametrize(
    ("url", "code", "parameter"),
    [
        ("/api/duplicates?sorce=stripe", "unknown_parameter", "sorce"),
        ("/api/duplicates?source=a&source=b", "invalid_source", "source"),
        ("/api/duplicates?since=yesterday", "invalid_since", "since"),
        ("/api/duplicates?since=1h&until=2h", "invalid_until", "until"),
        ("/api/duplicates?limit=5000", "invalid_limit", "limit"),
        ("/api/duplicates?cursor=abc", "invalid_cursor", "cursor"),
        ("/api/duplicates?event_type=", "invalid_event_type", "event_type"),
        ("/api/rejects/conflicts?tenant=%00", "invalid_tenant", "tenant"),
        ("/api/rejects/auth?limit=x", "invalid_limit", "limit"),
        ("/api/jobs?sort=-last_seen", "invalid_sort", "sort"),
        ("/api/jobs?kind=", "invalid_kind", "kind"),
        ("/api/jobs/-1", "invalid_job_id", "job_id"),
    ],
)
async def test_every_bad_parameter_is_a_400_naming_it(
    api: httpx.AsyncClient, url: str, code: str, parameter: str
) -> None:
    response = await api.get(url, headers=VIEW)
    assert response.status_code == 400
    assert response.json()["error"] == code
    assert response.json()["parameter"] == parameter


async def test_authentication_comes_before_parameters(api: httpx.AsyncClient) -> None:
    response = await api.get("/api/duplicates?limit=nonsense")
    assert response.status_code == 401
    assert response.json()["error"] == "missing_token"
    assert response.headers["www-authenticate"] == 'Bearer realm="effectgate"'
    response = await api.get("/api/duplicates", headers={"Authorization": f"Bearer {VIEW_TOKEN}x"})
    assert (response.status_code, response.json()["error"]) == (401, "invalid_token")
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


async def test_wrong_bearer_tokens_are_throttled_but_never_the_right_one(api: httpx.AsyncClient) -> None:
    limit = api._transport.app.state.auth_throttle.limit  # type: ignore[attr-defined]
    statuses = []
    for i in range(limit + 40):
        wrong = {"Authorization": f"Bearer guess-{i:05}-0123456789"}
        statuses.append((await api.get("/api/duplicates", headers=wrong)).status_code)
    assert statuses == [401] * limit + [429] * 40
    throttled = await api.get("/api/openapi.json", headers={"Authorization": "Bearer guess-again-0123456789"})
    body = check(throttled, "/api/openapi.json")
    assert body["error"] == "too_many_failures"
    assert 0 < int(throttled.headers["retry-after"]) <= 300
    # From the same address, the right token is still let in, and a missing one is not a guess.
    assert (await api.get("/api/duplicates", headers=VIEW)).status_code == 200
    assert (await api.get("/api/openapi.json", headers=OPERATE)).status_code == 200
    assert (await api.get("/api/duplicates")).status_code == 401


async def test_tokens_never_reach_the_logs(
    db_url: str, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await seed(conn)
    caplog.set_level(logging.DEBUG)
    async with gateway(db_url) as client:
        await client.post(f"/api/jobs/{ids['order-paid:1']}/redrive", headers=OPERATE)
        await client.post(f"/api/jobs/{ids['order-paid:1']}/cancel", headers=VIEW)
        await client.get("/api/duplicates", headers={"Authorization": "Bearer wrong-token-guess"})
    logged = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert "operator.redrive" in logged and "admin" in logged
    for secret in (OPERATE_TOKEN, VIEW_TOKEN, "wrong-token-guess"):
        assert secret not in logged


async def test_redrive_and_cancel_act_on_the_ledger(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    failed, pending = ids["order-paid:1"], ids["ship:9"]
    async with gateway(db_url) as client:
        response = await client.post(f"/api/jobs/{failed}/redrive?force=false", headers=OPERATE)
        assert check(response, "/api/jobs/{job_id}/redrive", "post") == {"job_id": failed, "state": "pending"}
        job = await jobs.get(conn, failed)
        assert job is not None and job["state"] == "pending"
        again = await client.post(f"/api/jobs/{failed}/redrive", headers=OPERATE)
        assert (again.status_code, again.json()["error"]) == (409, "not_redrivable")

        response = await client.post(f"/api/jobs/{pending}/cancel?reason=duplicate%20order", headers=OPERATE)
        assert check(response, "/api/jobs/{job_id}/cancel", "post")["state"] == "cancelled"
        job = await jobs.get(conn, pending)
        assert job is not None
        assert (job["state"], job["terminal_reason"], job["terminal_by"]) == (
            "cancelled",
            "duplicate order",
            "operator:admin",
        )


async def test_resolve_closes_a_failed_job_and_every_answer_says_who_and_why(
    db_url: str, conn: db.Conn
) -> None:
    ids = await seed(conn)
    failed, pending = ids["order-paid:1"], ids["ship:9"]
    async with gateway(db_url) as client:
        missing = await client.post(f"/api/jobs/{failed}/resolve", headers=OPERATE)
        assert (missing.status_code, missing.json()["error"], missing.json()["parameter"]) == (
            400,
            "invalid_reason",
            "reason",
        )
        url = f"/api/jobs/{failed}/resolve?reason=refunded%20by%20hand"
        body = check(await client.post(url, headers=OPERATE), "/api/jobs/{job_id}/resolve", "post")
        assert (body["state"], body["resolved_from"], body["resolved_by"], body["resolved_reason"]) == (
            "resolved",
            "failed",
            "operator:admin",
            "refunded by hand",
        )
        assert body["already"] is False
        again = check(await client.post(url, headers=OPERATE), "/api/jobs/{job_id}/resolve", "post")
        assert (again["already"], again["resolved_at"]) == (True, body["resolved_at"])
        other = await client.post(f"/api/jobs/{failed}/resolve?reason=other", headers=OPERATE)
        assert (other.status_code, other.json()["error"]) == (409, "already_resolved")
        redrive = await client.post(f"/api/jobs/{failed}/redrive?force=true", headers=OPERATE)
        assert (redrive.status_code, redrive.json()["error"]) == (409, "not_redrivable")
        live = await client.post(f"/api/jobs/{pending}/resolve?reason=x", headers=OPERATE)
        assert (live.status_code, live.json()["error"]) == (409, "not_resolvable")

        shown = check(await client.get(f"/api/jobs/{failed}", headers=VIEW), "/api/jobs/{job_id}")["job"]
        lineage = check(await client.get("/api/effects/order-paid:1", headers=VIEW), "/api/effects/{key}")
        listed = check(await client.get("/api/jobs?state=resolved", headers=VIEW), "/api/jobs")
        waiting = check(await client.get("/api/jobs?state=failed,parked", headers=VIEW), "/api/jobs")
    for job in (shown, lineage["job"], *listed["items"]):
        assert (job["id"], job["state"], job["resolved_by"], job["resolved_reason"]) == (
            failed,
            "resolved",
            "operator:admin",
            "refunded by hand",
        )
        assert job["resolved_at"] == body["resolved_at"]
    assert (shown["resolved_from"], lineage["job"]["resolved_from"]) == ("failed", "failed")
    assert failed not in [job["id"] for job in waiting["items"]]


async def test_bulk_resolve_takes_the_shared_filter_and_needs_a_reason(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    async with gateway(db_url) as client:
        refused = await client.post("/api/jobs/resolve?state=failed,pending", headers=OPERATE)
        assert (refused.status_code, refused.json()["error"]) == (400, "invalid_reason")
        unfiltered = await client.post("/api/jobs/resolve?reason=x", headers=OPERATE)
        assert (unfiltered.status_code, unfiltered.json()["error"]) == (400, "filter_required")
        body = check(
            await client.post(
                "/api/jobs/resolve?state=failed,pending&reason=outage%20handled", headers=OPERATE
            ),
            "/api/jobs/resolve",
            "post",
        )
    assert body["action"] == "resolve" and ids["order-paid:1"] in body["job_ids"]
    assert ids["ship:9"] in body["refused_job_ids"]["not_resolvable"]
    job = await jobs.get(conn, ids["order-paid:1"])
    assert job is not None and (job["state"], job["resolved_reason"]) == ("resolved", "outage handled")


async def test_every_reason_an_operator_gives_is_printable_and_at_most_500_characters(
    db_url: str, conn: db.Conn
) -> None:
    # One rule (ledger.jobs.audit.check_note) on every endpoint that takes a reason, refused before the action.
    ids = await seed(conn)
    failed, pending = ids["order-paid:1"], ids["ship:9"]
    paths = [
        f"/api/jobs/{failed}/redrive",
        f"/api/jobs/{pending}/cancel",
        f"/api/jobs/{failed}/resolve",
        "/api/jobs/redrive?state=failed",
        "/api/jobs/cancel?state=pending",
        "/api/jobs/resolve?state=failed",
        "/api/kinds/ship_order/pause",
    ]
    async with gateway(db_url) as client:
        for path in paths:
            for reason in ("x" * 501, "%01", "line%0Abreak"):
                url = f"{path}{'&' if '?' in path else '?'}reason={reason}"
                refused = await client.post(url, headers=OPERATE)
                assert (refused.status_code, refused.json()["error"]) == (400, "invalid_reason"), url
        longest = await client.post(f"/api/jobs/{pending}/cancel?reason={'x' * 500}", headers=OPERATE)
        assert longest.status_code == 200
        assert check(await client.get("/api/kinds/paused", headers=VIEW), "/api/kinds/paused")["paused"] == []
    job = await jobs.get(conn, failed)
    assert job is not None and job["state"] == "failed"


async def test_an_unrecoverable_failure_needs_force(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={"ship_order": 30}, limit=1)
    await jobs.finish(conn, lease.job_id, lease.lease_token, state="failed", by="w", unrecoverable=True)
    async with gateway(db_url) as client:
        url = f"/api/jobs/{ids['ship:9']}/redrive"
        refused = await client.post(url, headers=OPERATE)
        assert (refused.status_code, refused.json()["error"]) == (409, "unrecoverable_requires_force")
        forced = await client.post(f"{url}?force=true", headers=OPERATE)
        assert forced.status_code == 200


@pytest.fixture
async def seeded(seeded_url: str) -> AsyncIterator[db.Conn]:
    conn = await db.connect(seeded_url)
    async with conn:
        yield conn


async def test_bulk_redrive_over_the_api_counts_refusals_and_a_dry_run_changes_nothing(
    db_url: str, conn: db.Conn
) -> None:
    await seed(conn)
    before = await (await conn.execute("SELECT id, state::text FROM jobs ORDER BY id")).fetchall()
    async with gateway(db_url) as client:
        dry = check(
            await client.post("/api/jobs/redrive?state=failed,succeeded&dry_run=true", headers=OPERATE),
            "/api/jobs/redrive",
            "post",
        )
        assert (dry["dry_run"], dry["matched"], dry["done"]) == (
            True,
            dry["done"] + sum(dry["refused"].values()),
            dry["done"],
        )
        assert dry["refused"].get("not_redrivable", 0) >= 1  # the succeeded ones
        assert await (await conn.execute("SELECT id, state::text FROM jobs ORDER BY id")).fetchall() == before
        real = check(
            await client.post("/api/jobs/redrive?state=failed,succeeded", headers=OPERATE),
            "/api/jobs/redrive",
            "post",
        )
    assert (real["done"], real["refused"]) == (dry["done"], dry["refused"])
    for job_id in real["job_ids"]:
        row = await (
            await conn.execute("SELECT state::text AS s FROM jobs WHERE id = %s", (job_id,))
        ).fetchone()
        assert row is not None and row["s"] == "pending"


@pytest.mark.parametrize(
    ("method", "url", "headers", "status"),
    [
        ("get", f"/api/duplicates?{WINDOW}", VIEW, 200),
        ("get", "/api/openapi.json", VIEW, 200),
        ("get", "/api/openapi.json", None, 401),
        ("get", "/api/duplicates?limit=0", VIEW, 400),
        ("get", "/api/no-such-report", VIEW, 404),
        ("delete", "/api/duplicates", VIEW, 405),
    ],
)
async def test_every_api_answer_is_neither_cached_nor_sniffed(
    api: httpx.AsyncClient, method: str, url: str, headers: dict[str, str] | None, status: int
) -> None:
    response = await api.request(method, url, headers=headers)
    assert response.status_code == status
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_the_webhook_ingress_and_health_answers_carry_no_api_headers(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert "x-content-type-options" not in response.headers
