"""The public names of the packages users import are exactly the documented ones."""

from __future__ import annotations

import handlers
import ledger


def test_handlers_exports_the_documented_names() -> None:
    assert handlers.__all__ == [
        "REGISTRY",
        "EffectContext",
        "EffectKind",
        "Event",
        "HandlerError",
        "Registry",
        "Services",
        "StepAlreadyRun",
        "TerminalError",
        "TransientError",
        "Transition",
        "UnrecoverableError",
        "effect",
        "register_sweep",
    ]
    assert all(hasattr(handlers, name) for name in handlers.__all__)


def test_ledger_exports_its_error_tree() -> None:
    assert ledger.__all__ == [
        "LeaseLost",
        "LedgerError",
        "LedgerUnavailable",
        "MigrationError",
        "StepAlreadyRecorded",
    ]
    assert all(issubclass(getattr(ledger, name), ledger.LedgerError) for name in ledger.__all__)
