"""``effectgate jobs …``: list and show jobs; redrive, cancel and resolve one job (or, with filters, many:
``bulk.py``); pause and resume a kind."""

from __future__ import annotations

import argparse
import io
from datetime import UTC, datetime
from typing import Any, TextIO

from effectgate.handlers.actions import control
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.jobs import audit, filters, resolutions
from effectgate.ledger.reports import JOBS
from effectgate.ledger.vocabulary import JobState

from .. import documents, reporting, timeline
from ..params import BadParameter, parse_id, parse_name
from .bulk import filter_flags, run_bulk
from .command import (
    EPILOG,
    LedgerRunner,
    NotFound,
    Refused,
    format_flag,
    import_handler_modules,
    operator_name,
    raw_parameters,
    refusal_error,
    report_flags,
    resolver,
    runner,
)
from .ledger import report_command
from .output import age, cell, print_csv, print_json, print_more, print_table


async def cmd_jobs_list(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    if args.format != "table":
        await report_command(JOBS)(conn, args, out)
        return
    document = reporting.document(await reporting.fetch(conn, JOBS, raw_parameters(JOBS, args)))
    now = datetime.now(UTC)
    rows = [
        {
            **j,
            "tries": f"{j['attempt']}/{j['max_attempts']}",
            "age": age(j["created_at"], now),
            "note": _resolution_note(j)
            or j["terminal_reason"]
            or ("cancel requested" if j["cancel_requested"] else j["lease_owner"]),
        }
        for j in document["items"]
    ]
    print_table(
        out,
        rows,
        [
            ("ID", "id"),
            ("STATE", "state"),
            ("KIND", "kind"),
            ("SOURCE", "source"),
            ("KEY", "effect_key"),
            ("TRIES", "tries"),
            ("AGE", "age"),
            ("REASON / WORKER", "note"),
        ],
    )
    print_more(out, document)


def _resolution_note(job: dict[str, Any]) -> str | None:
    if not job.get("resolved_at"):
        return None
    return f"resolved by {job['resolved_by']}: {job['resolved_reason']}"


async def cmd_jobs_show(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    view = await reports.job_view(conn, parse_id(args.job_id, "job_id"))
    if view is None:
        raise NotFound(f"no job {args.job_id}")
    document = documents.job(view)
    if args.format == "json":
        print_json(out, document)
        return
    if args.format == "csv":
        print_csv(out, document["attempts"], documents.ATTEMPT_FIELDS)
        return
    job = document["job"]
    width = max(len(k) for k in job)
    for key, value in job.items():
        print(f"{key.ljust(width)}  {cell(value)}", file=out)
    if job["last_error"] and job["state"] not in ("failed", "parked"):
        print("(last_error is from an earlier attempt: the job is not failed now)", file=out)
    print("\nattempts (numbered across redrives):", file=out)
    history = timeline.attempt_history(document["attempts"], document["actions"])
    rows = [
        {
            **a,
            # The provider's facts first: the table cuts long cells.
            "error": (f"[{a['error_facts_text']}] " if a["error_facts_text"] else "")
            + (f"{a['error_type']}: {a['error_message']}" if a["error_type"] else ""),
        }
        for a in history
        if "marker" not in a
    ]
    table = io.StringIO()
    print_table(
        table,
        rows,
        [
            ("#", "number"),
            ("TRY", "attempt"),
            ("TOKEN", "lease_token"),
            ("WORKER", "worker"),
            ("STARTED", "started_at"),
            ("FINISHED", "finished_at"),
            ("OUTCOME", "outcome"),
            ("ERROR", "error"),
        ],
    )
    # Each marker in full between the attempts it separates: who redrove, when and why is not cut.
    lines = iter(table.getvalue().splitlines())
    print(next(lines), file=out)
    for a in history:
        print(f"  ↻ {a['marker']}" if "marker" in a else next(lines), file=out)
    for rest in lines:  # "(none)"
        print(rest, file=out)
    print("\nsteps:", file=out)
    print_table(
        out,
        [{**s, "status": timeline.step_status(s)} for s in document["steps"]],
        [
            ("STEP", "name"),
            ("STATUS", "status"),
            ("IDEMPOTENCY KEY", "idempotency_key"),
            ("RECORDED", "recorded_at"),
        ],
    )
    print("\noperator actions (and its kind's pauses in its lifetime):", file=out)
    actions = []
    for a in document["actions"]:
        what, detail = timeline.action_text(a)
        actions.append({"at": a["acted_at"], "what": what, "detail": detail})
    print_table(out, actions, [("AT", "at"), ("WHAT", "what"), ("DETAIL", "detail")])


async def cmd_jobs_redrive(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    if args.job_id is None:
        await run_bulk(conn, args, out, "redrive")
        return
    no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    reason = audit.check_note(args.reason)
    refusal = await jobs.redrive(conn, job_id, by=operator_name(), reason=reason, force=args.force)
    if refusal is not None:
        raise refusal_error(refusal)
    # Only a forced redrive gets here with recorded failures: say what the next run will not do.
    replays = await audit.replayed_failures(conn, job_id)
    if args.format == "json":
        print_json(
            out,
            {
                "job_id": job_id,
                "state": JobState.PENDING,
                **(
                    {"replays": [{"step": f.step, "code": f.code, "message": f.message} for f in replays]}
                    if replays
                    else {}
                ),
            },
        )
        return
    print(f"job {job_id}: redriven, now pending", file=out)
    for f in replays:
        print(
            f"warning: step {f.describe()} replays its recorded error; the provider will not be called",
            file=out,
        )


def no_filters(args: argparse.Namespace) -> None:
    for flag in ("state", "kind", "source", "since", "limit"):
        if getattr(args, flag) is not None:
            raise BadParameter(flag, "filters select jobs for a bulk action; give them without a JOB_ID")
    if args.dry_run:
        raise BadParameter("dry_run", "--dry-run is for bulk actions (filters without a JOB_ID)")


async def cmd_jobs_pause(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    kind = parse_name(args.kind, "kind")
    assert kind is not None
    row = await filters.pause(conn, kind, by=operator_name(), reason=audit.check_note(args.reason))
    if args.format == "json":
        print_json(out, row)
    else:
        print(
            f"kind {kind}: paused; its jobs wait pending until `effectgate jobs resume --kind {kind}`",
            file=out,
        )


async def cmd_jobs_resume(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    kind = parse_name(args.kind, "kind")
    assert kind is not None
    if not await filters.resume(conn, kind, by=operator_name(), reason=audit.check_note(args.reason)):
        raise Refused("not_paused", f"kind {kind} is not paused")
    if args.format == "json":
        print_json(out, {"kind": kind, "paused": False})
    else:
        print(f"kind {kind}: resumed", file=out)


async def cmd_jobs_paused(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    rows = await filters.paused(conn)
    if args.format == "json":
        print_json(out, {"paused": rows})
        return
    print_table(
        out,
        rows,
        [
            ("KIND", "kind"),
            ("PAUSED AT", "paused_at"),
            ("BY", "paused_by"),
            ("PENDING", "pending"),
            ("REASON", "reason"),
        ],
    )


async def cmd_jobs_cancel(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    if args.job_id is None:
        await run_bulk(conn, args, out, "cancel")
        return
    no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    reason = audit.check_note(args.reason) or "cancelled by operator"  # before anything is imported
    import_handler_modules(args)
    outcome = await control.cancel(conn, REGISTRY, job_id, by=operator_name(), reason=reason)
    if isinstance(outcome, jobs.Refused):
        raise refusal_error(outcome)
    if args.format == "json":
        print_json(out, {"job_id": job_id, "state": outcome, "cancel_requested": True})
    elif outcome == JobState.CANCELLED:
        print(f"job {job_id}: cancelled", file=out)
    else:
        print(f"job {job_id}: cancel requested; it ends cancelled at its worker's next heartbeat", file=out)


async def cmd_jobs_resolve(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    resolutions.check_reason(args.reason)  # before anything is matched or imported
    if args.job_id is None:
        await run_bulk(conn, args, out, "resolve")
        return
    no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    import_handler_modules(args)
    outcome = await control.resolve(conn, REGISTRY, job_id, by=resolver(args), reason=args.reason)
    if isinstance(outcome, jobs.Refused):
        raise refusal_error(outcome)
    if args.format == "json":
        print_json(out, documents.resolution(outcome))
        return
    print(
        f"job {job_id}: {'already ' if outcome.already else ''}resolved by hand (was {outcome.resolved_from}) "
        f"by {outcome.resolved_by} at {outcome.resolved_at.isoformat()}: {outcome.resolved_reason}",
        file=out,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], run_on_ledger: LedgerRunner) -> None:
    """Add the ``jobs`` commands to the ``effectgate`` parser."""
    jobs = sub.add_parser("jobs", help="list, show, redrive, cancel and resolve jobs", epilog=EPILOG)
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")

    listing = jobs_sub.add_parser("list", help="jobs by state, kind, source and age", epilog=EPILOG)
    report_flags(listing, JOBS)
    listing.set_defaults(func=runner(cmd_jobs_list, run_on_ledger))

    show_job = jobs_sub.add_parser("show", help="one job with its attempts and steps", epilog=EPILOG)
    show_job.add_argument("job_id", metavar="JOB_ID")
    format_flag(show_job)
    show_job.set_defaults(func=runner(cmd_jobs_show, run_on_ledger))

    redrive = jobs_sub.add_parser(
        "redrive",
        help="put a failed or parked job (or every job a filter matches) back to pending",
        epilog=EPILOG,
    )
    redrive.add_argument("job_id", metavar="JOB_ID", nargs="?", help="one job; or give filters instead")
    redrive.add_argument(
        "--force",
        action="store_true",
        help="redrive an unrecoverable failure, or one whose step recorded a terminal error (a decline) that "
        "the next run replays without calling the provider",
    )
    redrive.add_argument("--reason", help="why, recorded in the job's timeline")
    filter_flags(redrive)
    format_flag(redrive)
    redrive.set_defaults(func=runner(cmd_jobs_redrive, run_on_ledger))

    cancel = jobs_sub.add_parser(
        "cancel", help="cancel a pending or running job (or every job a filter matches)", epilog=EPILOG
    )
    cancel.add_argument("job_id", metavar="JOB_ID", nargs="?", help="one job; or give filters instead")
    cancel.add_argument("--reason", default="cancelled by operator", help="recorded with the job")
    cancel.add_argument(
        "--handlers",
        action="append",
        metavar="MODULE",
        help="import this handler module so its kind's on_transition mirrors the cancel (repeatable)",
    )
    filter_flags(cancel)
    format_flag(cancel)
    cancel.set_defaults(func=runner(cmd_jobs_cancel, run_on_ledger))

    resolve = jobs_sub.add_parser(
        "resolve",
        help="close a failed or parked job without running it (or every job a filter matches)",
        epilog=EPILOG,
    )
    resolve.add_argument("job_id", metavar="JOB_ID", nargs="?", help="one job; or give filters instead")
    resolve.add_argument("--reason", required=True, help="why it needs nothing more (required; recorded)")
    resolve.add_argument("--by", help="who resolves it, recorded as cli:NAME (default: the OS user)")
    resolve.add_argument(
        "--handlers",
        action="append",
        metavar="MODULE",
        help="import this handler module so its kind's on_transition mirrors the resolution (repeatable)",
    )
    filter_flags(resolve)
    format_flag(resolve)
    resolve.set_defaults(func=runner(cmd_jobs_resolve, run_on_ledger))

    pause = jobs_sub.add_parser(
        "pause", help="stop leasing one kind's jobs (they wait pending)", epilog=EPILOG
    )
    pause.add_argument("--kind", required=True, help="the handler kind, e.g. commerce.fulfil_order")
    pause.add_argument("--reason", help="recorded with the pause, shown by `jobs paused`")
    format_flag(pause)
    pause.set_defaults(func=runner(cmd_jobs_pause, run_on_ledger))

    resume = jobs_sub.add_parser("resume", help="lease a paused kind's jobs again", epilog=EPILOG)
    resume.add_argument("--kind", required=True, help="the paused handler kind")
    resume.add_argument("--reason", help="recorded in the kind's log, shown in its jobs' timelines")
    format_flag(resume)
    resume.set_defaults(func=runner(cmd_jobs_resume, run_on_ledger))

    paused = jobs_sub.add_parser("paused", help="the paused kinds and their waiting jobs", epilog=EPILOG)
    format_flag(paused)
    paused.set_defaults(func=runner(cmd_jobs_paused, run_on_ledger))
