"""Benchmark behind ADR 0017: the batched claim as today's statement, or wrapped verbatim in a PL/pgSQL function.

    python -m tests.bench.claim_as_function statement|function [--seconds 8] [--genuine 64]

Runs ``claim_flood.run`` (genuine clients only, no flood) on a fresh migrated database. ``function`` first creates
``effectgate_claim_batch_v1(int[], text[], …)`` whose body is ``effect_claim_batch`` with its placeholders turned
into the function's arguments, and sends ``SELECT * FROM effectgate_claim_batch_v1(…)`` in its place: one round
trip either way. Prints the claims, claims per second and latencies; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import psycopg

from effectgate.ledger import queries

from . import claim_flood
from .common import drop_database, fresh_database, server_url

_PLACEHOLDER = re.compile(r"%\((\w+)\)([sb])(?:::([a-z\[\]]+))?")
_OUTPUT = "ord int, effect_id bigint, outcome text, delivery_count int, held_fingerprint text, job_id bigint, notified bigint"


def as_function(statement: str) -> tuple[str, str]:
    """(CREATE FUNCTION wrapping ``statement``, the call that replaces it)."""
    params: list[tuple[str, str]] = []  # (name, type), in order of first use; %(now)s is the one untyped one

    def argument(match: re.Match[str]) -> str:
        name, cast = match.group(1), match.group(3)
        names = [p for p, _ in params]
        if name not in names:
            params.append((name, cast or "timestamptz"))
            names.append(name)
        return f"${names.index(name) + 1}" + (f"::{cast}" if cast else "")

    body = _PLACEHOLDER.sub(argument, statement)
    create = (
        f"CREATE FUNCTION effectgate_claim_batch_v1({', '.join(t for _, t in params)}) RETURNS TABLE ({_OUTPUT})"
        f" LANGUAGE plpgsql AS $fn$\n#variable_conflict use_column\nBEGIN\nRETURN QUERY {body};\nEND $fn$"
    )
    arguments = ", ".join(f"%({p})" + ("s" if p == "now" else "b") + f"::{t}" for p, t in params)
    return create, f"SELECT * FROM effectgate_claim_batch_v1({arguments})"


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
