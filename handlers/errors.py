"""Outcomes a handler (or a downstream client) signals by raising.

    HandlerError
    ├── TransientError      retry with backoff, up to the kind's max_attempts
    └── TerminalError       stop now: the job ends failed
        └── UnrecoverableError   stop now; a redrive needs force
            └── StepAlreadyRun   a step name was used twice in one run (a bug: retrying cannot fix it)

Anything else a handler raises is treated as transient: an unrecognised error is
more often a blip than a verdict, and the attempt limit still bounds it.
"""

from __future__ import annotations


class HandlerError(Exception):
    """A handler signalled an outcome."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class TransientError(HandlerError):
    """A temporary failure: the job is retried with backoff, with the same idempotency keys."""

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TerminalError(HandlerError):
    """A permanent failure: the job ends failed and is not retried."""

    def __init__(self, message: str | None = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class UnrecoverableError(TerminalError):
    """A failure that must not be retried blindly: a redrive needs force."""


class StepAlreadyRun(UnrecoverableError):
    """A step name was used twice in one handler run; step names must be unique."""
