"""A testing kit for handler authors: run a handler without Postgres, or through the real worker.

In memory (no database, no worker)::

    from effectgate.testing import context_for, example_event, run_handler

    ev = example_event("stripe", "payment_intent.succeeded", source="shop")
    ctx = context_for(ev, "fulfil_order", services=services_over(httpx.MockTransport(answer)))
    await run_handler(ctx)
    ctx.steps["capture"].idempotency_key                  # what was recorded, with which key
    await run_handler(ctx.rerun())                        # the next attempt replays recorded steps

On a real throwaway ledger: ``pytest_plugins = ["effectgate.testing.pytest_plugin"]`` in a
``conftest.py`` gives the ``effectgate_ledger`` fixture (``TestLedger``): claim an event as the ingress
does, then run its job once through the worker. The README's "Testing your handlers" walks through both.

Against the fake provider APIs (real HTTP, the providers' SDKs unpatched): ``with fake_providers() as
fakes:`` (or the plugin's ``effectgate_fake_providers``), then ``services=fakes.services()``; the fakes
themselves live in ``effectgate.gateway.fakes``.
"""

from effectgate.gateway.examples import EXAMPLE_TYPES

from .context import MemoryContext, MemoryLedger
from .events import EXAMPLE_SCHEMES, context_for, example_event, plan, run_handler
from .fake_providers import FakeProviders, fake_providers
from .ledger import JobRun, TestLedger
from .services import PAYMENTS_URL, SHIPPING_URL, services_over

__all__ = [
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
