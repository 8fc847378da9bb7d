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

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        request_id: str | None = None,
        decline_code: str | None = None,
    ) -> None:
        """What the provider said, when the error came from one, is kept in the attempt's record
        (``facts``): ``http_status``, ``request_id`` (Stripe's ``Request-Id``, PayPal's ``debug_id``: what
        the provider's support asks for) and ``decline_code`` (Stripe's card ``decline_code``)."""
        super().__init__(message or (self.__doc__ or "").strip())
        self.http_status = http_status
        self.request_id = request_id
        self.decline_code = decline_code


class TransientError(HandlerError):
    """A temporary failure: the job is retried with backoff, with the same idempotency keys."""

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        http_status: int | None = None,
        request_id: str | None = None,
        decline_code: str | None = None,
    ) -> None:
        super().__init__(message, http_status=http_status, request_id=request_id, decline_code=decline_code)
        self.retry_after = retry_after


class TerminalError(HandlerError):
    """A permanent failure: the job ends failed and is not retried."""

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        http_status: int | None = None,
        request_id: str | None = None,
        decline_code: str | None = None,
    ) -> None:
        super().__init__(message, http_status=http_status, request_id=request_id, decline_code=decline_code)
        self.code = code


class UnrecoverableError(TerminalError):
    """A failure that must not be retried blindly: a redrive needs force."""


class StepAlreadyRun(UnrecoverableError):
    """A step name was used twice in one handler run; step names must be unique."""


#: The provider's facts an error record keeps, beside its type, message and code.
FACTS = ("http_status", "request_id", "decline_code")


def facts(exc: BaseException) -> dict[str, object]:
    """The provider's facts of ``exc`` (``FACTS``), each from the error or, where it has none, the nearest
    error it was raised from: a step that turns a provider's refusal into a clearer ``TerminalError``
    (``raise TerminalError(...) from refused``) keeps the refusal's request id. Only those known."""
    found: dict[str, object] = {}
    seen: set[int] = set()
    chain: BaseException | None = exc
    while chain is not None and id(chain) not in seen and len(found) < len(FACTS):
        seen.add(id(chain))
        for name in FACTS:
            value = getattr(chain, name, None)
            if (
                name not in found
                and isinstance(value, int | str)
                and not isinstance(value, bool)
                and value != ""
            ):
                found[name] = value
        chain = chain.__cause__ or chain.__context__
    return {name: found[name] for name in FACTS if name in found}
