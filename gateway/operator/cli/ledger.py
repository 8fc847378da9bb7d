"""``effectgate ledger …``: every report of ``ledger.reports.REPORTS`` (its flags, help and table come from
its spec), ``rejects``, ``show`` (``effect.py``), ``replay --unmatched`` and ``retention``."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TextIO

from effectgate.handlers.actions import replay
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger import db
from effectgate.ledger.jobs import filters
from effectgate.ledger.maintenance import retention
from effectgate.ledger.reports import AUTH_FAILURES, KEY_CONFLICTS, REFUSED_DELIVERIES, REPORTS, ReportSpec

from ...exit_codes import EXIT_USAGE
from .. import documents, reporting
from ..params import BadParameter, parse_bulk_limit, parse_time
from . import effect
from .command import (
    EPILOG,
    Command,
    LedgerRunner,
    format_flag,
    operator_name,
    raw_parameters,
    report_flags,
    runner,
)
from .output import age, diff_summary, print_csv, print_json, print_more, print_table, print_window


def report_command(spec: ReportSpec) -> Command:
    """``effectgate ledger <report>``: any report as a table (with its summary), JSON or CSV."""

    async def command(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
        document = reporting.document(await reporting.fetch(conn, spec, raw_parameters(spec, args)))
        if args.format == "json":
            print_json(out, document)
            return
        if args.format == "csv":
            print_csv(out, document[spec.items_key], [c.name for c in spec.columns])
            return
        if spec.window is not None:
            print_window(out, document)
        print_table(out, document[spec.items_key], [(c.title.upper(), c.name) for c in spec.table_columns])
        print_more(out, document)
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
            "kind",
            "--format csv and --cursor need one kind of reject: --kind conflicts, --kind refused or --kind auth",
        )
    conflicts_only = [
        p for p in raw_parameters(REFUSED_DELIVERIES, args) if p not in reporting.parameters(AUTH_FAILURES)
    ]
    if kind in ("conflicts", "auth") and getattr(args, "event_id", None) is not None:
        raise BadParameter(
            "event_id", "only refused deliveries are listed by event id: --kind refused or all"
        )
    if kind == "auth" and conflicts_only:
        raise BadParameter(
            "kind",
            "authentication failures are kept per source and reason only: no "
            + ", ".join("--" + p.replace("_", "-") for p in conflicts_only),
        )
    conflicts = auth = refused = None
    if kind in ("all", "refused"):
        refused = reporting.document(
            await reporting.fetch(conn, REFUSED_DELIVERIES, raw_parameters(REFUSED_DELIVERIES, args))
        )
    if kind in ("all", "conflicts"):
        conflicts = reporting.document(
            await reporting.fetch(conn, KEY_CONFLICTS, raw_parameters(KEY_CONFLICTS, args))
        )
    if kind in ("all", "auth"):
        auth = reporting.document(
            await reporting.fetch(conn, AUTH_FAILURES, raw_parameters(AUTH_FAILURES, args))
        )
    if args.format == "json":
        print_json(
            out,
            conflicts
            if kind == "conflicts"
            else auth
            if kind == "auth"
            else refused
            if kind == "refused"
            else {"conflicts": conflicts, "refused": refused, "auth": auth},
        )
        return
    if args.format == "csv":
        if refused is not None:
            print_csv(out, refused["items"], documents.REFUSED_FIELDS)
        elif conflicts is not None:
            print_csv(out, conflicts["items"], documents.CONFLICT_FIELDS)
        elif auth is not None:
            print_csv(out, auth["per_minute"], documents.AUTH_MINUTE_FIELDS)
        return
    print_window(out, conflicts or refused or auth or {})
    if refused is not None:
        print(
            "refused deliveries (verified, could not become effects; kept: replay with "
            "`effectgate ledger replay --refused`):",
            file=out,
        )
        print_table(
            out,
            refused["items"],
            [
                ("RECEIVED", "received_at"),
                ("SOURCE", "source"),
                ("EVENT", "event_id"),
                ("EVENT TYPE", "event_type"),
                ("REASON", "reason"),
                ("HANDLER", "handler"),
                ("ERROR", "error"),
                ("REPLAYED", "replayed_at"),
            ],
        )
        print_more(out, refused)
        if conflicts is not None:
            print(file=out)
    if conflicts is not None:
        print("key conflicts (a different payload reused a held effect key; recorded, never run):", file=out)
        rows = [{**i, "changes": diff_summary(i["diff"], i["diff_truncated"])} for i in conflicts["items"]]
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
        print_more(out, conflicts)
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
            print_more(out, auth)


def _retention_config(args: argparse.Namespace) -> tuple[str | None, retention.RetentionConfig]:
    """The windows that apply: --config, EFFECTGATE_CONFIG or ./effectgate.toml when there is one, else the
    defaults. Raises ``ConfigError``."""
    import os
    from pathlib import Path

    from ...config import DEFAULT_CONFIG_FILE, load

    path = args.config or os.environ.get("EFFECTGATE_CONFIG")
    if path is None and Path(DEFAULT_CONFIG_FILE).exists():
        path = DEFAULT_CONFIG_FILE
    if path is None:
        return None, retention.RetentionConfig()
    return path, load(path).worker.reconciler.retention_config()


def run_replay(args: argparse.Namespace, run_on_ledger: LedgerRunner) -> int:
    """``effectgate ledger replay --unmatched|--refused``: the handlers (and, for refused deliveries, the
    source's tenant rule) come from the configuration, read first."""
    import os

    from ...config import DEFAULT_CONFIG_FILE, ConfigError, load
    from ...config.handler_imports import import_handlers, unsigned_fields

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
    args.tenant_of = config.sources[args.source].tenant_rule.tenant_of
    return runner(cmd_replay, run_on_ledger)(args)


async def cmd_replay(conn: db.Conn, args: argparse.Namespace, out: TextIO) -> None:
    now = datetime.now(UTC)
    since = parse_time(args.since, "since", now=now)
    until = parse_time(args.until, "until", now=now)
    assert since is not None  # required by the parser
    common = {
        "by": operator_name(),
        "source": args.source,
        "since": since,
        "until": until,
        "limit": parse_bulk_limit(args.limit),
        "unsigned_type_sources": getattr(args, "unsigned_type_sources", frozenset()),
    }
    if args.refused:
        result = await replay.replay_refused(conn, REGISTRY, tenant_of=args.tenant_of, **common)
        what = "refused"
    else:
        result = await replay.replay_unmatched(conn, REGISTRY, **common)
        what = "unmatched"
    if args.format == "json":
        print_json(out, result.summary())
        return
    print(f"{result.deliveries} {what} deliveries of {args.source} replayed", file=out)
    for outcome, n in sorted(result.outcomes.items()):
        print(f"  effects {outcome}: {n}", file=out)
    print(f"  still unmatched (no handler yet): {result.still_unmatched}", file=out)
    if result.key_failed:
        print(f"  key function failed: {result.key_failed}", file=out)
    if result.tenant_unusable:
        print(f"  tenant still unusable: {result.tenant_unusable}", file=out)


def run_retention(args: argparse.Namespace, run_on_ledger: LedgerRunner) -> int:
    """``effectgate ledger retention``: the configuration is read before the ledger is touched."""
    from ...config import ConfigError

    try:
        args.retention = _retention_config(args)
    except ConfigError as exc:
        print(f"effectgate: --config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return runner(cmd_retention, run_on_ledger)(args)


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
        print_json(out, {"config": path, "tombstones": tombstones, "tables": rows})
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
            "oldest": age(line.oldest_held.isoformat(), now) if line.oldest_held else "",
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], run_on_ledger: LedgerRunner) -> None:
    """Add the ``ledger`` commands to the ``effectgate`` parser."""
    ledger = sub.add_parser("ledger", help="duplicate and reject reports, effect lineage", epilog=EPILOG)
    reports_sub = ledger.add_subparsers(dest="report", required=True, metavar="REPORT")

    for spec in REPORTS:
        command = reports_sub.add_parser(
            reporting.slug(spec), help=spec.title[:1].lower() + spec.title[1:], epilog=EPILOG
        )
        report_flags(command, spec)
        command.set_defaults(func=runner(report_command(spec), run_on_ledger))

    rej = reports_sub.add_parser(
        "rejects", help="key conflicts, refused deliveries and authentication failures", epilog=EPILOG
    )
    report_flags(rej, REFUSED_DELIVERIES)
    rej.add_argument(
        "--kind",
        choices=["all", "conflicts", "refused", "auth"],
        default="all",
        help="which rejects (default: all)",
    )
    rej.set_defaults(func=runner(cmd_rejects, run_on_ledger))

    show = reports_sub.add_parser("show", help="one effect from delivery to outcome", epilog=EPILOG)
    show.add_argument("key", metavar="KEY", help="the logical effect key")
    show.add_argument("--tenant", help="the tenant holding the key (needed only when several do)")
    format_flag(show)
    show.set_defaults(func=runner(effect.cmd_show, run_on_ledger))

    rep = reports_sub.add_parser(
        "replay", help="claim kept unmatched or refused deliveries as if they had just arrived", epilog=EPILOG
    )
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument("--unmatched", action="store_true", help="replay unmatched deliveries")
    which.add_argument(
        "--refused",
        action="store_true",
        help="replay refused deliveries not replayed yet (after fixing the handler or the tenant rule)",
    )
    rep.add_argument("--source", required=True, help="the webhook source whose deliveries to replay")
    rep.add_argument("--since", required=True, help="received since: ISO 8601 or 30m, 24h, 7d")
    rep.add_argument("--until", help="received before (default now)")
    rep.add_argument("--limit", help=f"at most this many deliveries (default {filters.DEFAULT_LIMIT})")
    rep.add_argument(
        "--config", help="the configuration naming the handler modules (default: EFFECTGATE_CONFIG)"
    )
    format_flag(rep)
    rep.set_defaults(func=lambda args: run_replay(args, run_on_ledger))

    ret = reports_sub.add_parser(
        "retention", help="what retention keeps and has purged, per table", epilog=EPILOG
    )
    ret.add_argument("--config", help="the configuration whose windows apply (default: EFFECTGATE_CONFIG)")
    format_flag(ret)
    ret.set_defaults(func=lambda args: run_retention(args, run_on_ledger))
