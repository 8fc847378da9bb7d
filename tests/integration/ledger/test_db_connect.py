"""Meeting the database at start: messages that say where and why, and a wait that gives up clearly."""

from __future__ import annotations

import logging
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from effectgate.ledger import db
from effectgate.ledger.errors import LedgerError, LedgerUnavailable
from tests.e2e.processes import free_port

pytestmark = pytest.mark.anyio

PASSWORD = "pw-never-shown-7f3a"


def test_describe_names_host_port_database_and_user_never_the_password() -> None:
    url = f"postgresql://app:{PASSWORD}@db.internal:6543/ledger?sslmode=require"
    assert db.describe(url) == "host db.internal, port 6543, database 'ledger', user 'app'"
    assert db.describe("postgresql://app@/ledger?host=/run/pg") == (
        "host socket directory /run/pg, port 5432, database 'ledger', user 'app'"
    )
    with pytest.raises(ValueError, match="not a valid PostgreSQL connection URL"):
        db.describe("not a url")


async def test_a_wrong_database_names_where_and_why_without_the_password(
    pg_server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"no_such_db_{uuid.uuid4().hex[:8]}"
    url = make_conninfo(pg_server_url, dbname=name, password=PASSWORD)
    with pytest.raises(LedgerUnavailable) as connecting:
        await db.connect(url)
    with caplog.at_level(logging.WARNING, logger="effectgate.ledger"):
        with pytest.raises(LedgerUnavailable) as waiting:
            await db.wait_until_reachable(url, 60)
    params = conninfo_to_dict(pg_server_url)
    for message in (str(connecting.value), str(waiting.value)):
        assert message.startswith(f"cannot connect to Postgres at {db.describe(url)}: ")
        assert f"database '{name}'" in message and str(params.get("port") or 5432) in message
        assert f'database "{name}" does not exist' in message
        assert PASSWORD not in message
    # A refusal waiting cannot fix is reported at once, not retried for a minute.
    assert [r for r in caplog.records if r.getMessage() == "database.unreachable"] == []


async def test_an_unreachable_database_is_retried_with_each_try_logged_then_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    url = f"postgresql://app:{PASSWORD}@127.0.0.1:{port}/ledger"
    with caplog.at_level(logging.WARNING, logger="effectgate.ledger"):
        with pytest.raises(LedgerUnavailable) as caught:
            await db.wait_until_reachable(url, 1.0)
    tries = [r for r in caplog.records if r.getMessage() == "database.unreachable"]
    assert len(tries) >= 2
    assert [r.__dict__["attempt"] for r in tries] == list(range(1, len(tries) + 1))
    assert all(r.__dict__["reason"].startswith("Connection refused") for r in tries)
    message = str(caught.value)
    assert message.startswith(
        f"cannot connect to Postgres at host 127.0.0.1, port {port}, database 'ledger', user 'app': "
        "Connection refused"
    )
    assert f"gave up after {len(tries) + 1} attempts in 1s" in message
    assert PASSWORD not in message and all(PASSWORD not in str(r.__dict__) for r in tries)


async def test_a_url_that_is_not_one_is_a_ledger_error_naming_the_variable() -> None:
    with pytest.raises(LedgerError, match="DATABASE_URL: not a valid PostgreSQL connection URL"):
        await db.wait_until_reachable("nonsense", 0)
