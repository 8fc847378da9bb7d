"""Benchmark behind ADR 0017: the batched claim as today's statement, or wrapped verbatim in a PL/pgSQL function.

    python -m tests.bench.claim_as_function statement|function [--seconds 8] [--genuine 64]

Runs ``claim_flood.run`` (genuine clients only, no flood) on a fresh migrated database. ``function`` first creates
the claim function ledger/citus.py installs on Citus (``effect_claim_batch`` with its placeholders turned into
the function's arguments) and sends a call of it in place of the statement: one round
trip either way. Prints the claims, claims per second and latencies; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import psycopg

from effectgate.ledger import db, queries
from effectgate.ledger.citus import claim_function

from . import claim_flood
from .common import drop_database, fresh_database, server_url


def as_function(statement: str) -> tuple[str, str]:
    """(CREATE FUNCTION wrapping ``statement`` as ledger/citus.py makes it, the call that replaces it here)."""
    function = claim_function(statement)
    create = function.create(db.DEFAULT_SCHEMA).as_string(None)
    # The bench sends the statement's parameters alone: the routed tenant is the batch's first entry's.
    call = function.call().as_string(None).replace("%(tenant_id)b::text", "(%(tenant)b::text[])[1]")
    return create, call


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("statement", "function"))
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--genuine", type=int, default=64)
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        if args.mode == "function":
            create, call = as_function(queries.Q["effect_claim_batch"])
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(create)  # type: ignore[arg-type]
            queries.Q._queries["effect_claim_batch"] = call  # type: ignore[attr-defined]
        result: dict[str, Any] = asyncio.run(claim_flood.run(url, args.seconds, args.genuine, 0, 8))
    finally:
        drop_database(server, url)
    rate = round(int(result["genuine"]) / args.seconds)
    print(args.mode, result, f"claims/s {rate}", flush=True)


if __name__ == "__main__":
    main()
