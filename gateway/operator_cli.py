"""``effectgate ledger …`` and ``effectgate jobs …``: the operator reports and job control on the command line.

    effectgate ledger REPORT      [its filters] [--sort …] [--since …] [--until …] [--limit N] [--cursor C]
                                  (every report in ledger.reports.REPORTS: duplicates, key-conflicts,
                                  auth-failures, jobs, …; `effectgate ledger REPORT --help` lists its flags)
    effectgate ledger rejects     [filters] [--kind all|conflicts|auth] [--sort -received|received]
    effectgate ledger show KEY    [--tenant T]
    effectgate ledger replay --unmatched --source S --since 24h [--until …] [--config PATH]
    effectgate ledger retention   [--config PATH]   what retention keeps, has purged, and whether it is behind
    effectgate jobs list          [--state S[,S…]] [--kind K] [--source S] [--since …] [--until …] [--sort -created|created]
    effectgate jobs show JOB_ID
    effectgate jobs redrive JOB_ID [--force]
    effectgate jobs cancel JOB_ID  [--reason TEXT]
    effectgate jobs resolve JOB_ID --reason TEXT [--by NAME]   close a failed or parked job by hand
    effectgate jobs redrive|cancel|resolve --state S --kind K --source S --since 24h [--limit N] [--dry-run]
    effectgate jobs pause --kind K [--reason TEXT] | resume --kind K | paused

A report's flags, their help and its table come from its spec (``ReportSpec``), read the way the HTTP
API reads its query string (``gateway/operator/reporting.py``). ``--since`` and ``--until`` are ISO 8601
or a duration back from now (``30m``, ``24h``, ``7d``; reports default to the last 24 hours, jobs to no
bound), ``--limit`` is 1..1000 and ``--cursor`` is printed under a page that has more. Output is a table by default; ``--format json`` prints
the same document as the HTTP API, ``--format csv`` the rows (``ledger show``: a timeline).

Exit codes scripts can rely on:
    0  done
    1  runtime failure (the database is unreachable)
    2  usage mistake: a bad flag or filter (the message names it and its code, e.g. invalid_since)
    3  not found (no such effect key or job)
    4  refused: the job action was not carried out; the refusal code is printed (not_redrivable,
       unrecoverable_requires_force, lock_key_held, payload_purged, not_cancellable, not_resolvable,
       already_resolved, not_paused); a bulk
       action some of whose jobs were refused (some_refused; the summary counts them by code)

These commands read and act on the ledger directly (``--database-url``, ``EFFECTGATE_DATABASE_URL`` or
``DATABASE_URL``; the embedded Postgres only with ``--embedded``); they
need no configuration file and no running gateway. The event loop is gateway/cli.py's: it passes in the
runner that connects and runs each command.
"""

from __future__ import annotations

import argparse
import csv
import getpass
import importlib
import io
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from effectgate.handlers import bulk as bulk_actions
from effectgate.handlers import control, replay
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger import bulk as ledger_bulk
from effectgate.ledger import db, reports, resolutions, retention
from effectgate.ledger import jobs as ledger_jobs
from effectgate.ledger.reports import AUTH_FAILURES, JOBS, KEY_CONFLICTS, REPORTS, ReportSpec
from effectgate.ledger.vocabulary import JobState, RefusalCode

from .operator import documents, reporting
from .operator.params import (
    JOB_FILTER_PARAMETERS,
    PARAMETER_ERRORS,
    BadParameter,
    parse_bulk_limit,
    parse_id,
    parse_job_filter,
    parse_name,
    parse_time,
)

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
# How a parameter is called on the command line, where it is not --the-same-name.
_FLAGS = {"job_id": "JOB_ID", "key": "KEY"}
MAX_CELL = 72


class NotFound(Exception):
    """The effect or job asked for does not exist."""


