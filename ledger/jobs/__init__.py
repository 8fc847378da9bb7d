"""Jobs and their leases: fetch, fenced writes, finishes, steps, resolutions, the operator's reads and filters.

The room's one facade: callers write ``from effectgate.ledger import jobs`` and call ``jobs.fetch_and_lease``,
``jobs.finish`` or ``jobs.redrive``. Each name below is held by the module it is imported from: leases in
``leases``, the lease holder's fenced writes in ``fenced``, terminal transitions in ``finishes``, the operator's
reads and actions in ``admin``. The room's other modules (``steps``, ``heartbeats``, ``resolutions``, ``filters``,
``audit``) are imported by name where they are used.
"""

from .admin import AttemptRow, JobRow, Refused, attempts, cancel, get, redrive
from .fenced import fenced_transaction, hand_back, retry, save_checkpoint
from .finishes import Finish, Reached, finish, finish_many
from .leases import (
    FETCH_LOCK_KEY_RETRIES,
    FETCH_SCAN_LIMIT,
    FETCH_SUPERSEDED_ROUNDS,
    LOCK_KEY_INDEX,
    Lease,
    fetch_and_lease,
    listen,
    tenants_due,
)

__all__ = [
    "FETCH_LOCK_KEY_RETRIES",
    "FETCH_SCAN_LIMIT",
    "FETCH_SUPERSEDED_ROUNDS",
    "LOCK_KEY_INDEX",
    "AttemptRow",
    "Finish",
    "JobRow",
    "Lease",
    "Reached",
    "Refused",
    "attempts",
    "cancel",
    "fenced_transaction",
    "fetch_and_lease",
    "finish",
    "finish_many",
    "get",
    "hand_back",
    "listen",
    "redrive",
    "retry",
    "save_checkpoint",
    "tenants_due",
]
