"""What a table holds and how it is made, as one string a test compares before and after: proof that a migration moved
or left a table row for row and column for column."""

from __future__ import annotations

from typing import Any

import psycopg


def table_checksums(conn: psycopg.Connection[Any], schema: str, tables: tuple[str, ...]) -> dict[str, str]:
    """Per table: its row count and the md5 of every row in order, and of its definition from pg_catalog."""
    out = {}
    # Type and table names in the definitions print unqualified when on the search_path.
    conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
    for table in tables:
        qualified = f'"{schema}"."{table}"'
        row = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {qualified} t"  # type: ignore[arg-type]
        ).fetchone()
        definition = conn.execute(
            "SELECT md5(string_agg(concat_ws(' ', a.attname, format_type(a.atttypid, a.atttypmod), "
            "a.attnotnull, pg_get_expr(d.adbin, d.adrelid)), ',' ORDER BY a.attnum)) "
            "FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (qualified,),
        ).fetchone()
        constraints = conn.execute(
            "SELECT md5(coalesce(string_agg(conname || pg_get_constraintdef(oid), ',' ORDER BY conname), '')) "
            "FROM pg_constraint WHERE conrelid = %s::regclass",
            (qualified,),
        ).fetchone()
        assert row is not None and definition is not None and constraints is not None
        out[table] = f"rows={row[0]} data={row[1]} columns={definition[0]} constraints={constraints[0]}"
    return out
