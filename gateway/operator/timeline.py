"""What happened to one effect, in order, as every face shows it (``ledger show``, ``jobs show``, the
dashboard): deliveries, attempts, steps (a step recovered by ``find=`` says so), rejects, how the job
ended, and every operator action with who, when and why (``ledger.jobs.audit``).

Read from the JSON documents (``documents.effect`` / ``documents.job``), so the CLI, the API and the
dashboard tell one story. ``attempt_history`` numbers attempts across redrives (a redrive starts the job's
own count again) and puts a "redriven by WHO at WHEN (why)" marker between them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["action_text", "attempt_history", "error_facts_text", "events", "step_status"]


def error_facts_text(facts: Mapping[str, Any] | None) -> str:
    """``HTTP 402, decline insufficient_funds, request req_123`` from an attempt's ``error_facts`` (or a
    step's error record); empty when none is known."""
    if not facts:
        return ""
    parts = []
    if facts.get("http_status") is not None:
        parts.append(f"HTTP {facts['http_status']}")
    if facts.get("decline_code"):
        parts.append(f"decline {facts['decline_code']}")
    if facts.get("request_id"):
        parts.append(f"request {facts['request_id']}")
    return ", ".join(parts)


def step_status(step: Mapping[str, Any]) -> str:
    """A step's status as shown: ``succeeded (found by find=)`` for one recovered by its ``find``."""
    return f"{step['status']} (found by find=, not called)" if step.get("found") else str(step["status"])


def action_text(action: Mapping[str, Any]) -> tuple[str, str]:
    """(what, detail) of one operator action, for a timeline row."""
    detail = action.get("detail") or {}
    what = {
        "redrive": "job redriven",
        "cancel": "job cancel requested" if detail.get("result") == "cancel_requested" else "job cancelled",
        "resolve": "job resolved by hand",
        "replay": "job claimed by replay",
        "pause": f"kind {detail.get('kind')} paused",
        "resume": f"kind {detail.get('kind')} resumed",
    }.get(str(action["action"]), str(action["action"]))
    # Who comes right after why: a table cuts long cells, and who must survive the cut.
    notes = [
        f"{action['reason']} (by {action['acted_by']})"
        if action.get("reason")
        else f"by {action['acted_by']}"
    ]
    if detail.get("force"):
        notes.append("force")
    for replay in detail.get("replays") or ():
        recorded = replay.get("code") or "its recorded error"
        notes.append(f"step {replay.get('step')} replays {recorded}: the provider will not be called")
    if detail.get("delivery"):
        notes.append(f"{detail.get('source', 'kept')} delivery {detail['delivery']}")
    return what, "; ".join(notes)


def attempt_history(
    attempts: Sequence[Mapping[str, Any]], actions: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The attempts oldest first, each with ``number`` (counted across redrives) and ``error_facts_text``,
    and before each attempt that follows a redrive a row ``{"marker": "redriven by WHO at WHEN (why)"}``."""
    redrives = sorted((a for a in actions if a["action"] == "redrive"), key=lambda a: _when(a["acted_at"]))
    rows: list[dict[str, Any]] = []
    for number, attempt in enumerate(
        sorted(attempts, key=lambda a: (_when(a["started_at"]), a["attempt"])), 1
    ):
        while redrives and _when(redrives[0]["acted_at"]) <= _when(attempt["started_at"]):
            rows.append({"marker": _redriven(redrives.pop(0))})
        rows.append(
            {**attempt, "number": number, "error_facts_text": error_facts_text(attempt.get("error_facts"))}
        )
    rows.extend({"marker": _redriven(r)} for r in redrives)
    return rows


def _when(value: Any) -> datetime:
    # Documents carry RFC 3339 text, whose order is not the text's when one time has a fraction of a second.
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _redriven(action: Mapping[str, Any]) -> str:
    why = f" ({action['reason']})" if action.get("reason") else ""
    force = ", with force" if (action.get("detail") or {}).get("force") else ""
    return f"redriven by {action['acted_by']} at {action['acted_at']}{why}{force}"


def events(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every event of an effect or job document as ``{"at", "what", "detail"}``, oldest first."""
    rows: list[dict[str, Any]] = []
    for d in document.get("deliveries", ()):
        rows.append(
            {
                "at": d["received_at"],
                "what": f"delivery {d['outcome']}",
                "detail": f"event {d['event_id']} request {d['request_id']}",
            }
        )
    for a in attempt_history(document["attempts"], ()):
        rows.append(
            {
                "at": a["started_at"],
                "what": f"attempt {a['number']} started",
                "detail": f"worker {a['worker']} lease token {a['lease_token']}",
            }
        )
        if a["finished_at"]:
            # The provider's facts before the message: a table cuts long cells, and they are what support asks.
            facts = f" [{a['error_facts_text']}]" if a["error_facts_text"] else ""
            error = f": {a['error_type']}: {a['error_message']}" if a["error_type"] else ""
            rows.append(
                {
                    "at": a["finished_at"],
                    "what": f"attempt {a['number']} ended",
                    "detail": f"{a['outcome']}{facts}{error}",
                }
            )
    for s in document["steps"]:
        answer = json.dumps(s["result"] if s["status"] == "succeeded" else s["error"], separators=(",", ":"))
        facts = error_facts_text(s["error"]) if isinstance(s["error"], dict) else ""
        rows.append(
            {
                "at": s["recorded_at"],
                "what": f"step {s['name']} {step_status(s)}",
                "detail": f"idempotency key {s['idempotency_key']}; answer {answer}"
                + (f" [{facts}]" if facts else ""),
            }
        )
    for r in document.get("rejects", ()):
        rows.append(
            {
                "at": r["received_at"],
                "what": "reject (key conflict)",
                "detail": f"event {r['event_id']}: {r.get('summary') or str(len(r.get('diff') or [])) + ' change(s)'}",
            }
        )
    job = document["job"]
    if job and job["finished_at"]:
        rows.append(
            {
                "at": job["finished_at"],
                "what": f"job {job['resolved_from'] or job['state']}",
                "detail": f"{job['terminal_reason'] or ''} (by {job['terminal_by'] or '?'})",
            }
        )
    for action in document.get("actions", ()):
        what, detail = action_text(action)
        rows.append({"at": action["acted_at"], "what": what, "detail": detail})
    return sorted(rows, key=lambda e: _when(e["at"]))
