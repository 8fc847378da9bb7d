"""Errors the ledger raises; expected outcomes (duplicate, rejected, refused) are return values.

LedgerError
├── LedgerUnavailable    Postgres could not be reached or the pool ran dry
│   ├── ClaimOverloaded  the claim queue was full: refused at once, nothing queued
│   └── ClaimTimeout     a claim missed its deadline, lock_timeout or statement_timeout; nothing written
├── DeliveryRefused      Postgres refused one delivery's data (its batch-mates were claimed without it)
├── LeaseLost            a fenced write found a newer lease token (or no live lease)
├── LeaseBusy            a heartbeat found the job's row locked by another transaction: neither kept nor lost
├── StepAlreadyRecorded  a step name was recorded already for this effect
├── MigrationError       a migration could not be applied, or an applied one changed
└── InvalidParameter     a report argument is invalid (.code names it)
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error the ledger raises."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class LedgerUnavailable(LedgerError):
    """The ledger database could not be reached; nothing was written."""


class ClaimOverloaded(LedgerUnavailable):
    """The claim queue of this process is full; the claim was refused at once and nothing was queued."""


class ClaimTimeout(LedgerUnavailable):
    """The claim was not written in time (its deadline in the queue, or the ledger's lock or statement
    timeout); nothing of it was written, so the sender's retry is safe. ``reason`` names which:
    ``deadline``, ``lock_timeout`` or ``statement_timeout``."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class DeliveryRefused(LedgerError):
    """Postgres refused this delivery's data (a value it cannot store); nothing of it was written.

    ``sqlstate`` is the code Postgres refused it with (None when the driver refused it before sending).
    """

    def __init__(self, message: str | None = None, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class LeaseLost(LedgerError):
    """The lease on this job is no longer ours: the write changed nothing."""

    def __init__(self, job_id: int, lease_token: int) -> None:
        super().__init__(
            f"job {job_id}: lease token {lease_token} is no longer current; the write changed nothing"
        )
        self.job_id = job_id
        self.lease_token = lease_token


class LeaseBusy(LedgerError):
    """Another transaction holds this job's row locked right now: the lease was not extended, and not lost
    either; ask again shortly."""

    def __init__(self, job_id: int, lease_token: int) -> None:
        super().__init__(
            f"job {job_id}: its row is locked by another transaction; lease token {lease_token} was not extended"
        )
        self.job_id = job_id
        self.lease_token = lease_token


class StepAlreadyRecorded(LedgerError):
    """This step was recorded already for this effect; it is never recorded twice."""


class MigrationError(LedgerError):
    """A migration could not be applied."""


class InvalidParameter(LedgerError):
    """A report argument is invalid; ``code`` names it (``invalid_<parameter>``, ``tenant_required``)."""

    def __init__(self, parameter: str, detail: str, *, code: str | None = None) -> None:
        super().__init__(f"{parameter}: {detail}")
        self.parameter = parameter
        self.code = code or f"invalid_{parameter}"
        self.detail = detail
