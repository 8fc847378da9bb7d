"""The typed vocabulary says exactly what the database stores."""

from __future__ import annotations

import pytest

from effectgate.ledger import db
from effectgate.ledger.vocabulary import JobState

pytestmark = pytest.mark.anyio


async def test_job_state_members_are_the_database_enum_in_order(conn: db.Conn) -> None:
    row = await (await conn.execute("SELECT enum_range(NULL::job_state)::text[] AS states")).fetchone()
    assert row is not None
    assert row["states"] == [s.value for s in JobState]
