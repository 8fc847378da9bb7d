"""The schemas of the OpenAPI document (``components.schemas``): every document the operator API answers,
field by field, strict (``additionalProperties: false``, every field required). The reports' schemas come
from their specs; the rest follow the field lists of ``documents.py``, so a field added there without a
schema fails at import.
"""

from __future__ import annotations

from typing import Any

from effectgate.ledger import reports
from effectgate.ledger.reports.spec import Column, ColumnType, ReportSpec

from . import documents, reporting

STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_BOOLEAN = {"type": "boolean"}
_TIME = {"type": "string", "format": "date-time"}
_ANY: dict[str, Any] = {}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def ref(name: str) -> dict[str, str]:
    """A reference to the schema ``name``."""
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
    ColumnType.TEXT: STRING,
    ColumnType.INTEGER: _INTEGER,
    ColumnType.NUMBER: {"type": "number"},
    ColumnType.TIME: _TIME,
    ColumnType.BOOLEAN: _BOOLEAN,
    ColumnType.JSON: _ANY,
    ColumnType.STATE: {"type": "string", "enum": list(reports.JOB_STATES)},
    ColumnType.DIFF: _array(ref("DiffEntry")),
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
    "handler": STRING,
    "fingerprint": STRING,
    "payload": _ANY,
    "reject_count": _INTEGER,
    "orphan_policy": {"type": "string", "enum": ["redrive", "park"]},
    "last_error": _ANY,
    "checkpoint": _ANY,
    "lock_key": _nullable(STRING),
    "lock_key_held_by": _nullable(_INTEGER),
    "resolved_from": {"type": ["string", "null"], "enum": ["failed", "parked", None]},
    "worker": STRING,
    "started_at": _TIME,
    "outcome": _nullable(STRING),
    "error_type": _nullable(STRING),
    "error_message": _nullable(STRING),
    "error_facts": {
        "type": ["object", "null"],
        "description": "The rest of the error record, where known: code, http_status, request_id (the "
        "provider's, as its support asks for it), decline_code.",
    },
    "traceback": _nullable(STRING),
    "found": {
        "type": "boolean",
        "description": "The outcome was found by the step's find= (an earlier call had reached the API), "
        "not called.",
    },
    "action": {"type": "string", "enum": ["redrive", "cancel", "resolve", "replay", "pause", "resume"]},
    "acted_by": {"type": "string", "description": "operator:TOKEN_NAME (API, dashboard) or cli:USER."},
    "reason": _nullable(STRING),
    "detail": {
        "type": ["object", "null"],
        "description": "What the action saw: force and the recorded failures a redrive replays, the "
        "delivery a replay came from, the kind a pause or resume was of.",
    },
    "acted_at": _TIME,
    "name": STRING,
    "idempotency_key": {
        "type": "string",
        "description": "The Idempotency-Key sent downstream for this step.",
    },
    "status": {"type": "string", "enum": ["started", "succeeded", "failed"]},
    "result": {"description": "The downstream answer the step recorded."},
    "error": _ANY,
    "job_id": _INTEGER,
    "recorded_at": _TIME,
    "request_id": STRING,
    "secret_index": _nullable(_INTEGER),
}
_DELIVERY_TYPES = {
    **_FIELD_TYPES,
    "outcome": {"type": "string", "enum": ["accepted", "duplicate", "rejected"]},
}
_ATTEMPT_TYPES = {**_FIELD_TYPES, "finished_at": _nullable(_TIME)}

SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {"error": STRING, "detail": STRING, "parameter": STRING},
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
    "Action": _object(_fields(documents.ACTION_FIELDS, _FIELD_TYPES)),
    "JobView": _object(
        {
            "job": ref("JobDetail"),
            "attempts": _array(ref("Attempt")),
            "steps": _array(ref("Step")),
            "actions": _array(ref("Action")),
        }
    ),
    "Effect": _object(_fields(documents.EFFECT_FIELDS, _FIELD_TYPES)),
    "Delivery": _object(_fields(documents.DELIVERY_FIELDS, _DELIVERY_TYPES)),
    "EffectReject": _object(_fields(documents.EFFECT_REJECT_FIELDS, _FIELD_TYPES)),
    "EffectLineage": _object(
        {
            "effect": ref("Effect"),
            "job": {"oneOf": [ref("JobDetail"), {"type": "null"}]},
            "deliveries": _array(ref("Delivery")),
            "rejects": _array(ref("EffectReject")),
            "attempts": _array(ref("Attempt")),
            "steps": _array(ref("Step")),
            "actions": _array(ref("Action")),
        },
        description="One effect from delivery to outcome, with every operator action on its job.",
    ),
    "BulkAction": _object(
        {
            "action": {"type": "string", "enum": ["redrive", "cancel", "resolve"]},
            "dry_run": _BOOLEAN,
            "matched": _INTEGER,
            "done": _INTEGER,
            "refused": {"type": "object", "additionalProperties": _INTEGER},
            "replaying_recorded_failure": {
                "type": "integer",
                "description": "Redriven with force though a step recorded a terminal error that the next "
                "run replays without calling the provider.",
            },
            "job_ids": _array(_INTEGER),
            "refused_job_ids": {"type": "object", "additionalProperties": _array(_INTEGER)},
            "replaying_job_ids": _array(_INTEGER),
        },
        description="What a bulk action did (with dry_run, would do): jobs matched, done, refused by code.",
    ),
    "PausedKind": _object(
        {"kind": STRING, "paused_at": _TIME, "paused_by": STRING, "reason": _nullable(STRING)},
    ),
    "PausedKinds": _object(
        {
            "paused": _array(
                _object(
                    {
                        "kind": STRING,
                        "paused_at": _TIME,
                        "paused_by": STRING,
                        "reason": _nullable(STRING),
                        "pending": _INTEGER,
                    }
                )
            )
        }
    ),
    "KindResumed": _object({"kind": STRING, "paused": {"type": "boolean", "const": False}}),
    "JobAction": _object(
        {
            "job_id": _INTEGER,
            "state": {"type": "string", "enum": list(reports.JOB_STATES)},
            "cancel_requested": _BOOLEAN,
            "replays": {
                **_array(_object({"step": STRING, "code": _nullable(STRING), "message": _nullable(STRING)})),
                "description": "A redrive's warning: the steps whose recorded terminal error the next run "
                "replays without calling the provider (only a forced redrive has any).",
            },
        },
        optional=("cancel_requested", "replays"),
        description="The state a redrive or cancel left the job in (`running` with `cancel_requested` when "
        "the cancel waits for the worker's next heartbeat).",
    ),
    "JobResolved": _object(
        {
            "job_id": _INTEGER,
            "state": {"type": "string", "const": "resolved"},
            "resolved_from": {"type": "string", "enum": ["failed", "parked"]},
            "resolved_at": _TIME,
            "resolved_by": STRING,
            "resolved_reason": STRING,
            "already": _BOOLEAN,
        },
        description="A job resolved by hand: who, why, when, and which state it closed. `already` is true when "
        "the same operator resolved it before for the same reason (nothing changed).",
    ),
}


def camel(name: str) -> str:
    """``key_conflicts`` as ``KeyConflicts``: a report's name in its schemas' names."""
    return "".join(part.capitalize() for part in name.split("_"))


def _report_schemas(spec: ReportSpec) -> dict[str, Any]:
    """The schemas of one report's document, from its spec: ``<Name>Report``, ``<Name>Row`` and the
    summary's rows."""
    name = camel(spec.name)
    time = _nullable(_TIME) if spec.window is None else _TIME
    document: dict[str, Any] = {"since": time, "until": time}
    if reporting.has_sorts(spec):
        document["sort"] = {"type": "string", "enum": [s.name for s in spec.sorts]}
    document[spec.items_key] = _array(ref(f"{name}Row"))
    document["next_cursor"] = _nullable(STRING)
    schemas = {
        f"{name}Report": _object(document, description=spec.description),
        f"{name}Row": _columns(spec.columns),
    }
    if spec.summary is not None:
        summary = f"{name}{camel(spec.summary.key)}"
        document[spec.summary.key] = _array(ref(summary))
        schemas[summary] = _columns(spec.summary.columns)
    return schemas


for _spec in reports.REPORTS:
    SCHEMAS.update(_report_schemas(_spec))
