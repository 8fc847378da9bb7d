"""The schema stays distributable by tenant (Citus): among the tables that would be distributed, every unique
key (primary keys, unique constraints, unique indexes) includes ``tenant``, and every foreign key between
two of them includes ``tenant`` on both sides — so no claim, and no join along a key, ever spans two shards.

Read from the migrated catalog (pg_constraint, pg_index), so a new migration that breaks the rule fails here.
Deliberate exceptions are listed below with their reasons; an exception that no longer exists fails too, so
the list shrinks as the debt is paid.
"""

from __future__ import annotations

import pytest

from effectgate.ledger import db

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

# Tables that would not be distributed, and why.
LOCAL_TABLES = {
    # The migration runner's own bookkeeping: one copy per database (per node), never tenant data.
    "schema_migrations": "migration bookkeeping",
    # Cumulative retention counters, a handful of rows: a reference table.
    "retention_purges": "reference table of counters",
    # The partition keeper's registry of time partitions: per node, follows the DDL it records.
    "history_partitions": "partition registry",
    # Failed verifications happen before authentication: the tenant is unknown by construction (the body is
    # not trusted), so the counters are keyed by source. A reference table.
    "signature_failures": "pre-authentication counters, no tenant by construction",
    # Operator control of the deployment's handler kinds; kinds are code, not tenant data: a reference table.
    "paused_kinds": "reference table of paused handler kinds",
    # Who paused and resumed a kind, when and why (migration 0025): kind-level, like paused_kinds.
    "kind_actions": "reference table of the pauses and resumes of handler kinds",
    # Signed transmission ids (PayPal's), checked after the signature and before any tenant is read, keyed by
    # source and kept for minutes: a local table, like the failure counters.
    "transmissions": "per-source replay memory of signed transmission ids, minutes long",
    # A downstream's shared pace (migration 0027): a provider account's limit is the deployment's, not a
    # tenant's; a row per downstream, on the coordinator.
    "downstream_paces": "the shared pace of each downstream API, a row per name",
}

# Known violations among distributed tables: (table, constraint or index) -> reason. Each must be fixed by a
# migration that adds tenant to the key; listed so the debt is visible and cannot grow unnoticed. Migration
# 0022 paid the last of it (effects, jobs, job_attempts, steps).
EXCEPTIONS: dict[tuple[str, str], str] = {}

CONSTRAINTS = """
SELECT c.conname AS name, c.contype AS type, r.relname AS tbl, f.relname AS ref,
       (SELECT array_agg(a.attname::text) FROM unnest(c.conkey) k
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k) AS keys,
       (SELECT array_agg(a.attname::text) FROM unnest(c.confkey) k
        JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k) AS refkeys
FROM pg_constraint c
JOIN pg_class r ON r.oid = c.conrelid
JOIN pg_namespace n ON n.oid = r.relnamespace
LEFT JOIN pg_class f ON f.oid = c.confrelid
WHERE n.nspname = current_schema() AND c.contype IN ('p', 'u', 'f') AND NOT r.relispartition
"""

UNIQUE_INDEXES = """
SELECT i.relname AS name, r.relname AS tbl,
       (SELECT array_agg(a.attname::text) FROM unnest(x.indkey) k
        JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k) AS keys
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class r ON r.oid = x.indrelid
JOIN pg_namespace n ON n.oid = r.relnamespace
WHERE n.nspname = current_schema() AND x.indisunique AND NOT r.relispartition
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
"""

TABLES = """
SELECT c.relname AS tbl FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""


async def violations(conn: db.Conn) -> dict[tuple[str, str], str]:
    tables = {r["tbl"] for r in await (await conn.execute(TABLES)).fetchall()}
    distributed = tables - set(LOCAL_TABLES)
    found: dict[tuple[str, str], str] = {}
    for row in await (await conn.execute(CONSTRAINTS)).fetchall():
        if row["tbl"] not in distributed:
            continue
        if row["type"] in ("p", "u") and "tenant" not in row["keys"]:
            found[(row["tbl"], row["name"])] = f"unique key {row['keys']} without tenant"
        if row["type"] == "f" and row["ref"] in distributed:
            if "tenant" not in row["keys"] or "tenant" not in (row["refkeys"] or []):
                found[(row["tbl"], row["name"])] = f"foreign key {row['keys']} -> {row['ref']} without tenant"
    for row in await (await conn.execute(UNIQUE_INDEXES)).fetchall():
        if row["tbl"] in distributed and "tenant" not in row["keys"]:
            found[(row["tbl"], row["name"])] = f"unique index {row['keys']} without tenant"
    return found


async def test_every_unique_key_and_foreign_key_between_distributed_tables_has_tenant(conn: db.Conn) -> None:
    found = await violations(conn)
    new = {k: v for k, v in found.items() if k not in EXCEPTIONS}
    assert new == {}, "add tenant to these keys, or list them in EXCEPTIONS with a reason"
    gone = set(EXCEPTIONS) - set(found)
    assert gone == set(), "fixed, or renamed: take these out of EXCEPTIONS"


async def test_the_local_tables_exist(conn: db.Conn) -> None:
    tables = {r["tbl"] for r in await (await conn.execute(TABLES)).fetchall()}
    assert set(LOCAL_TABLES) <= tables


async def test_the_check_finds_a_violation(conn: db.Conn) -> None:
    # The test above could pass by reading nothing: a table made to break the rule must be found.
    # effects' only keys now name tenant, so the bad reference joins on a column of another name.
    await conn.execute(
        "CREATE TABLE bad_child (tenant text, id bigint UNIQUE, effect_id bigint, effect_tenant text,"
        " FOREIGN KEY (effect_id, effect_tenant) REFERENCES effects (id, tenant))"
    )
    found = await violations(conn)
    assert ("bad_child", "bad_child_id_key") in found
    assert ("bad_child", "bad_child_effect_id_effect_tenant_fkey") in found
