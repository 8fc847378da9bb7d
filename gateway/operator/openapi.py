"""The OpenAPI 3.1 document of the operator API, served at ``/api/openapi.json``.

The reports' paths, parameters and schemas are derived from their specs (``ledger.reports.REPORTS``);
the rest is written by hand next to the documents it describes (``documents.py``). The schemas are
strict (``additionalProperties: false``, every field required), and a test validates real answers of
every operation against them, so the two cannot drift apart unnoticed. The schemas are in
``openapi_schemas.py``; this module holds the paths, parameters and answers.
"""

from __future__ import annotations

from typing import Any

from effectgate.ledger import reports
from effectgate.ledger.reports.spec import ReportSpec

from ..bodies import MAX_OPERATOR_BODY_BYTES
from . import reporting
from .openapi_schemas import SCHEMAS, STRING, camel, ref


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or STRING,
    }


PARAMETERS: dict[str, Any] = {
    "job_id": {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}},
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref("Error")}}}


_COMMON_ERRORS = {
    "400": _error("A parameter is invalid (`invalid_<parameter>`, `unknown_parameter`)."),
    "401": _error("No token (`missing_token`) or an unknown one (`invalid_token`)."),
    "429": _error(
        "Too many wrong tokens from this client (`too_many_failures`); try again after `Retry-After` "
        "seconds. A right token is never answered 429."
    ),
    "413": _error(
        f"A request body over {MAX_OPERATOR_BODY_BYTES} bytes (`payload_too_large`); no endpoint reads one."
    ),
    "503": _error("The ledger database is unreachable (`ledger_unavailable`)."),
}
# Every token has `view` (`operate` includes it), so only operate endpoints can answer 403.
_FORBIDDEN = {"403": _error("The token lacks the `operate` scope (`insufficient_scope`).")}


def _operation(
    summary: str,
    scope: str,
    schema: str,
    parameters: list[dict[str, Any]],
    *,
    extra: dict[str, Any] | None = None,
    description: str = "",
) -> dict[str, Any]:
    return {
        "summary": summary,
        "description": (description + f"\n\nScope: `{scope}`.").strip(),
        "security": [{"bearer": []}],
        "parameters": parameters,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": ref(schema)}}},
            **_COMMON_ERRORS,
            **(_FORBIDDEN if scope == "operate" else {}),
            **(extra or {}),
        },
    }