class Refused(Exception):
    """A job action was refused by the ledger, with its code."""

    def __init__(self, code: str, detail: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        # What --format json prints instead of the bare error (a bulk action's summary).
        self.document = document


Command = Callable[[db.Conn, argparse.Namespace, TextIO], Awaitable[None]]
# Runs an async function of a ledger connection to completion. The composition root (gateway/cli.py)
# passes it in, so the event loop and the database URL are chosen in one place and this module does
# not import the CLI that imports it.
LedgerRunner = Callable[[Callable[[db.Conn], Awaitable[None]]], None]


def _run(command: Command, run_on_ledger: LedgerRunner) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        out = sys.stdout
        try:
            run_on_ledger(lambda conn: command(conn, args, out))
        except PARAMETER_ERRORS as exc:
            flag = _FLAGS.get(exc.parameter, "--" + exc.parameter.replace("_", "-"))
            print(f"effectgate: {flag}: {exc.detail} [{exc.code}]", file=sys.stderr)
            return EXIT_USAGE
        except NotFound as exc:
            print(f"effectgate: not found: {exc}", file=sys.stderr)
            if args.format == "json":
                print(json.dumps({"error": "not_found", "detail": str(exc)}), file=out)
            return EXIT_NOT_FOUND
        except Refused as exc:
            print(f"effectgate: refused: {exc.code}: {exc.detail}", file=sys.stderr)
            if args.format == "json":
                document = {"error": exc.code, "detail": exc.detail, **(exc.document or {})}
                print(json.dumps(documents.jsonable(document)), file=out)
            return EXIT_REFUSED
        return EXIT_OK

    return run


def _operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):
        return "cli"


# -- output ----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    # Rows straight from the ledger hold datetimes and Decimals, which json.dumps refuses.
    value = documents.jsonable(value)
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def print_table(out: TextIO, rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Rows as an aligned text table with the given (header, field) columns."""
    cells = [[h for h, _ in columns]] + [[_cell(r.get(f)) for _, f in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


def print_csv(out: TextIO, rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> None:
    """Rows as CSV with a header; nested values as compact JSON."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow(
            [
                ""
                if row.get(f) is None
                else row[f]
                if isinstance(row.get(f), str | int | float)
                else json.dumps(row[f], separators=(",", ":"))
                for f in fields
            ]
        )
    out.write(buffer.getvalue())


def _json(out: TextIO, document: Any) -> None:
    print(json.dumps(documents.jsonable(document), indent=2, ensure_ascii=False), file=out)


def _more(out: TextIO, document: dict[str, Any]) -> None:
    if document.get("next_cursor"):
        print(f"\nmore: add --cursor {document['next_cursor']}", file=out)


def _window_line(out: TextIO, document: dict[str, Any]) -> None:
    print(f"window: {document.get('since') or '…'} to {document.get('until') or 'now'}\n", file=out)


