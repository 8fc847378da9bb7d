"""The operator reports against a real ledger: filters, sorts, keyset pages, lineage, and every bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from effectgate.gateway.operator import reporting
from effectgate.gateway.operator.params import PARAMETER_ERRORS, BadParameter, parse_id
from effectgate.ledger import db, reports
from effectgate.ledger.reports import InvalidParameter
from effectgate.ledger.reports.spec import Page, ReportQuery, ReportSpec
from tests.integration.reports_seed import NOW, deliver, paid, seed

pytestmark = pytest.mark.anyio


@dataclass
class Report:
    """A page as the faces see it: read from text parameters, with its cursor encoded."""

    page: Page

    @property
    def since(self) -> datetime | None:
        return self.page.since

    @property
    def until(self) -> datetime | None:
        return self.page.until

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.page.items

    per_minute = items

    @property
    def totals(self) -> list[dict[str, Any]]:
        return self.page.summary

    by_reason = totals

    @property
    def next_cursor(self) -> str | None:
        return reporting.next_cursor(self.page)


async def run(conn: db.Conn, spec: ReportSpec, **raw: Any) -> Report:
    # Parameters arrive as text, the way a query string or a flag gives them.
    now = raw.pop("now", NOW)
    text = {k: v if isinstance(v, str) else str(v) for k, v in raw.items() if v is not None}
    return Report(await reporting.fetch(conn, spec, text, now=now))


async def duplicates(conn: db.Conn, **raw: Any) -> Report:
    return await run(conn, reports.DUPLICATES, **raw)


async def key_conflicts(conn: db.Conn, **raw: Any) -> Report:
    return await run(conn, reports.KEY_CONFLICTS, **raw)


async def auth_failures(conn: db.Conn, **raw: Any) -> Report:
    return await run(conn, reports.AUTH_FAILURES, **raw)


async def jobs(conn: db.Conn, **raw: Any) -> Report:
    return await run(conn, reports.JOBS, **raw)


@pytest.fixture
async def seeded(seeded_url: str) -> AsyncIterator[db.Conn]:
    """The module's seeded ledger, shared: tests using it only read."""
    conn = await db.connect(seeded_url)
    async with conn:
        yield conn


def keys(items: list[dict[str, Any]]) -> list[str]:
    return [i["effect_key"] for i in items]


async def test_duplicates_in_the_default_window_newest_first_with_totals(seeded: db.Conn) -> None:
    report = await duplicates(seeded, now=NOW)
    assert (report.since, report.until) == (NOW - timedelta(hours=24), NOW)
    assert keys(report.items) == ["order-paid:1234", "ship:9"]
    assert report.items[0]["delivery_count"] == 3
    assert report.items[0]["first_seen_at"] == NOW - timedelta(hours=5)
    assert report.items[0]["last_seen_at"] == NOW - timedelta(hours=1)
    assert report.next_cursor is None
    assert report.totals == [
        {
            "source": "shopify",
            "event_type": "orders/create",
            "effects": 1,
            "deliveries": 2,
            "duplicate_deliveries": 1,
        },
        {
            "source": "stripe",
            "event_type": "payment_intent.succeeded",
            "effects": 1,
            "deliveries": 3,
            "duplicate_deliveries": 2,
        },
    ]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"source": "shopify"}, ["ship:9"]),
        ({"tenant": "default"}, ["order-paid:1234"]),
        ({"event_type": "orders/create"}, ["ship:9"]),
        ({"source": "stripe", "since": "4d"}, ["order-paid:1234", "order-paid:old"]),
        ({"since": "4d", "until": "2d"}, ["order-paid:old"]),
        ({"since": "2025-03-01", "until": "2025-03-02T00:00:00Z"}, ["order-paid:old"]),
        ({"since": "90m"}, ["order-paid:1234"]),
        ({"source": "github"}, []),
        ({"sort": "last_seen"}, ["ship:9", "order-paid:1234"]),
        ({"sort": "-first_seen"}, ["ship:9", "order-paid:1234"]),
        ({"sort": "first_seen"}, ["order-paid:1234", "ship:9"]),
        # Equal counts: the later claim (higher id) first.
        ({"sort": "-deliveries", "since": "7d"}, ["order-paid:1234", "order-paid:old", "ship:9"]),
    ],
)
async def test_duplicates_filters_and_sorts(
    seeded: db.Conn, filters: dict[str, Any], expected: list[str]
) -> None:
    report = await duplicates(seeded, now=NOW, **filters)
    assert keys(report.items) == expected
    assert sum(t["effects"] for t in report.totals) == len(expected)


