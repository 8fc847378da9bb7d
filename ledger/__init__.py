"""effectgate's durable state: the effect ledger, jobs and leases, recorded steps, reports.

Imports nothing of the rest of the project; every invariant about what is claimed, run and recorded
lives here and is tested against real Postgres without a server.
"""

from .errors import LeaseLost, LedgerError, LedgerUnavailable, MigrationError, StepAlreadyRecorded

__all__ = ["LeaseLost", "LedgerError", "LedgerUnavailable", "MigrationError", "StepAlreadyRecorded"]
