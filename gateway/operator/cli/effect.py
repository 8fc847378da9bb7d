"""``effectgate ledger show KEY``: one effect from delivery to outcome, with its steps and a timeline of
deliveries, attempts, steps, rejects and how its job ended."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from effectgate.ledger import db, reports

from .. import documents
from ..params import parse_name
from .command import NotFound
from .output import diff_summary, print_csv, print_json, print_table


def _timeline(document: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for d in document["deliveries"]:
        events.append(
            {
                "at": d["received_at"],
                "what": f"delivery {d['outcome']}",
                "detail": f"event {d['event_id']} request {d['request_id']}",
            }
        )
    for a in document["attempts"]:
        events.append(
            {
                "at": a["started_at"],
                "what": f"attempt {a['attempt']} started",
                "detail": f"worker {a['worker']} lease token {a['lease_token']}",
            }
        )
        if a["finished_at"]:
            error = f": {a['error_type']}: {a['error_message']}" if a["error_type"] else ""
            events.append(
                {
                    "at": a["finished_at"],
                    "what": f"attempt {a['attempt']} ended",
                    "detail": f"{a['outcome']}{error}",
                }
            )
    for s in document["steps"]:
        answer = json.dumps(s["result"] if s["status"] == "succeeded" else s["error"], separators=(",", ":"))
        events.append(
            {
                "at": s["recorded_at"],
                "what": f"step {s['name']} {s['status']}",
                "detail": f"idempotency key {s['idempotency_key']}; answer {answer}",
            }
        )
    for r in document["rejects"]:
        events.append(
            {
                "at": r["received_at"],
                "what": "reject (key conflict)",
                "detail": f"event {r['event_id']}: {diff_summary(r['diff'], r['diff_truncated'])}",
            }
        )
    job = document["job"]
    if job and job["finished_at"]:
        events.append(
            {
                "at": job["finished_at"],
                "what": f"job {job['resolved_from'] or job['state']}",
                "detail": f"{job['terminal_reason'] or ''} (by {job['terminal_by'] or '?'})",
            }
        )
    if job and job["resolved_at"]:
        events.append(
            {
                "at": job["resolved_at"],
                "what": "job resolved by hand",
                "detail": f"{job['resolved_reason']} (by {job['resolved_by']})",
            }
        )
    return sorted(events, key=lambda e: e["at"])


async def cmd_show(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    view = await reports.effect_view(
        conn,
        parse_name(args.key, "key", max_length=reports.MAX_KEY_LENGTH) or "",
        tenant=parse_name(args.tenant, "tenant"),
    )
    if view is None:
        raise NotFound(
            f"no effect with key {args.key!r}" + (f" in tenant {args.tenant!r}" if args.tenant else "")
        )
    document = documents.effect(view)
    if args.format == "json":
        print_json(out, document)
        return
    timeline = _timeline(document)
    if args.format == "csv":
        print_csv(out, timeline, ("at", "what", "detail"))
        return
    effect, job = document["effect"], document["job"]
    print(f"effect   {effect['effect_key']}  (tenant {effect['tenant']})", file=out)
    print(
        f"event    {effect['source']} {effect['event_type']} {effect['event_id']}  → handler {effect['handler']}",
        file=out,
    )
    print(
        f"claimed  {effect['first_seen_at']}  deliveries {effect['delivery_count']}, "
        f"rejects {effect['reject_count']}, fingerprint {effect['fingerprint'][:16]}…",
        file=out,
    )
    if job is None:
        print("job      none", file=out)
    else:
        reason = f" — {job['terminal_reason']}" if job["terminal_reason"] else ""
        print(
            f"job      {job['id']} {job['state']}{reason}  (attempt {job['attempt']}/{job['max_attempts']}"
            f"{', by ' + job['terminal_by'] if job['terminal_by'] else ''})",
            file=out,
        )
        if job["resolved_at"]:
            print(
                f"resolved by hand from {job['resolved_from']} by {job['resolved_by']} at {job['resolved_at']}"
                f" — {job['resolved_reason']}",
                file=out,
            )
    print("\nsteps (what was sent downstream, under which idempotency key, and the answer):", file=out)
    rows = [
        {**s, "answer": s["result"] if s["status"] == "succeeded" else s["error"]} for s in document["steps"]
    ]
    print_table(
        out,
        rows,
        [
            ("STEP", "name"),
            ("STATUS", "status"),
            ("IDEMPOTENCY KEY", "idempotency_key"),
            ("RECORDED", "recorded_at"),
            ("ANSWER", "answer"),
        ],
    )
    print("\ntimeline:", file=out)
    print_table(out, timeline, [("AT", "at"), ("WHAT", "what"), ("DETAIL", "detail")])