@pytest.mark.parametrize("sort", [s.name for s in reports.DUPLICATES.sorts])
async def test_duplicate_pages_walk_every_row_once_in_order(conn: db.Conn, sort: str) -> None:
    # Equal sort values across rows: the id tie-break must keep pages from repeating or skipping a row.
    for i in range(7):
        at = NOW - timedelta(hours=1 + i % 2)
        await deliver(conn, paid(str(i)), f"k:{i}", at)
        for _ in range(1 + i % 3):
            await deliver(conn, paid(str(i)), f"k:{i}", at)
    whole = await duplicates(conn, sort=sort, now=NOW)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await duplicates(conn, sort=sort, limit=3, cursor=cursor, now=NOW)
        seen += keys(page.items)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == keys(whole.items)
    assert sorted(seen) == [f"k:{i}" for i in range(7)]
    assert pages == 3


async def test_a_cursor_is_refused_by_another_sort_and_when_tampered(seeded: db.Conn) -> None:
    page = await duplicates(seeded, limit=1, now=NOW)
    assert page.next_cursor is not None
    with pytest.raises(BadParameter) as info:
        await duplicates(seeded, sort="-deliveries", cursor=page.next_cursor, now=NOW)
    assert info.value.code == "invalid_cursor"
    with pytest.raises(BadParameter, match="cursor"):
        await key_conflicts(seeded, cursor=page.next_cursor, now=NOW)
    for bad in ["%%%", "bm90IGpzb24", page.next_cursor[:-3], "W10", "x" * 2000]:
        with pytest.raises(BadParameter) as info:
            await duplicates(seeded, cursor=bad, now=NOW)
        assert info.value.code == "invalid_cursor", bad


@pytest.mark.parametrize(
    ("filters", "code"),
    [
        ({"since": "yesterday"}, "invalid_since"),
        ({"since": ""}, "invalid_since"),
        ({"since": "24x"}, "invalid_since"),
        ({"since": "9999999w"}, "invalid_since"),
        ({"until": "2025-13-01"}, "invalid_until"),
        ({"since": "1h", "until": "2h"}, "invalid_until"),
        ({"limit": "0"}, "invalid_limit"),
        ({"limit": "1001"}, "invalid_limit"),
        ({"limit": "ten"}, "invalid_limit"),
        ({"limit": "-1"}, "invalid_limit"),
        ({"sort": "amount"}, "invalid_sort"),
        ({"source": ""}, "invalid_source"),
        ({"tenant": "x" * 201}, "invalid_tenant"),
        ({"event_type": "a\nb"}, "invalid_event_type"),
    ],
)
async def test_every_bad_duplicate_filter_names_its_parameter(
    seeded: db.Conn, filters: dict[str, Any], code: str
) -> None:
    with pytest.raises(BadParameter) as info:
        await duplicates(seeded, now=NOW, **filters)
    assert info.value.code == code
    assert info.value.parameter == code.removeprefix("invalid_")


async def test_key_conflicts_show_both_fingerprints_both_events_and_a_field_diff(seeded: db.Conn) -> None:
    report = await key_conflicts(seeded, now=NOW)
    [item] = report.items
    assert item["effect_key"] == "order-paid:1234"
    assert (item["held_event_id"], item["event_id"]) == ("evt_1234", "evt_forged")
    assert item["held_fingerprint"] != item["rejected_fingerprint"]
    assert item["diff"] == [
        {"path": "/coupon", "change": "added", "rejected": "X"},
        {"path": "/data/object/amount", "change": "changed", "held": 1000, "rejected": 999},
    ]
    assert item["diff_truncated"] is False
    assert report.totals == [
        {"source": "stripe", "event_type": "payment_intent.succeeded", "rejects": 1, "effects": 1}
    ]
    assert (await key_conflicts(seeded, tenant="acme", now=NOW)).items == []
    assert (await key_conflicts(seeded, since="20m", now=NOW)).items == []


async def test_key_conflict_pages(conn: db.Conn) -> None:
    await deliver(conn, paid("1"), "k", NOW - timedelta(hours=2))
    for i in range(5):
        await deliver(conn, paid("1", amount=i), "k", NOW - timedelta(minutes=50 - i), event_id=f"evt_{i}")
    for sort, expected in [("-received", [4, 3, 2, 1, 0]), ("received", [0, 1, 2, 3, 4])]:
        seen, cursor = [], None
        while True:
            page = await key_conflicts(conn, sort=sort, limit=2, cursor=cursor, now=NOW)
            seen += [i["event_id"] for i in page.items]
            if (cursor := page.next_cursor) is None:
                break
        assert seen == [f"evt_{i}" for i in expected]


