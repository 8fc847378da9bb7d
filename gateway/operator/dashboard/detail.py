"""One job (state, last error, attempts numbered across redrives, steps, operator actions) and one effect's
lineage from delivery to outcome with its timeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from effectgate.ledger import db, reports

from ...config.operator import OperatorToken
from .. import documents, timeline
from ..params import parse_id, parse_name
from .rendering import Cell, message, render
from .signin import view

_NOTICES = {
    "redriven": "Redriven: the job is pending again.",
    "redriven_replaying": "Redriven with force: the job is pending again. A step recorded a terminal error that "
    "its next run replays without calling the provider (see Steps).",
    "cancelled": "Cancelled.",
    "cancel_requested": "Cancel requested: the job stops at its worker's next heartbeat.",
    "resolved": "Resolved by hand: the job is closed and will not run.",
}
ATTEMPT_CELLS = [
    Cell("#", "number", "num"),
    Cell("try", "attempt", "num"),
    Cell("lease token", "lease_token", "num"),
    Cell("worker", "worker"),
    Cell("started", "started_at", "time"),
    Cell("finished", "finished_at", "time"),
    Cell("outcome", "outcome"),
    Cell("error", "error_type", "error"),
]
STEP_CELLS = [
    Cell("step", "name"),
    Cell("status", "status"),
    Cell("idempotency key", "idempotency_key"),
    Cell("answer", "answer", "json"),
    Cell("recorded", "recorded_at", "time"),
]


ACTION_CELLS = [
    Cell("at", "at", "time"),
    Cell("what", "what"),
    Cell("detail", "detail"),
]


def _steps(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **s,
            "status": timeline.step_status(s),
            "answer": s["result"] if s["status"] == "succeeded" else s["error"],
        }
        for s in steps
    ]


def _actions(actions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for a in actions:
        what, detail = timeline.action_text(a)
        rows.append({"at": a["acted_at"], "what": what, "detail": detail})
    return rows


@view()
async def job_show(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """One job: its state and last error (type, message, folded traceback), its attempts and steps."""
    result = await reports.job_view(conn, parse_id(request.path_params["job_id"], "job_id"))
    if result is None:
        return message(
            "Not found", f"No job {request.path_params['job_id']}.", operator, status=404, kind="muted"
        )
    document = documents.job(result)
    job = document["job"]
    error = job["last_error"] if isinstance(job["last_error"], dict) else None
    # What a redrive would replay without calling the provider: the dashboard's confirm names it.
    replays = [s for s in document["steps"] if s["status"] == "failed"]
    return render(
        "job.html",
        f"Job {job['id']}",
        operator,
        job={
            **job,
            "last_error": error,
            "last_error_facts": timeline.error_facts_text(error),
            "replays": replays,
        },
        done=_NOTICES.get(query.get("done", "")),
        refused=query.get("refused"),
        attempts=timeline.attempt_history(document["attempts"], document["actions"]),
        attempt_columns=ATTEMPT_CELLS,
        steps=_steps(document["steps"]),
        step_columns=STEP_CELLS,
        actions=_actions(document["actions"]),
        action_columns=ACTION_CELLS,
    )


@view()
async def effect(request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]) -> Response:
    """One effect from delivery to outcome."""
    key = request.path_params["key"]
    result = await reports.effect_view(
        conn,
        parse_name(key, "key", max_length=reports.MAX_KEY_LENGTH) or "",
        tenant=parse_name(query.get("tenant"), "tenant"),
    )
    if result is None:
        return message("Not found", f"No effect with key {key}.", operator, status=404, kind="muted")
    document = documents.effect(result)
    payload = documents.dumps(document["effect"]["payload"])
    return render(
        "effect.html",
        f"Effect {key}",
        operator,
        effect=document["effect"],
        job=document["job"],
        steps=_steps(document["steps"]),
        step_columns=STEP_CELLS,
        deliveries=document["deliveries"],
        delivery_columns=[
            Cell("received", "received_at", "time"),
            Cell("outcome", "outcome"),
            Cell("event", "event_id"),
            Cell("request", "request_id", "long"),
            Cell("fingerprint", "fingerprint", "fingerprint"),
        ],
        attempts=timeline.attempt_history(document["attempts"], document["actions"]),
        attempt_columns=ATTEMPT_CELLS,
        timeline=timeline.events(document),
        rejects=document["rejects"],
        reject_columns=[
            Cell("received", "received_at", "time"),
            Cell("event", "event_id"),
            Cell("fingerprint", "rejected_fingerprint", "fingerprint"),
            Cell("changes (held → rejected)", "diff", "diff"),
        ],
        payload_size=len(payload.encode("utf-8")),
        payload_open=len(payload) <= 2000,
    )
