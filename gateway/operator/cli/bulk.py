"""``effectgate jobs redrive|cancel|resolve`` with filters instead of a JOB_ID: the filter flags, their
parsing (the API's ``parse_job_filter``), the progress bar and the summary by refusal code."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TextIO

from effectgate.handlers.actions import bulk as bulk_actions
from effectgate.handlers.registry import REGISTRY
from effectgate.ledger import db
from effectgate.ledger.jobs import filters
from effectgate.ledger.vocabulary import JobState

from ..params import JOB_FILTER_PARAMETERS, BadParameter, parse_job_filter
from .command import Refused, import_handler_modules, operator_name, resolver
from .output import print_json


def job_filter(args: argparse.Namespace) -> filters.JobFilter:
    values = {name: getattr(args, name) for name in JOB_FILTER_PARAMETERS}
    try:
        return parse_job_filter(values, now=datetime.now(UTC))
    except BadParameter as exc:
        if exc.code != "filter_required":
            raise
        raise BadParameter(
            "job_id", "give a JOB_ID, or a filter (--state, --kind, --source, --since) for a bulk action"
        ) from None


class ProgressBar:
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


async def run_bulk(conn: db.Conn, args: argparse.Namespace, out: TextIO, action: bulk_actions.Action) -> None:
    where = job_filter(args)
    import_handler_modules(args)
    result = await bulk_actions.run(
        conn,
        REGISTRY,
        action,
        where,
        by=resolver(args) if action == "resolve" else operator_name(),
        reason=getattr(args, "reason", None) or ("cancelled by operator" if action == "cancel" else None),
        force=getattr(args, "force", False),
        dry_run=args.dry_run,
        progress=ProgressBar("dry run" if args.dry_run else action),
    )
    summary = result.summary()
    document = {
        **summary,
        "job_ids": result.done,
        "refused_job_ids": result.refused,
        "replaying_job_ids": result.replaying,
    }
    refused = bool(result.refused) and not args.dry_run
    if args.format == "json":
        if not refused:  # else printed once, with the error, by _run
            print_json(out, document)
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
        if result.replaying:
            print(
                f"  {would}redriven with force though a step recorded a terminal error the next run replays"
                f" without calling the provider: {len(result.replaying)}",
                file=out,
            )
    if refused:
        codes = ", ".join(f"{code} {len(ids)}" for code, ids in sorted(result.refused.items()))
        raise Refused("some_refused", f"{len(result.done)} done, refused: {codes}", document)


def filter_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", help=f"bulk: one or more, comma-separated: {', '.join(JobState)}")
    p.add_argument("--kind", help="bulk: only this handler kind")
    p.add_argument("--source", help="bulk: only jobs of this webhook source")
    p.add_argument(
        "--since", help="bulk: finished (or, not finished, created) since: ISO 8601 or 30m, 24h, 7d"
    )
    p.add_argument("--limit", help=f"bulk: at most this many jobs (default {filters.DEFAULT_LIMIT})")
    p.add_argument("--dry-run", action="store_true", help="bulk: show what would happen, change nothing")