async def test_auth_failures_by_reason_and_per_minute(seeded: db.Conn) -> None:
    report = await auth_failures(seeded, now=NOW)
    assert [(r["source"], r["reason"], r["count"]) for r in report.by_reason] == [
        ("stripe", "signature_invalid", 4),
        ("shopify", "signature_missing", 1),
    ]
    assert [(r["minute"], r["source"], r["count"]) for r in report.per_minute] == [
        (NOW - timedelta(minutes=5), "stripe", 1),
        (NOW - timedelta(minutes=5), "shopify", 1),
        (NOW - timedelta(minutes=10), "stripe", 3),
    ]
    wider = await auth_failures(seeded, source="stripe", since="2d", now=NOW)
    assert [r["reason"] for r in wider.by_reason] == ["signature_invalid", "timestamp_out_of_tolerance"]
    rows, cursor = [], None
    while True:
        page = await auth_failures(seeded, since="2d", limit=1, cursor=cursor, now=NOW)
        rows += page.per_minute
        if (cursor := page.next_cursor) is None:
            break
    assert len(rows) == 4
    with pytest.raises(BadParameter, match="source"):
        await auth_failures(seeded, source="\x00", now=NOW)


async def test_deliveries_by_outcome_per_source_with_rates(seeded: db.Conn) -> None:
    report = await run(seeded, reports.DELIVERY_OUTCOMES)
    assert [
        (r["source"], r["deliveries"], r["accepted"], r["duplicates"], r["rejected"]) for r in report.items
    ] == [
        ("stripe", 5, 2, 2, 1),
        ("shopify", 2, 1, 1, 0),
    ]
    assert [(r["duplicate_rate"], r["reject_rate"]) for r in report.items] == [(0.4, 0.2), (0.5, 0.0)]
    wider = await run(seeded, reports.DELIVERY_OUTCOMES, since="7d", sort="source", limit=1)
    assert [r["source"] for r in wider.items] == ["shopify"]
    rest = await run(seeded, reports.DELIVERY_OUTCOMES, since="7d", sort="source", cursor=wider.next_cursor)
    assert [(r["source"], r["deliveries"]) for r in rest.items] == [("stripe", 7)]
    assert (await run(seeded, reports.DELIVERY_OUTCOMES, tenant="acme")).items[0]["source"] == "shopify"


async def test_effect_lineage_from_delivery_to_outcome(seeded: db.Conn) -> None:
    view = await reports.effect_view(seeded, "order-paid:1234")
    assert view is not None
    assert view.effect["tenant"] == "default"
    assert [d["outcome"] for d in view.deliveries] == ["accepted", "duplicate", "duplicate", "rejected"]
    assert view.job is not None
    assert (view.job["state"], view.job["terminal_reason"]) == ("succeeded", "done")
    [attempt] = view.attempts
    assert (attempt["worker"], attempt["attempt"], attempt["outcome"]) == ("worker-a", 1, "succeeded")
    assert attempt["lease_token"] == view.job["lease_token"]
    [step] = view.steps
    assert step["idempotency_key"] == "eg_capture_key"
    assert step["result"] == {"id": "pi_1234", "status": "succeeded"}
    [reject] = view.rejects
    assert reject["event_id"] == "evt_forged"
    assert {d["path"] for d in reject["diff"]} == {"/coupon", "/data/object/amount"}


async def test_effect_lookup_by_tenant(conn: db.Conn) -> None:
    await seed(conn)
    assert await reports.effect_view(conn, "ship:9", tenant="default") is None
    view = await reports.effect_view(conn, "ship:9")
    assert view is not None and view.effect["tenant"] == "acme"
    assert await reports.effect_view(conn, "no-such-key") is None
    await deliver(conn, paid("1234"), "order-paid:1234", NOW, tenant="acme")
    with pytest.raises(InvalidParameter) as info:
        await reports.effect_view(conn, "order-paid:1234")
    assert (info.value.code, info.value.parameter) == ("tenant_required", "tenant")
    view = await reports.effect_view(conn, "order-paid:1234", tenant="acme")
    assert view is not None and view.deliveries[0]["outcome"] == "accepted"
    with pytest.raises(InvalidParameter, match="key"):
        await reports.effect_view(conn, "")


