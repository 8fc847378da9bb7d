"""The ``effectgate`` command's exit codes, one table for every subcommand (what scripts and pipelines read).

The composition root's commands (``gateway/cli/``: serve, worker, up, migrate, send, …) and the operator's
(``gateway/operator/cli/``: ledger, jobs) share one process and one ``main``, so a number means one thing
whichever command returns it: 3 is "not found" for ``jobs show`` and may not also be uvicorn's start-up failure
(docs/configuration.md). A module of its own, below both, so the operator's room does not import the
composition root to name a code.
"""

from __future__ import annotations

EXIT_OK = 0
#: A runtime failure: the database unreachable, a port in use, a child process died.
EXIT_FAILURE = 1
#: A usage or configuration mistake; the message names the flag, file, key or variable.
EXIT_USAGE = 2
#: An operator command found no such effect key or job.
EXIT_NOT_FOUND = 3
#: An operator's job action was refused (the refusal code is printed).
EXIT_REFUSED = 4
#: ``migrate --check`` while a migration is pending: apart from 1 (the database could not be reached, or an
#: applied migration changed) so a pipeline can tell "run migrate" from "something is wrong".
EXIT_PENDING = 5