def _p(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/parameters/{name}"}


def _report_parameter(spec: ReportSpec, name: str) -> dict[str, Any]:
    schema: dict[str, Any] | None = None
    if name == "sort":
        schema = {"type": "string", "enum": [s.name for s in spec.sorts]}
    elif name == "limit":
        schema = {"type": "integer", "minimum": 1, "maximum": reports.MAX_LIMIT}
    return _query(name, reporting.describe(spec, name), schema)


def _report_operation(spec: ReportSpec) -> dict[str, Any]:
    return _operation(
        spec.title,
        "view",
        f"{camel(spec.name)}Report",
        [_report_parameter(spec, name) for name in reporting.parameters(spec)],
        description=spec.description,
    )


_NOT_FOUND = {"404": _error("No such thing (`not_found`).")}

_BULK_FILTERS = [
    _query("state", "One state or several, comma-separated: " + ", ".join(reports.JOB_STATES)),
    _query("kind", "Only this handler kind."),
    _query("source", "Only this webhook source."),
    _query(
        "since",
        "Jobs finished (or, not finished, created) since. An ISO 8601 time or a duration back from now: 30m, 24h, 7d.",
    ),
    _query("limit", "At most this many jobs, 1..100000 (default 10000).", {"type": "integer", "minimum": 1}),
    _query("dry_run", "Report what would happen; change nothing.", {"type": "boolean"}),
]
_KIND = {"name": "kind", "in": "path", "required": True, "schema": STRING}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "effectgate operator API",
        "version": "1",
        "description": "Duplicate and reject reports, effect lineage and job control over the effect ledger. "
        "Authenticate with `Authorization: Bearer <operator token>`; tokens have the scopes `view` "
        "(read) and `operate` (redrive, cancel, resolve; includes view). Pages are keyset-paginated: pass "
        "`next_cursor` back as `cursor` until it is null.",
    },
    "paths": {
        **{"/api" + reporting.api_path(spec): {"get": _report_operation(spec)} for spec in reports.REPORTS},
        "/api/effects/{key}": {
            "get": _operation(
                "One effect's lineage, from delivery to outcome",
                "view",
                "EffectLineage",
                [
                    {"name": "key", "in": "path", "required": True, "schema": STRING},
                    _query(
                        "tenant",
                        "The tenant holding the key; needed only when several do (`tenant_required`).",
                    ),
                ],
                extra=_NOT_FOUND,
            )
        },
        "/api/jobs/{job_id}": {
            "get": _operation(
                "One job with its attempts and steps", "view", "JobView", [_p("job_id")], extra=_NOT_FOUND
            )
        },
        "/api/jobs/{job_id}/redrive": {
            "post": _operation(
                "Put a failed or parked job back to pending",
                "operate",
                "JobAction",
                [
                    _p("job_id"),
                    _query(
                        "force",
                        "Redrive an unrecoverable failure too, or one whose step recorded a terminal error "
                        "(a decline) that the next run replays without calling the provider.",
                        {"type": "boolean"},
                    ),
                    _query("reason", "Why, for the job's timeline."),
                ],
                extra={
                    **_NOT_FOUND,
                    "409": _error(
                        "Refused: `not_redrivable`, `unrecoverable_requires_force`, "
                        "`recorded_failure_requires_force`, `payload_purged` or `lock_key_held`."
                    ),
                },
            )
        },
        "/api/jobs/{job_id}/cancel": {
            "post": _operation(
                "Cancel a job",
                "operate",
                "JobAction",
                [_p("job_id"), _query("reason", "Why, for the job's record.")],
                extra={**_NOT_FOUND, "409": _error("Refused: `not_cancellable` (the job is done already).")},
                description="A pending job is cancelled at once; a running one at its worker's next "
                "heartbeat, and it can then never be reported succeeded.",
            )
        },
        "/api/jobs/{job_id}/resolve": {
            "post": _operation(
                "Resolve a failed or parked job by hand",
                "operate",
                "JobResolved",
                [_p("job_id"), _query("reason", "Why (required), for the job's record.")],
                extra={
                    **_NOT_FOUND,
                    "409": _error(
                        "Refused: `not_resolvable` (pending, running, succeeded or cancelled) or "
                        "`already_resolved` (by someone else, or for another reason)."
                    ),
                },
                description="Closes the job without running it; it is never redriven afterwards. The same "
                "operator and reason again answer the resolution that stands (`already`). A missing reason "
                "is `invalid_reason`.",
            )
        },
        "/api/jobs/redrive": {
            "post": _operation(
                "Redrive every job a filter matches",
                "operate",
                "BulkAction",
                [
                    *_BULK_FILTERS,
                    _query(
                        "force",
                        "Redrive unrecoverable failures too, and jobs whose recorded terminal error the next "
                        "run replays (counted in `replaying_recorded_failure`).",
                        {"type": "boolean"},
                    ),
                    _query("reason", "Why, for each job's timeline."),
                ],
                description="Each job as `POST /api/jobs/{job_id}/redrive` would; refusals are counted by code, "
                "not answered as errors. At least one filter is required (`filter_required`).",
            )
        },
        "/api/jobs/cancel": {
            "post": _operation(
                "Cancel every job a filter matches",
                "operate",
                "BulkAction",
                [*_BULK_FILTERS, _query("reason", "Why, for each job's record.")],
                description="Each job as `POST /api/jobs/{job_id}/cancel` would; refusals are counted by code. "
                "At least one filter is required (`filter_required`).",
            )
        },
        "/api/jobs/resolve": {
            "post": _operation(
                "Resolve by hand every job a filter matches",
                "operate",
                "BulkAction",
                [*_BULK_FILTERS, _query("reason", "Why (required), for each job's record.")],
                description="Each job as `POST /api/jobs/{job_id}/resolve` would; refusals are counted by code. "
                "At least one filter is required (`filter_required`).",
            )
        },
        "/api/kinds/paused": {
            "get": _operation("The paused handler kinds", "view", "PausedKinds", []),
        },
        "/api/kinds/{kind}/pause": {
            "post": _operation(
                "Stop leasing one kind's jobs",
                "operate",
                "PausedKind",
                [_KIND, _query("reason", "Why, shown with the pause.")],
                description="Claims still land; the kind's jobs wait pending until it is resumed.",
            )
        },
        "/api/kinds/{kind}/resume": {
            "post": _operation(
                "Lease a paused kind's jobs again",
                "operate",
                "KindResumed",
                [_KIND, _query("reason", "Why, for the kind's log shown in its jobs' timelines.")],
                extra={"409": _error("Refused: `not_paused`.")},
            )
        },
        "/api/openapi.json": {
            "get": {
                "summary": "This document",
                "description": "Scope: `view`, like the reports it describes.",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
                    "401": _COMMON_ERRORS["401"],
                    "429": _COMMON_ERRORS["429"],
                },
            }
        },
    },
    "components": {
        "schemas": SCHEMAS,
        "parameters": PARAMETERS,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    },
}
