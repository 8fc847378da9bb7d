"""``effectgate ledger show KEY``: one effect from delivery to outcome, with its steps and a timeline of
deliveries, attempts, steps, rejects, how its job ended and every operator action (``timeline``)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from effectgate.ledger import db, reports

from .. import documents, timeline
from ..params import parse_name
from .command import NotFound
from .output import diff_summary, print_csv, print_json, print_table


def _timeline(document: dict[str, Any]) -> list[dict[str, Any]]:
    rejects = [{**r, "summary": diff_summary(r["diff"], r["diff_truncated"])} for r in document["rejects"]]
    return timeline.events({**document, "rejects": rejects})


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
    rows_in_order = _timeline(document)
    if args.format == "csv":
        print_csv(out, rows_in_order, ("at", "what", "detail"))
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
        if job["last_error"] and job["state"] not in ("failed", "parked"):
            print("         (its last error is from an earlier attempt; see the timeline)", file=out)
    print("\nsteps (what was sent downstream, under which idempotency key, and the answer):", file=out)
    rows = [
        {
            **s,
            "status": timeline.step_status(s),
            "answer": s["result"] if s["status"] == "succeeded" else s["error"],
        }
        for s in document["steps"]
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
    print_table(out, rows_in_order, [("AT", "at"), ("WHAT", "what"), ("DETAIL", "detail")])
