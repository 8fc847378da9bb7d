"""The OpenAPI 3.1 document of the operator API, served at ``/api/openapi.json``.

The reports' paths, parameters and schemas are derived from their specs (``ledger.reports.REPORTS``);
the rest is written by hand next to the documents it describes (``documents.py``). The schemas are
strict (``additionalProperties: false``, every field required), and a test validates real answers of
every operation against them, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from typing import Any

from effectgate.ledger import reports
from effectgate.ledger.report_spec import Column, ColumnType, ReportSpec

from ..bodies import MAX_OPERATOR_BODY_BYTES
from . import documents, reporting

_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_BOOLEAN = {"type": "boolean"}
_TIME = {"type": "string", "format": "date-time"}
_ANY: dict[str, Any] = {}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _object(
    properties: dict[str, Any], *, optional: tuple[str, ...] = (), description: str = ""
) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": [p for p in properties if p not in optional],
        "additionalProperties": False,
    }
    if description:
        schema["description"] = description
    return schema


def _fields(names: tuple[str, ...], types: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # The field lists come from documents.py, so a field added there without a schema fails here.
    return {name: types[name] for name in names}


_COLUMN_TYPES: dict[ColumnType, dict[str, Any]] = {
    ColumnType.TEXT: _STRING,
    ColumnType.INTEGER: _INTEGER,
    ColumnType.NUMBER: {"type": "number"},
    ColumnType.TIME: _TIME,
    ColumnType.BOOLEAN: _BOOLEAN,
    ColumnType.JSON: _ANY,
    ColumnType.STATE: {"type": "string", "enum": list(reports.JOB_STATES)},
    ColumnType.DIFF: _array(_ref("DiffEntry")),
}


def _column_schema(column: Column) -> dict[str, Any]:
    schema = _COLUMN_TYPES[column.type]
    return _nullable(schema) if column.nullable else schema


def _columns(columns: tuple[Column, ...]) -> dict[str, Any]:
    return _object({c.name: _column_schema(c) for c in columns})


# Every report column's schema comes from the vocabulary (ledger.reports.FIELDS); these are the fields only
# the lineage and job documents have.
_FIELD_TYPES: dict[str, dict[str, Any]] = {
    **{name: _column_schema(column) for name, column in reports.FIELDS.items()},
    "handler": _STRING,
    "fingerprint": _STRING,
    "payload": _ANY,
    "reject_count": _INTEGER,
    "orphan_policy": {"type": "string", "enum": ["redrive", "park"]},
    "last_error": _ANY,
    "checkpoint": _ANY,
    "lock_key": _nullable(_STRING),
    "lock_key_held_by": _nullable(_INTEGER),
    "resolved_from": {"type": ["string", "null"], "enum": ["failed", "parked", None]},
    "worker": _STRING,
    "started_at": _TIME,
    "outcome": _nullable(_STRING),
    "error_type": _nullable(_STRING),
    "error_message": _nullable(_STRING),
    "traceback": _nullable(_STRING),
    "name": _STRING,
    "idempotency_key": {
        "type": "string",
        "description": "The Idempotency-Key sent downstream for this step.",
    },
    "status": {"type": "string", "enum": ["started", "succeeded", "failed"]},
    "result": {"description": "The downstream answer the step recorded."},
    "error": _ANY,
    "job_id": _INTEGER,
    "recorded_at": _TIME,
    "request_id": _STRING,
    "secret_index": _nullable(_INTEGER),
}
_DELIVERY_TYPES = {
    **_FIELD_TYPES,
    "outcome": {"type": "string", "enum": ["accepted", "duplicate", "rejected"]},
}
_ATTEMPT_TYPES = {**_FIELD_TYPES, "finished_at": _nullable(_TIME)}

SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {"error": _STRING, "detail": _STRING, "parameter": _STRING},
        optional=("parameter",),
        description="Every answer that is not a 2xx; `parameter` names the query parameter a 400 is about.",
    ),
    "DiffEntry": _object(
        {
            "path": {"type": "string", "description": "A JSON Pointer (RFC 6901) into both payloads."},
            "change": {"type": "string", "enum": ["changed", "added", "removed"]},
            "held": {"description": "The value in the payload that holds the key (absent when added)."},
            "rejected": {"description": "The value in the rejected payload (absent when removed)."},
        },
        optional=("held", "rejected"),
    ),
    "JobDetail": _object(_fields(documents.JOB_DETAIL_FIELDS, _FIELD_TYPES)),
    "Attempt": _object(_fields(documents.ATTEMPT_FIELDS, _ATTEMPT_TYPES)),
    "Step": _object(_fields(documents.STEP_FIELDS, _FIELD_TYPES)),
    "JobView": _object(
        {"job": _ref("JobDetail"), "attempts": _array(_ref("Attempt")), "steps": _array(_ref("Step"))}
    ),
    "Effect": _object(_fields(documents.EFFECT_FIELDS, _FIELD_TYPES)),
    "Delivery": _object(_fields(documents.DELIVERY_FIELDS, _DELIVERY_TYPES)),
    "EffectReject": _object(_fields(documents.EFFECT_REJECT_FIELDS, _FIELD_TYPES)),
    "EffectLineage": _object(
        {
            "effect": _ref("Effect"),
            "job": {"oneOf": [_ref("JobDetail"), {"type": "null"}]},
            "deliveries": _array(_ref("Delivery")),
            "rejects": _array(_ref("EffectReject")),
            "attempts": _array(_ref("Attempt")),
            "steps": _array(_ref("Step")),
        },
        description="One effect from delivery to outcome.",
    ),
    "BulkAction": _object(
        {
            "action": {"type": "string", "enum": ["redrive", "cancel", "resolve"]},
            "dry_run": _BOOLEAN,
            "matched": _INTEGER,
            "done": _INTEGER,
            "refused": {"type": "object", "additionalProperties": _INTEGER},
            "job_ids": _array(_INTEGER),
            "refused_job_ids": {"type": "object", "additionalProperties": _array(_INTEGER)},
        },
        description="What a bulk action did (with dry_run, would do): jobs matched, done, refused by code.",
    ),
    "PausedKind": _object(
        {"kind": _STRING, "paused_at": _TIME, "paused_by": _STRING, "reason": _nullable(_STRING)},
    ),
    "PausedKinds": _object(
        {
            "paused": _array(
                _object(
                    {
                        "kind": _STRING,
                        "paused_at": _TIME,
                        "paused_by": _STRING,
                        "reason": _nullable(_STRING),
                        "pending": _INTEGER,
                    }
                )
            )
        }
    ),
    "KindResumed": _object({"kind": _STRING, "paused": {"type": "boolean", "const": False}}),
    "JobAction": _object(
        {
            "job_id": _INTEGER,
            "state": {"type": "string", "enum": list(reports.JOB_STATES)},
            "cancel_requested": _BOOLEAN,
        },
        optional=("cancel_requested",),
        description="The state a redrive or cancel left the job in (`running` with `cancel_requested` when "
        "the cancel waits for the worker's next heartbeat).",
    ),
    "JobResolved": _object(
        {
            "job_id": _INTEGER,
            "state": {"type": "string", "const": "resolved"},
            "resolved_from": {"type": "string", "enum": ["failed", "parked"]},
            "resolved_at": _TIME,
            "resolved_by": _STRING,
            "resolved_reason": _STRING,
            "already": _BOOLEAN,
        },
        description="A job resolved by hand: who, why, when, and which state it closed. `already` is true when "
        "the same operator resolved it before for the same reason (nothing changed).",
    ),
}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or _STRING,
    }


PARAMETERS: dict[str, Any] = {
    "job_id": {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}},
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


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
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}},
            **_COMMON_ERRORS,
            **(_FORBIDDEN if scope == "operate" else {}),
            **(extra or {}),
        },
    }


def _p(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/parameters/{name}"}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _report_schemas(spec: ReportSpec) -> dict[str, Any]:
    """The schemas of one report's document, from its spec: ``<Name>Report``, ``<Name>Row`` and the
    summary's rows."""
    name = _camel(spec.name)
    time = _nullable(_TIME) if spec.window is None else _TIME
    document: dict[str, Any] = {"since": time, "until": time}
    if reporting.has_sorts(spec):
        document["sort"] = {"type": "string", "enum": [s.name for s in spec.sorts]}
    document[spec.items_key] = _array(_ref(f"{name}Row"))
    document["next_cursor"] = _nullable(_STRING)
    schemas = {
        f"{name}Report": _object(document, description=spec.description),
        f"{name}Row": _columns(spec.columns),
    }
    if spec.summary is not None:
        summary = f"{name}{_camel(spec.summary.key)}"
        document[spec.summary.key] = _array(_ref(summary))
        schemas[summary] = _columns(spec.summary.columns)
    return schemas


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
        f"{_camel(spec.name)}Report",
        [_report_parameter(spec, name) for name in reporting.parameters(spec)],
        description=spec.description,
    )


for _spec in reports.REPORTS:
    SCHEMAS.update(_report_schemas(_spec))

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
_KIND = {"name": "kind", "in": "path", "required": True, "schema": _STRING}

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
                    {"name": "key", "in": "path", "required": True, "schema": _STRING},
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
                [_p("job_id"), _query("force", "Redrive an unrecoverable failure too.", {"type": "boolean"})],
                extra={
                    **_NOT_FOUND,
                    "409": _error(
                        "Refused: `not_redrivable`, `unrecoverable_requires_force` or `lock_key_held`."
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
                [*_BULK_FILTERS, _query("force", "Redrive unrecoverable failures too.", {"type": "boolean"})],
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
                [_KIND],
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