async def test_jobs_by_state_kind_source_and_age(conn: db.Conn) -> None:
    ids = await seed(conn)
    every = await jobs(conn, now=NOW)
    assert [j["effect_key"] for j in every.items] == [
        "order-paid:1",
        "ship:9",
        "order-paid:1234",
        "order-paid:old",
    ]
    assert [j["id"] for j in (await jobs(conn, state="failed,parked", now=NOW)).items] == [
        ids["order-paid:1"]
    ]
    assert [j["state"] for j in (await jobs(conn, state="pending", now=NOW)).items] == [
        "pending",
        "pending",
    ]
    assert [j["kind"] for j in (await jobs(conn, kind="ship_order", now=NOW)).items] == ["ship_order"]
    assert [j["source"] for j in (await jobs(conn, source="shopify", now=NOW)).items] == ["shopify"]
    assert [j["effect_key"] for j in (await jobs(conn, tenant="acme", now=NOW)).items] == ["ship:9"]
    assert (await jobs(conn, tenant="nobody", now=NOW)).items == []
    older = await jobs(conn, until="3h", sort="created", now=NOW)
    assert [j["effect_key"] for j in older.items] == ["order-paid:old", "order-paid:1234", "ship:9"]
    seen, cursor = [], None
    while True:
        page = await jobs(conn, limit=3, cursor=cursor, now=NOW)
        seen += [j["id"] for j in page.items]
        if (cursor := page.next_cursor) is None:
            break
    assert seen == [j["id"] for j in every.items]


@pytest.mark.parametrize(
    ("filters", "code"),
    [
        ({"state": "done"}, "invalid_state"),
        ({"state": "failed,"}, "invalid_state"),
        ({"state": ""}, "invalid_state"),
        ({"kind": ""}, "invalid_kind"),
        ({"tenant": ""}, "invalid_tenant"),
        ({"sort": "-last_seen"}, "invalid_sort"),
        ({"since": "1h", "until": "2h"}, "invalid_until"),
        ({"cursor": "nope"}, "invalid_cursor"),
    ],
)
async def test_every_bad_job_filter_names_its_parameter(
    seeded: db.Conn, filters: dict[str, Any], code: str
) -> None:
    with pytest.raises(BadParameter) as info:
        await jobs(seeded, now=NOW, **filters)
    assert info.value.code == code


async def test_job_view_shows_every_attempt_and_step(conn: db.Conn) -> None:
    ids = await seed(conn)
    view = await reports.job_view(conn, ids["order-paid:1"])
    assert view is not None
    assert (view.job["state"], view.job["terminal_reason"]) == ("failed", "card declined")
    assert [(a["attempt"], a["outcome"], a["error_message"]) for a in view.attempts] == [
        (1, "retry", "502 from provider"),
        (2, "failed", "card declined"),
    ]
    assert len({a["lease_token"] for a in view.attempts}) == 2
    assert view.steps == []
    assert await reports.job_view(conn, 999_999) is None
    for bad in ["0", "x", "-3", str(2**63)]:
        with pytest.raises(BadParameter) as info:
            parse_id(bad, "job_id")
        assert info.value.code == "invalid_job_id"


async def test_the_ledger_takes_typed_values_and_refuses_others(seeded: db.Conn) -> None:
    window = {"since": NOW - timedelta(days=7), "until": NOW}
    page = await reports.run(
        seeded, reports.JOBS, ReportQuery(filters={"state": ("failed", "pending")}, sort="created")
    )
    assert {j["state"] for j in page.items} == {"failed", "pending"}
    page = await reports.run(seeded, reports.DUPLICATES, ReportQuery(**window, sort="-deliveries", limit=1))
    assert page.next_after == (page.items[0]["delivery_count"], page.items[0]["id"])
    for query, parameter in [
        (ReportQuery(**window, limit=0), "limit"),
        (ReportQuery(**window, limit=True), "limit"),
        (ReportQuery(**window, sort="amount"), "sort"),
        (ReportQuery(**window, filters={"state": ("failed",)}), "state"),
        (ReportQuery(**window, filters={"source": ("stripe",)}), "source"),
        (ReportQuery(**window, after=(1,)), "cursor"),
        (ReportQuery(since=NOW, until=NOW), "until"),
    ]:
        with pytest.raises(InvalidParameter) as info:
            await reports.run(seeded, reports.DUPLICATES, query)
        assert info.value.parameter == parameter, query
    assert PARAMETER_ERRORS == (BadParameter, InvalidParameter)
