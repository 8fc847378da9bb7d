"""The dashboard under ``/ui/``: server-rendered HTML with inline SVG charts — no build step, no script.

Pages: an overview for the on-call engineer (failed and parked jobs and the oldest due job up front;
duplicate and reject rates per source; duplicates, key conflicts and authentication failures over
time; the latest of each), a page for every report (its filter form, rows and summary come from its
spec), the rejects, effect lineage, and jobs with redrive, cancel and resolve-by-hand buttons for ``operate`` tokens, and
a bulk form (``/ui/jobs/bulk``: redrive or cancel every job a filter matches, dry run first).
Every page reads ``ledger.reports``, the code path of the API and the CLI.

One module per part, and ``routes()`` below is the map:

- ``rendering``: the page frame, the Jinja2 environment, cells and filter forms from a report's spec;
- ``signin``: sign-in, the session cookie, and ``view``, the wrapper every page runs in;
- ``overview`` (with ``charts``), ``report_pages`` (every report, and the rejects), ``detail`` (one job,
  one effect's lineage) and ``actions`` (the buttons and the bulk form).
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from effectgate.ledger.reports import REPORTS

from .. import reporting
from .actions import bulk, bulk_form, job_action
from .detail import effect, job_show
from .overview import overview
from .rendering import stylesheet
from .report_pages import rejects, report_page
from .signin import login, login_form, logout


def routes() -> list[BaseRoute]:
    """The routes of ``/ui``, relative to the mount."""
    return [
        Route("/", overview, methods=["GET"]),
        Route("/static/dashboard.css", stylesheet, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/rejects", rejects, methods=["GET"]),
        *(Route("/" + reporting.slug(spec), report_page(spec), methods=["GET"]) for spec in REPORTS),
        Route("/jobs/bulk", bulk_form, methods=["GET"]),
        Route("/jobs/bulk", bulk, methods=["POST"]),
        Route("/jobs/{job_id}", job_show, methods=["GET"]),
        Route("/jobs/{job_id}/redrive", job_action("redrive"), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", job_action("cancel"), methods=["POST"]),
        Route("/jobs/{job_id}/resolve", job_action("resolve"), methods=["POST"]),
        Route("/effects/{key:path}", effect, methods=["GET"]),
    ]
