"""The public names of the packages users import are exactly the documented ones."""

from __future__ import annotations

import types

import pytest

import effectgate
import effectgate.handlers as handlers
import effectgate.ledger as ledger


def test_handlers_exports_the_documented_names() -> None:
    assert handlers.__all__ == [
        "HAND_BACK",
        "REGISTRY",
        "EffectContext",
        "EffectKind",
        "Event",
        "HandBack",
        "HandlerError",
        "JobState",
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


def test_effectgate_exports_the_public_handler_api() -> None:
    assert effectgate.__all__ == [
        "HAND_BACK",
        "EffectContext",
        "EffectKind",
        "Event",
        "HandBack",
        "HandlerError",
        "JobState",
        "Services",
        "StepAlreadyRun",
        "TerminalError",
        "TransientError",
        "Transition",
        "UnrecoverableError",
        "__version__",
        "effect",
        "register_sweep",
    ]
    # Every public attribute but the subpackages is exported, and each is the handler side's own object.
    public = {
        name
        for name in dir(effectgate)
        if not name.startswith("_") and not isinstance(getattr(effectgate, name), types.ModuleType)
    }
    assert public == {name for name in effectgate.__all__ if not name.startswith("_")}
    for name in effectgate.__all__:
        if name != "__version__":
            assert getattr(effectgate, name) is getattr(handlers, name), name
    assert isinstance(effectgate.__version__, str) and effectgate.__version__[0].isdigit()


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        effectgate.no_such_name  # noqa: B018


def test_the_testing_kit_exports_the_documented_names() -> None:
    import effectgate.testing as testing

    assert testing.__all__ == [
        "EXAMPLE_SCHEMES",
        "EXAMPLE_TYPES",
        "PAYMENTS_URL",
        "SHIPPING_URL",
        "FakeProviders",
        "JobRun",
        "MemoryContext",
        "MemoryLedger",
        "TestLedger",
        "context_for",
        "example_event",
        "fake_providers",
        "plan",
        "run_handler",
        "services_over",
    ]
    assert all(hasattr(testing, name) for name in testing.__all__)
