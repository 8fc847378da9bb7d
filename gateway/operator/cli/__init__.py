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

Exit codes scripts can rely on (``gateway/exit_codes.py``, every command's):
    0  done
    1  runtime failure (the database is unreachable)
    2  usage mistake: a bad flag or filter (the message names it and its code, e.g. invalid_since)
    3  not found (no such effect key or job)
    4  refused: the job action was not carried out; the refusal code is printed (not_redrivable,
       unrecoverable_requires_force, lock_key_held, payload_purged, not_cancellable, not_resolvable,
       already_resolved, not_paused); a bulk
       action some of whose jobs were refused (some_refused; the summary counts them by code)

These commands read and act on the ledger directly (``--database-url``, ``EFFECTGATE_DATABASE_URL`` or
``DATABASE_URL``; the embedded Postgres only with ``--embedded``); they need no configuration file and no
running gateway. The event loop is the composition root's (``gateway/cli/``): it passes in the runner
that connects and runs each command.

One module per part: ``ledger`` (the reports, ``rejects``, ``replay``, ``retention``), ``effect``
(``ledger show``), ``jobs`` (one job, pause and resume), ``bulk`` (job actions by filter); what they
share: ``command`` (exit codes, errors, the runner, shared flags) and ``output`` (tables, CSV, JSON).
"""

from __future__ import annotations

import argparse

from . import jobs, ledger
from .command import LedgerRunner

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], run_on_ledger: LedgerRunner) -> None:
    """Add the ``ledger`` and ``jobs`` commands to the ``effectgate`` parser."""
    ledger.register(sub, run_on_ledger)
    jobs.register(sub, run_on_ledger)