def _age(value: str | None, now: datetime) -> str:
    if not value:
        return ""
    seconds = max(0, int((now - datetime.fromisoformat(value)).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def _diff_summary(diff: Sequence[dict[str, Any]], truncated: bool) -> str:
    parts = []
    for entry in diff:
        if entry["change"] == "changed":
            parts.append(f"{entry['path'] or '/'}: {_cell(entry['held'])} → {_cell(entry['rejected'])}")
        else:
            parts.append(f"{entry['path']}: {entry['change']}")
    return "; ".join(parts) + (" …" if truncated else "")


# -- ledger commands -------------------------------------------------------------------------------


def _raw(spec: ReportSpec, args: argparse.Namespace) -> dict[str, str]:
    return {
        name: value for name in reporting.parameters(spec) if (value := getattr(args, name, None)) is not None
    }


def report_command(spec: ReportSpec) -> Command:
    """``effectgate ledger <report>``: any report as a table (with its summary), JSON or CSV."""

    async def command(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
        document = reporting.document(await reporting.fetch(conn, spec, _raw(spec, args)))
        if args.format == "json":
            _json(out, document)
            return
        if args.format == "csv":
            print_csv(out, document[spec.items_key], [c.name for c in spec.columns])
            return
        if spec.window is not None:
            _window_line(out, document)
        print_table(out, document[spec.items_key], [(c.title.upper(), c.name) for c in spec.table_columns])
        _more(out, document)
        if spec.summary is not None:
            print(f"\n{spec.summary.title}:", file=out)
            print_table(
                out, document[spec.summary.key], [(c.title.upper(), c.name) for c in spec.summary.columns]
            )

    return command


async def cmd_rejects(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    kind = args.kind
    if kind == "all" and (args.format == "csv" or args.cursor):
        raise BadParameter(
            "kind", "--format csv and --cursor need one kind of reject: --kind conflicts or --kind auth"
        )
    conflicts_only = [p for p in _raw(KEY_CONFLICTS, args) if p not in reporting.parameters(AUTH_FAILURES)]
    if kind == "auth" and conflicts_only:
        raise BadParameter(
            "kind",
            "authentication failures are kept per source and reason only: no "
            + ", ".join("--" + p.replace("_", "-") for p in conflicts_only),
        )
    conflicts = auth = None
    if kind in ("all", "conflicts"):
        conflicts = reporting.document(await reporting.fetch(conn, KEY_CONFLICTS, _raw(KEY_CONFLICTS, args)))
    if kind in ("all", "auth"):
        auth = reporting.document(await reporting.fetch(conn, AUTH_FAILURES, _raw(AUTH_FAILURES, args)))
    if args.format == "json":
        _json(
            out,
            conflicts
            if kind == "conflicts"
            else auth
            if kind == "auth"
            else {"conflicts": conflicts, "auth": auth},
        )
        return
    if args.format == "csv":
        if conflicts is not None:
            print_csv(out, conflicts["items"], documents.CONFLICT_FIELDS)
        elif auth is not None:
            print_csv(out, auth["per_minute"], documents.AUTH_MINUTE_FIELDS)
        return
    _window_line(out, conflicts or auth or {})
    if conflicts is not None:
        print("key conflicts (a different payload reused a held effect key; recorded, never run):", file=out)
        rows = [{**i, "changes": _diff_summary(i["diff"], i["diff_truncated"])} for i in conflicts["items"]]
        print_table(
            out,
            rows,
            [
                ("RECEIVED", "received_at"),
                ("SOURCE", "source"),
                ("EVENT", "event_id"),
                ("EVENT TYPE", "event_type"),
                ("KEY", "effect_key"),
                ("HELD BY", "held_event_id"),
                ("CHANGES (held → rejected)", "changes"),
            ],
        )
        _more(out, conflicts)
    if auth is not None:
        if conflicts is not None:
            print(file=out)
        print("authentication failures (signature checks that failed; bodies are never kept):", file=out)
        print_table(
            out,
            auth["by_reason"],
            [("SOURCE", "source"), ("REASON", "reason"), ("COUNT", "count"), ("LAST SEEN", "last_seen_at")],
        )
        if kind == "auth":
            print("\nper minute:", file=out)
            print_table(
                out,
                auth["per_minute"],
                [("MINUTE", "minute"), ("SOURCE", "source"), ("REASON", "reason"), ("COUNT", "count")],
            )
            _more(out, auth)


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
                "detail": f"event {r['event_id']}: {_diff_summary(r['diff'], r['diff_truncated'])}",
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
        _json(out, document)
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


# -- jobs commands ---------------------------------------------------------------------------------


async def cmd_jobs_list(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    if args.format != "table":
        await report_command(JOBS)(conn, args, out)
        return
    document = reporting.document(await reporting.fetch(conn, JOBS, _raw(JOBS, args)))
    now = datetime.now(UTC)
    rows = [
        {
            **j,
            "tries": f"{j['attempt']}/{j['max_attempts']}",
            "age": _age(j["created_at"], now),
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
    _more(out, document)


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
        _json(out, document)
        return
    if args.format == "csv":
        print_csv(out, document["attempts"], documents.ATTEMPT_FIELDS)
        return
    job = document["job"]
    width = max(len(k) for k in job)
    for key, value in job.items():
        print(f"{key.ljust(width)}  {_cell(value)}", file=out)
    print("\nattempts:", file=out)
    rows = [
        {**a, "error": f"{a['error_type']}: {a['error_message']}" if a["error_type"] else ""}
        for a in document["attempts"]
    ]
    print_table(
        out,
        rows,
        [
            ("#", "attempt"),
            ("TOKEN", "lease_token"),
            ("WORKER", "worker"),
            ("STARTED", "started_at"),
            ("FINISHED", "finished_at"),
            ("OUTCOME", "outcome"),
            ("ERROR", "error"),
        ],
    )
    print("\nsteps:", file=out)
    print_table(
        out,
        document["steps"],
        [
            ("STEP", "name"),
            ("STATUS", "status"),
            ("IDEMPOTENCY KEY", "idempotency_key"),
            ("RECORDED", "recorded_at"),
        ],
    )


def _refusal(refusal: ledger_jobs.Refused) -> Exception:
    return (
        NotFound(refusal.detail)
        if refusal.code == RefusalCode.NOT_FOUND
        else Refused(refusal.code, refusal.detail)
    )


async def cmd_jobs_redrive(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    if args.job_id is None:
        await _bulk(conn, args, out, "redrive")
        return
    _no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    refusal = await ledger_jobs.redrive(conn, job_id, force=args.force)
    if refusal is not None:
        raise _refusal(refusal)
    if args.format == "json":
        _json(out, {"job_id": job_id, "state": JobState.PENDING})
    else:
        print(f"job {job_id}: redriven, now pending", file=out)


def _job_filter(args: argparse.Namespace) -> ledger_bulk.JobFilter:
    values = {name: getattr(args, name) for name in JOB_FILTER_PARAMETERS}
    try:
        return parse_job_filter(values, now=datetime.now(UTC))
    except BadParameter as exc:
        if exc.code != "filter_required":
            raise
        raise BadParameter(
            "job_id", "give a JOB_ID, or a filter (--state, --kind, --source, --since) for a bulk action"
        ) from None


def _no_filters(args: argparse.Namespace) -> None:
    for flag in ("state", "kind", "source", "since", "limit"):
        if getattr(args, flag) is not None:
            raise BadParameter(flag, "filters select jobs for a bulk action; give them without a JOB_ID")
    if args.dry_run:
        raise BadParameter("dry_run", "--dry-run is for bulk actions (filters without a JOB_ID)")


class _Bar:
    """A progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.shown or not total:
            return
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


async def _bulk(conn: db.Conn, args: argparse.Namespace, out: TextIO, action: bulk_actions.Action) -> None:
    where = _job_filter(args)
    _import_handlers(args)
    result = await bulk_actions.run(
        conn,
        REGISTRY,
        action,
        where,
        by=_resolver(args) if action == "resolve" else _operator(),
        reason=getattr(args, "reason", None) or "cancelled by operator",
        force=getattr(args, "force", False),
        dry_run=args.dry_run,
        progress=_Bar("dry run" if args.dry_run else action),
    )
    summary = result.summary()
    document = {**summary, "job_ids": result.done, "refused_job_ids": result.refused}
    refused = bool(result.refused) and not args.dry_run
    if args.format == "json":
        if not refused:  # else printed once, with the error, by _run
            _json(out, document)
    else:
        verb = {
            "redrive": "redriven",
            "cancel": "cancelled or cancel requested",
            "resolve": "resolved by hand",
        }[action]
        would = "would be " if args.dry_run else ""
        print(f"{'dry run: ' if args.dry_run else ''}{len(result.matched)} jobs matched", file=out)
        print(f"  {would}{verb}: {len(result.done)}", file=out)
        for code, ids in sorted(result.refused.items()):
            print(f"  {'would be ' if args.dry_run else ''}refused {code}: {len(ids)}", file=out)
    if refused:
        codes = ", ".join(f"{code} {len(ids)}" for code, ids in sorted(result.refused.items()))
        raise Refused("some_refused", f"{len(result.done)} done, refused: {codes}", document)


def _import_handlers(args: argparse.Namespace) -> None:
    for module in getattr(args, "handlers", None) or ():
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise BadParameter("handlers", f"cannot import {module!r}: {type(exc).__name__}: {exc}") from exc


async def cmd_jobs_pause(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    kind = parse_name(args.kind, "kind")
    assert kind is not None
    row = await ledger_bulk.pause(conn, kind, by=_operator(), reason=args.reason)
    if args.format == "json":
        _json(out, row)
    else:
        print(
            f"kind {kind}: paused; its jobs wait pending until `effectgate jobs resume --kind {kind}`",
            file=out,
        )


async def cmd_jobs_resume(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    kind = parse_name(args.kind, "kind")
    assert kind is not None
    if not await ledger_bulk.resume(conn, kind):
        raise Refused("not_paused", f"kind {kind} is not paused")
    if args.format == "json":
        _json(out, {"kind": kind, "paused": False})
    else:
        print(f"kind {kind}: resumed", file=out)


async def cmd_jobs_paused(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    rows = await ledger_bulk.paused(conn)
    if args.format == "json":
        _json(out, {"paused": rows})
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
        await _bulk(conn, args, out, "cancel")
        return
    _no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    _import_handlers(args)
    outcome = await control.cancel(conn, REGISTRY, job_id, by=_operator(), reason=args.reason)
    if isinstance(outcome, ledger_jobs.Refused):
        raise _refusal(outcome)
    if args.format == "json":
        _json(out, {"job_id": job_id, "state": outcome, "cancel_requested": True})
    elif outcome == JobState.CANCELLED:
        print(f"job {job_id}: cancelled", file=out)
    else:
        print(f"job {job_id}: cancel requested; it ends cancelled at its worker's next heartbeat", file=out)


def _resolver(args: argparse.Namespace) -> str:
    """Who resolves: ``--by NAME`` as ``cli:NAME``, else the OS user (``cli:alice``)."""
    if args.by is None:
        return _operator()
    return f"cli:{parse_name(args.by, 'by')}"


async def cmd_jobs_resolve(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    resolutions.check_reason(args.reason)  # before anything is matched or imported
    if args.job_id is None:
        await _bulk(conn, args, out, "resolve")
        return
    _no_filters(args)
    job_id = parse_id(args.job_id, "job_id")
    _import_handlers(args)
    outcome = await control.resolve(conn, REGISTRY, job_id, by=_resolver(args), reason=args.reason)
    if isinstance(outcome, ledger_jobs.Refused):
        raise _refusal(outcome)
    if args.format == "json":
        _json(out, documents.resolution(outcome))
        return
    print(
        f"job {job_id}: {'already ' if outcome.already else ''}resolved by hand (was {outcome.resolved_from}) "
        f"by {outcome.resolved_by} at {outcome.resolved_at.isoformat()}: {outcome.resolved_reason}",
        file=out,
    )


def _retention_config(args: argparse.Namespace) -> tuple[str | None, retention.RetentionConfig]:
    """The windows that apply: --config, EFFECTGATE_CONFIG or ./effectgate.toml when there is one, else the
    defaults. Raises ``ConfigError``."""
    import os
    from pathlib import Path

    from .config import DEFAULT_CONFIG_FILE, load

    path = args.config or os.environ.get("EFFECTGATE_CONFIG")
    if path is None and Path(DEFAULT_CONFIG_FILE).exists():
        path = DEFAULT_CONFIG_FILE
    if path is None:
        return None, retention.RetentionConfig()
    return path, load(path).worker.reconciler.retention_config()


def run_replay(args: argparse.Namespace, run_on_ledger: LedgerRunner) -> int:
    """``effectgate ledger replay --unmatched``: the handlers come from the configuration, read first."""
    import os

    from .config import DEFAULT_CONFIG_FILE, ConfigError, import_handlers, load, unsigned_fields

    try:
        config = load(args.config or os.environ.get("EFFECTGATE_CONFIG") or DEFAULT_CONFIG_FILE)
        import_handlers(config)
    except ConfigError as exc:
        print(f"effectgate: --config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.source not in config.sources:
        print(f"effectgate: --source: {args.source!r} is not a configured source", file=sys.stderr)
        return EXIT_USAGE
    args.unsigned_type_sources = frozenset(
        n for n, fields in unsigned_fields(config).items() if "type" in fields
    )
    return _run(cmd_replay, run_on_ledger)(args)


async def cmd_replay(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    now = datetime.now(UTC)
    since = parse_time(args.since, "since", now=now)
    until = parse_time(args.until, "until", now=now)
    assert since is not None  # required by the parser
    result = await replay.replay_unmatched(
        conn,
        REGISTRY,
        source=args.source,
        since=since,
        until=until,
        limit=parse_bulk_limit(args.limit),
        unsigned_type_sources=getattr(args, "unsigned_type_sources", frozenset()),
    )
    if args.format == "json":
        _json(out, result.summary())
        return
    print(f"{result.deliveries} unmatched deliveries of {args.source} replayed", file=out)
    for outcome, n in sorted(result.outcomes.items()):
        print(f"  effects {outcome}: {n}", file=out)
    print(f"  still unmatched (no handler yet): {result.still_unmatched}", file=out)
    if result.key_failed:
        print(f"  key function failed: {result.key_failed}", file=out)


def run_retention(args: argparse.Namespace, run_on_ledger: LedgerRunner) -> int:
    """``effectgate ledger retention``: the configuration is read before the ledger is touched."""
    from .config import ConfigError

    try:
        args.retention = _retention_config(args)
    except ConfigError as exc:
        print(f"effectgate: --config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run(cmd_retention, run_on_ledger)(args)


async def cmd_retention(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    path, config = args.retention
    lines, tombstones = await retention.report(conn, config)
    now = datetime.now(UTC)
    # A pass may lag a tick or two behind; only a row older than its window by more than a day is "behind".
    behind = [retention.overdue(line, now, slack=86400) for line in lines]
    rows = [
        {
            "what": line.what,
            "window_days": None if line.window_seconds is None else round(line.window_seconds / 86400, 4),
            "oldest_held": line.oldest_held,
            "purged_total": line.purged_total,
            "last_purged_at": line.last_purged_at,
            "last_run_at": line.last_run_at,
            "behind": late,
        }
        for line, late in zip(lines, behind, strict=True)
    ]
    if args.format == "json":
        _json(out, {"config": path, "tombstones": tombstones, "tables": rows})
        return
    if args.format == "csv":
        print_csv(out, [documents.jsonable(r) for r in rows], list(rows[0]))
        return
    print(f"windows from: {path or 'the defaults (no configuration file)'}", file=out)
    print(f"tombstones held: {tombstones} (kept for the dedupe window; forever unless opted in)\n", file=out)
    table = [
        {
            "what": line.what,
            "window": "forever" if line.window_seconds is None else f"{line.window_seconds / 86400:g}",
            "oldest": _age(line.oldest_held.isoformat(), now) if line.oldest_held else "",
            "purged": line.purged_total,
            "last": line.last_purged_at.isoformat(timespec="seconds") if line.last_purged_at else "",
            "behind": "BEHIND" if late else "",
        }
        for line, late in zip(lines, behind, strict=True)
    ]
    print_table(
        out,
        table,
        [
            ("WHAT", "what"),
            ("WINDOW (DAYS)", "window"),
            ("OLDEST HELD", "oldest"),
            ("PURGED", "purged"),
            ("LAST PURGED", "last"),
            ("", "behind"),
        ],
    )


# -- parser ----------------------------------------------------------------------------------------

_EPILOG = "exit codes: 0 done, 1 runtime failure, 2 usage mistake, 3 not found, 4 refused (code printed)"


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=["table", "json", "csv"], default="table", help="output (default: table)"
    )


def _report_flags(p: argparse.ArgumentParser, spec: ReportSpec) -> None:
    for name in reporting.parameters(spec):
        p.add_argument("--" + name.replace("_", "-"), dest=name, help=reporting.describe(spec, name))
    _output(p)


def _bulk_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", help=f"bulk: one or more, comma-separated: {', '.join(JobState)}")
    p.add_argument("--kind", help="bulk: only this handler kind")
    p.add_argument("--source", help="bulk: only jobs of this webhook source")
    p.add_argument(
        "--since", help="bulk: finished (or, not finished, created) since: ISO 8601 or 30m, 24h, 7d"
    )
    p.add_argument("--limit", help=f"bulk: at most this many jobs (default {ledger_bulk.DEFAULT_LIMIT})")
    p.add_argument("--dry-run", action="store_true", help="bulk: show what would happen, change nothing")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], run_on_ledger: LedgerRunner) -> None:
    """Add the ``ledger`` and ``jobs`` commands to the ``effectgate`` parser."""
    ledger = sub.add_parser("ledger", help="duplicate and reject reports, effect lineage", epilog=_EPILOG)
    reports_sub = ledger.add_subparsers(dest="report", required=True, metavar="REPORT")

    for spec in REPORTS:
        command = reports_sub.add_parser(
            reporting.slug(spec), help=spec.title[:1].lower() + spec.title[1:], epilog=_EPILOG
        )
        _report_flags(command, spec)
        command.set_defaults(func=_run(report_command(spec), run_on_ledger))

    rej = reports_sub.add_parser("rejects", help="key conflicts and authentication failures", epilog=_EPILOG)
    _report_flags(rej, KEY_CONFLICTS)
    rej.add_argument(
        "--kind", choices=["all", "conflicts", "auth"], default="all", help="which rejects (default: all)"
    )
    rej.set_defaults(func=_run(cmd_rejects, run_on_ledger))

    show = reports_sub.add_parser("show", help="one effect from delivery to outcome", epilog=_EPILOG)
    show.add_argument("key", metavar="KEY", help="the logical effect key")
    show.add_argument("--tenant", help="the tenant holding the key (needed only when several do)")
    _output(show)
    show.set_defaults(func=_run(cmd_show, run_on_ledger))

    rep = reports_sub.add_parser(
        "replay", help="claim kept unmatched deliveries as if they had just arrived", epilog=_EPILOG
    )
    rep.add_argument("--unmatched", action="store_true", required=True, help="replay unmatched deliveries")
    rep.add_argument("--source", required=True, help="the webhook source whose deliveries to replay")
    rep.add_argument("--since", required=True, help="received since: ISO 8601 or 30m, 24h, 7d")
    rep.add_argument("--until", help="received before (default now)")
    rep.add_argument("--limit", help=f"at most this many deliveries (default {ledger_bulk.DEFAULT_LIMIT})")
    rep.add_argument(
        "--config", help="the configuration naming the handler modules (default: EFFECTGATE_CONFIG)"
    )
    _output(rep)
    rep.set_defaults(func=lambda args: run_replay(args, run_on_ledger))

    ret = reports_sub.add_parser(
        "retention", help="what retention keeps and has purged, per table", epilog=_EPILOG
    )
    ret.add_argument("--config", help="the configuration whose windows apply (default: EFFECTGATE_CONFIG)")
    _output(ret)
    ret.set_defaults(func=lambda args: run_retention(args, run_on_ledger))

    jobs = sub.add_parser("jobs", help="list, show, redrive, cancel and resolve jobs", epilog=_EPILOG)
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")

    listing = jobs_sub.add_parser("list", help="jobs by state, kind, source and age", epilog=_EPILOG)
    _report_flags(listing, JOBS)
    listing.set_defaults(func=_run(cmd_jobs_list, run_on_ledger))

    show_job = jobs_sub.add_parser("show", help="one job with its attempts and steps", epilog=_EPILOG)
    show_job.add_argument("job_id", metavar="JOB_ID")
    _output(show_job)
    show_job.set_defaults(func=_run(cmd_jobs_show, run_on_ledger))

    redrive = jobs_sub.add_parser(
        "redrive",
        help="put a failed or parked job (or every job a filter matches) back to pending",
        epilog=_EPILOG,
    )
    redrive.add_argument("job_id", metavar="JOB_ID", nargs="?", help="one job; or give filters instead")
    redrive.add_argument("--force", action="store_true", help="redrive an unrecoverable failure too")
    _bulk_filters(redrive)
    _output(redrive)
    redrive.set_defaults(func=_run(cmd_jobs_redrive, run_on_ledger))

    cancel = jobs_sub.add_parser(
        "cancel", help="cancel a pending or running job (or every job a filter matches)", epilog=_EPILOG
    )
    cancel.add_argument("job_id", metavar="JOB_ID", nargs="?", help="one job; or give filters instead")
    cancel.add_argument("--reason", default="cancelled by operator", help="recorded with the job")
    cancel.add_argument(
        "--handlers",
        action="append",
        metavar="MODULE",
        help="import this handler module so its kind's on_transition mirrors the cancel (repeatable)",
    )
    _bulk_filters(cancel)
    _output(cancel)
    cancel.set_defaults(func=_run(cmd_jobs_cancel, run_on_ledger))

    resolve = jobs_sub.add_parser(
        "resolve",
        help="close a failed or parked job without running it (or every job a filter matches)",
        epilog=_EPILOG,
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
    _bulk_filters(resolve)
    _output(resolve)
    resolve.set_defaults(func=_run(cmd_jobs_resolve, run_on_ledger))

    pause = jobs_sub.add_parser(
        "pause", help="stop leasing one kind's jobs (they wait pending)", epilog=_EPILOG
    )
    pause.add_argument("--kind", required=True, help="the handler kind, e.g. commerce.fulfil_order")
    pause.add_argument("--reason", help="recorded with the pause, shown by `jobs paused`")
    _output(pause)
    pause.set_defaults(func=_run(cmd_jobs_pause, run_on_ledger))

    resume = jobs_sub.add_parser("resume", help="lease a paused kind's jobs again", epilog=_EPILOG)
    resume.add_argument("--kind", required=True, help="the paused handler kind")
    _output(resume)
    resume.set_defaults(func=_run(cmd_jobs_resume, run_on_ledger))

    paused = jobs_sub.add_parser("paused", help="the paused kinds and their waiting jobs", epilog=_EPILOG)
    _output(paused)
    paused.set_defaults(func=_run(cmd_jobs_paused, run_on_ledger))
