"""The dashboard over the real app and ledger, without a browser: sign-in, pages, actions, escaping."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.operator import sessions
from effectgate.gateway.operator.auth import hash_token
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, jobs
from tests.integration.gateway.operator.operator_app import CONFIG, OPERATE_TOKEN, VIEW_TOKEN, dashboard, text
from tests.integration.reports_seed import NOW, deliver, seed

pytestmark = pytest.mark.anyio

WINDOW = "since=2025-03-03T12:00:00Z&until=2025-03-04T12:00:00Z"


async def test_pages_need_a_sign_in_and_it_starts_a_session_in_a_strict_cookie(seeded_url: str) -> None:
    async with dashboard(seeded_url) as client:
        response = await client.get("/ui/jobs?state=failed")
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%3Fstate%3Dfailed"
        form = await client.get(response.headers["location"])
        assert 'name="next" value="/ui/jobs?state=failed"' in form.text
        refused = await client.post("/ui/login", data={"token": "not-a-token", "next": "/ui/jobs"})
        assert refused.status_code == 401 and "not a configured operator token" in refused.text
        signed = await client.post("/ui/login", data={"token": VIEW_TOKEN, "next": "/ui/jobs?state=failed"})
        assert (signed.status_code, signed.headers["location"]) == (303, "/ui/jobs?state=failed")
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Max-Age=28800" in cookie
        # The cookie names the session, never the token nor its hash.
        session = client.cookies[sessions.COOKIE]
        assert VIEW_TOKEN not in session and hash_token(VIEW_TOKEN) not in session
        page = await client.get("/ui/jobs?state=failed")
        assert page.status_code == 200
        csrf = re.search(r'action="/ui/logout".*?name="csrf" value="([0-9a-f]{64})"', page.text)
        assert csrf is not None

        # Signing out is a POST carrying the session's form token: a link or another site cannot do it.
        assert (await client.get("/ui/logout")).status_code == 405
        assert (await client.post("/ui/logout", data={"csrf": "0" * 64})).status_code == 403
        assert (await client.get("/ui/")).status_code == 200
        out = await client.post("/ui/logout", data={"csrf": csrf[1]})
        assert (out.status_code, out.headers["location"]) == (303, "/ui/login")
        assert (await client.get("/ui/")).status_code == 303


async def test_a_forged_expired_or_foreign_session_is_no_session(seeded_url: str) -> None:
    async with dashboard(seeded_url) as client:
        app = client._transport.app  # type: ignore[attr-defined]
        key = app.state.session_key
        [viewer] = [o for o in app.state.config.operators if o.name == "viewer"]

        good = sessions.issue(key, viewer, 3600)
        cases = {
            "good": good,
            "expired": sessions.issue(key, viewer, 3600, now=time.time() - 7200),
            "another key": sessions.issue(b"k" * 32, viewer, 3600),
            "longer life": good.replace(good.split(".")[3], str(int(good.split(".")[3]) + 10**6)),
            "the raw token": VIEW_TOKEN,
            "garbage": "v1.x.y.z.w",
        }
        answers = {}
        for name, cookie in cases.items():
            client.cookies.clear()
            client.cookies.set(sessions.COOKIE, cookie)
            answers[name] = (await client.get("/ui/")).status_code
        assert answers == {name: 200 if name == "good" else 303 for name in cases}


async def test_wrong_tokens_are_throttled_and_the_right_one_is_never_locked_out(seeded_url: str) -> None:
    async with dashboard(seeded_url) as client:
        limit = client._transport.app.state.auth_throttle.limit  # type: ignore[attr-defined]
        answers = [
            (await client.post("/ui/login", data={"token": f"guess-{i:04}" + "x" * 20})).status_code
            for i in range(2 * limit + 5)
        ]
        assert answers == [401] * limit + [429] * (limit + 5)
        throttled = await client.post("/ui/login", data={"token": "guess-" + "y" * 20})
        assert throttled.status_code == 429 and 0 < int(throttled.headers["retry-after"]) <= 300
        assert sessions.COOKIE not in throttled.cookies
        # Every client here has one address (as behind a proxy whose headers are not trusted): the
        # attacker's wrong tokens must not lock the operator's right one out.
        signed = await client.post("/ui/login", data={"token": VIEW_TOKEN, "next": "/ui/"})
        assert signed.status_code == 303 and sessions.COOKIE in signed.cookies
        # ...and signing in does not wipe the attacker's count.
        again = await client.post("/ui/login", data={"token": "guess-" + "z" * 20})
        assert again.status_code == 429


@pytest.mark.parametrize(
    ("setting", "scheme", "secure"),
    [
        ("", "http", False),
        ("", "https", True),
        ("secure_cookies = true", "http", True),
        ("secure_cookies = false", "https", False),
    ],
)
async def test_the_session_cookie_is_secure_as_the_deployment_says(
    seeded_url: str, setting: str, scheme: str, secure: bool
) -> None:
    config = parse(
        CONFIG + f"\n[operator]\n{setting}\n", env={"STRIPE_SECRET": "whsec_test", "VIEW_TOKEN": VIEW_TOKEN}
    )
    app = create_app(config, Registry(), seeded_url)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://gateway") as client:
        signed = await client.post("/ui/login", data={"token": VIEW_TOKEN, "next": "/ui/"})
    assert signed.status_code == 303
    flags = [part.strip().lower() for part in signed.headers["set-cookie"].split(";")]
    assert ("secure" in flags) is secure


@pytest.mark.parametrize("target", ["//evil.example/ui/", "https://evil.example/", "/api/jobs", "/ui//x"])
async def test_sign_in_never_redirects_off_the_dashboard(seeded_url: str, target: str) -> None:
    async with dashboard(seeded_url) as client:
        response = await client.post("/ui/login", data={"token": VIEW_TOKEN, "next": target})
        assert response.headers["location"] == "/ui/"


async def test_overview_charts_and_tables(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        response = await client.get(f"/ui/?{WINDOW}")
        assert response.status_code == 200
        assert "default-src 'none'" in response.headers["content-security-policy"]
        assert response.text.count("<svg") == 3
        # 24 hourly buckets, each a bar, in each of the three charts.
        assert response.text.count("<rect") == 3 * 24
        body = text(response.text)
        assert "Duplicate deliveries — 3 in all" in body
        assert "Key conflicts — 1 in all" in body
        assert "Authentication failures — 5 in all" in body
        assert "order-paid:1234" in body and "signature_invalid" in body


async def test_reports_pages_with_filters(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        body = text((await client.get(f"/ui/duplicates?{WINDOW}&source=shopify")).text)
        assert "ship:9" in body and "order-paid:1234" not in body
        rejects = (await client.get(f"/ui/rejects?{WINDOW}")).text
        assert "<code>/data/object/amount</code> changed: 1000 → 999" in rejects
        assert "signature_missing" in rejects
        bad = await client.get("/ui/duplicates?since=yesterday")
        assert bad.status_code == 400 and "invalid_since" in bad.text


async def test_lineage_page_shows_the_idempotency_key_and_the_answer(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        page = await client.get("/ui/effects/order-paid%3A1234")
        assert page.status_code == 200
        body = text(page.text)
        assert "capture succeeded eg_capture_key" in body
        # Jinja2 escapes a quote as &#34;.
        assert "{&#34;id&#34;:&#34;pi_1234&#34;,&#34;status&#34;:&#34;succeeded&#34;}" in page.text
        assert (await client.get("/ui/effects/nope")).status_code == 404


async def test_only_operate_tokens_see_and_use_the_buttons(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    failed = ids["order-paid:1"]
    async with dashboard(db_url, VIEW_TOKEN) as viewer:
        page = await viewer.get(f"/ui/jobs/{failed}")
        assert "Redrive" not in page.text
        assert (await viewer.post(f"/ui/jobs/{failed}/redrive", data={"csrf": "x"})).status_code == 403
    async with dashboard(db_url, OPERATE_TOKEN) as operator:
        page = await operator.get(f"/ui/jobs/{failed}")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None and "Redrive" in page.text
        forged = await operator.post(f"/ui/jobs/{failed}/redrive", data={"csrf": "0" * 64})
        assert forged.status_code == 403
        done = await operator.post(f"/ui/jobs/{failed}/redrive", data={"csrf": csrf[1]})
        assert (done.status_code, done.headers["location"]) == (303, f"/ui/jobs/{failed}?done=redriven")
        job = await jobs.get(conn, failed)
        assert job is not None and job["state"] == "pending"
        again = await operator.post(f"/ui/jobs/{failed}/redrive", data={"csrf": csrf[1]})
        assert again.headers["location"] == f"/ui/jobs/{failed}?refused=not_redrivable"
        assert "Refused: not_redrivable" in (await operator.get(again.headers["location"])).text
        cancel = await operator.post(f"/ui/jobs/{ids['ship:9']}/cancel", data={"csrf": csrf[1]})
        assert cancel.headers["location"] == f"/ui/jobs/{ids['ship:9']}?done=cancelled"


async def test_resolve_by_hand_from_the_job_page_shows_who_and_why_on_job_and_effect(
    db_url: str, conn: db.Conn
) -> None:
    ids = await seed(conn)
    failed, pending = ids["order-paid:1"], ids["ship:9"]
    async with dashboard(db_url, VIEW_TOKEN) as viewer:
        assert "Resolve by hand" not in (await viewer.get(f"/ui/jobs/{failed}")).text
        refused = await viewer.post(f"/ui/jobs/{failed}/resolve", data={"csrf": "x", "reason": "r"})
        assert refused.status_code == 403
    async with dashboard(db_url, OPERATE_TOKEN) as operator:
        page = await operator.get(f"/ui/jobs/{failed}")
        assert f'action="/ui/jobs/{failed}/resolve"' in page.text and 'name="reason" required' in page.text
        assert f'action="/ui/jobs/{pending}/resolve"' not in (await operator.get(f"/ui/jobs/{pending}")).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None
        forged = await operator.post(f"/ui/jobs/{failed}/resolve", data={"csrf": "0" * 64, "reason": "r"})
        assert forged.status_code == 403
        blank = await operator.post(f"/ui/jobs/{failed}/resolve", data={"csrf": csrf[1], "reason": " "})
        assert blank.status_code == 400 and "reason" in blank.text
        done = await operator.post(
            f"/ui/jobs/{failed}/resolve", data={"csrf": csrf[1], "reason": "refunded <by hand>"}
        )
        assert (done.status_code, done.headers["location"]) == (303, f"/ui/jobs/{failed}?done=resolved")
        job_page = await operator.get(done.headers["location"])
        assert "Resolved by hand: the job is closed" in job_page.text
        row = re.search(r'<tr id="resolution">.*?</tr>', job_page.text)
        assert row is not None
        assert "refunded &lt;by hand&gt;" in row[0] and "operator:admin" in row[0] and "was failed" in row[0]
        # Closed: neither redrive nor resolve is offered again.
        assert "Redrive" not in job_page.text and "Resolve by hand</button>" not in job_page.text
        effect_page = await operator.get("/ui/effects/order-paid:1")
        row = re.search(r'<tr id="resolution">.*?</tr>', effect_page.text)
        assert row is not None and "refunded &lt;by hand&gt;" in row[0] and "operator:admin" in row[0]
        live = await operator.post(f"/ui/jobs/{pending}/resolve", data={"csrf": csrf[1], "reason": "x"})
        assert live.headers["location"] == f"/ui/jobs/{pending}?refused=not_resolvable"
        listing = text((await operator.get("/ui/jobs?state=resolved")).text)
        assert "refunded <by hand>" in listing or "refunded &lt;by hand&gt;" in listing
        overview = text((await operator.get("/ui/")).text)
        assert "1 resolved by hand in the window" in overview and "0 failed jobs" in overview
    job = await jobs.get(conn, failed)
    assert job is not None and (job["state"], job["resolved_by"]) == ("resolved", "operator:admin")


async def test_the_bulk_form_resolves_by_hand_with_a_reason(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    async with dashboard(db_url, OPERATE_TOKEN) as operator:
        form_page = (await operator.get("/ui/jobs/bulk?state=failed")).text
        assert "<option>resolve</option>" in form_page
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form_page)
        assert csrf is not None
        form = {"csrf": csrf[1], "state": "failed,pending", "action": "resolve"}
        no_reason = await operator.post("/ui/jobs/bulk", data=form)
        assert no_reason.status_code == 400 and "reason" in no_reason.text
        real = await operator.post("/ui/jobs/bulk", data={**form, "reason": "outage handled"})
        body = text(real.text)
        assert real.status_code == 200 and "resolve: 1 of" in body and "refused not_resolvable" in body
    job = await jobs.get(conn, ids["order-paid:1"])
    assert job is not None and (job["state"], job["resolved_reason"]) == ("resolved", "outage handled")


async def test_everything_from_the_ledger_is_escaped(db_url: str, conn: db.Conn) -> None:
    evil = '<script>alert("x")</script>'
    await deliver(conn, {"id": evil}, f"k:{evil}", NOW, source="stripe", event_id=evil)
    await deliver(conn, {"id": evil}, f"k:{evil}", NOW, source="stripe", event_id=evil)
    async with dashboard(db_url, VIEW_TOKEN) as client:
        for url in (
            "/ui/duplicates?since=2025-03-01",
            "/ui/jobs",
            "/ui/effects/k:%3Cscript%3Ealert(%22x%22)%3C%2Fscript%3E",
        ):
            page = await client.get(url)
            assert page.status_code == 200, url
            assert "<script>" not in page.text and "&lt;script&gt;" in page.text


async def test_the_bulk_form_dry_runs_first_then_acts_and_counts_refusals(db_url: str, conn: db.Conn) -> None:
    await seed(conn)
    before = await (await conn.execute("SELECT id, state::text AS s FROM jobs ORDER BY id")).fetchall()
    async with dashboard(db_url, VIEW_TOKEN) as viewer:
        assert 'id="bulk-link"' not in (await viewer.get("/ui/jobs")).text
        assert 'id="bulk"' not in (await viewer.get("/ui/jobs/bulk")).text
        assert (
            await viewer.post("/ui/jobs/bulk", data={"csrf": "x", "action": "redrive"})
        ).status_code == 403
    async with dashboard(db_url, OPERATE_TOKEN) as operator:
        jobs_page = (await operator.get("/ui/jobs?state=failed,succeeded")).text
        link = re.search(r'href="(/ui/jobs/bulk\?[^"]*)" id="bulk-link"', jobs_page)
        assert link is not None
        form_page = (await operator.get(link[1].replace("&amp;", "&"))).text
        assert 'id="bulk"' in form_page and 'value="failed,succeeded"' in form_page
        assert "style=" not in form_page  # the dashboard's CSP allows no inline style
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form_page)
        assert csrf is not None
        form = {"csrf": csrf[1], "state": "failed,succeeded", "action": "redrive"}
        dry = await operator.post("/ui/jobs/bulk", data={**form, "dry_run": "true"})
        assert dry.status_code == 200
        body = text(dry.text)
        assert "Dry run: nothing was changed." in body and "refused not_redrivable" in body
        assert (
            await (await conn.execute("SELECT id, state::text AS s FROM jobs ORDER BY id")).fetchall()
            == before
        )
        real = await operator.post("/ui/jobs/bulk", data=form)
        assert real.status_code == 200 and "Dry run" not in text(real.text)
        failed = [r["id"] for r in before if r["s"] == "failed"]
        after = {
            r["id"]: r["s"]
            for r in await (await conn.execute("SELECT id, state::text AS s FROM jobs")).fetchall()
        }
        assert {after[j] for j in failed} == {"pending"}
        empty = await operator.post("/ui/jobs/bulk", data={"csrf": csrf[1], "action": "cancel"})
        assert empty.status_code == 400 and "filter" in empty.text


async def test_root_redirects_and_the_page_needs_no_inline_style(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        root = await client.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")
        page = await client.get(f"/ui/?{WINDOW}")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
        assert "<style" not in page.text and "style=" not in page.text and "<script" not in page.text
        assert '<link rel="stylesheet" href="/ui/static/dashboard.css">' in page.text
        css = await client.get("/ui/static/dashboard.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert "overflow-wrap" in css.text


async def test_auto_refresh_is_off_unless_asked_for(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        assert 'http-equiv="refresh"' not in (await client.get(f"/ui/?{WINDOW}")).text
        page = await client.get(f"/ui/rejects?{WINDOW}&refresh=60")
        assert '<meta http-equiv="refresh" content="60">' in page.text
        # The choice is kept by the quick ranges and the filter form.
        assert "refresh=60" in page.text and 'name="refresh" value="60"' in page.text
        bad = await client.get("/ui/?refresh=1")
        assert bad.status_code == 400 and "invalid_refresh" in bad.text


async def test_overview_puts_jobs_that_need_a_human_first_and_shows_rates(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        body = text((await client.get(f"/ui/?{WINDOW}")).text)
        assert (
            body.index("1 failed jobs") < body.index("0 parked jobs") < body.index("oldest due job waiting")
        )
        assert body.index("oldest due job waiting") < body.index("duplicate rate")
        # source, deliveries, accepted, duplicates, rejected, unmatched, superseded, the two rates.
        assert "stripe 5 2 2 1 0 0 0 40.0 % 20.0 %" in body
        assert "superseded" in body
        # Relative times beside timestamps.
        # "N d" alone when under an hour past a whole day (rendering.py): this failed between 11:00 and 12:00 UTC.
        assert re.search(r"2025-03-04 11:00:00 \d+ d(?: \d+ h)? ago", body)


async def test_a_report_added_to_the_specs_has_a_page(seeded_url: str) -> None:
    async with dashboard(seeded_url, VIEW_TOKEN) as client:
        page = await client.get(f"/ui/delivery-outcomes?{WINDOW}&sort=source")
        assert page.status_code == 200
        body = text(page.text)
        assert (
            "unmatched superseded refused duplicate rate" in body
            and "shopify 2 1 1 0 0 0 0 50.0 % 0.0 %" in body
        )
        assert body.index("shopify") < body.index("stripe 5")
        assert '<a href="/ui/delivery-outcomes">' in page.text
        assert (await client.get("/ui/delivery-outcomes?sort=amount")).status_code == 400
