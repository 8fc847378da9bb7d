"""A third worker node joins a running cluster and the shards are rebalanced onto it while deliveries flow.

    CITUS_URL=... python -m tests.citus.rebalance_run --add-node 127.0.0.1:9703 [--seconds 20]
                                                     [--transfer-mode auto|force_logical|block_writes]

The new node must be running with Citus loaded (`cluster.sh` does it for three; deploy/README.md, "Past one
Postgres", shows the commands for a fourth) and not yet in the cluster. A fresh schema is migrated and
distributed; claimers send deliveries over 40 tenants (every key twice, so half the answers are duplicates)
through ``ledger.claims`` (per tenant, the routed claim function) before, during and after ``citus_rebalance_start``; then the ledger is compared with
what the claimers were answered. Prints a summary and exits 1 on any loss, double or unexpected answer, or if no claim was answered while
the rebalance ran. Shards move by ``--transfer-mode``: by default ``auto`` (logical) where every node runs
``wal_level = logical``, else ``block_writes``, as ``chaos_run`` chooses. Not a test of the default run: it changes the cluster (the node stays added, unless
``--remove-after``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections import Counter

import psycopg

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, Delivery, Duplicate, EffectRequest, claim_deliveries
from effectgate.ledger.fingerprints import fingerprint
from tests.topologies import CITUS

from .ledger import (
    TRANSFER_MODES,
    distributed_ledger,
    logical_wal,
    preferred_transfer_mode,
    rebalance_onto,
    remove_node,
)

TENANTS = 40


async def claimer(
    url: str,
    schema: str,
    n: int,
    stop: asyncio.Event,
    answers: Counter[str],
    accepted: set[tuple[str, str]],
    errors: list[str],
) -> None:
    conn = await db.connect(url, schema=schema)
    async with conn:
        i = 0
        while not stop.is_set():
            tenant, key = f"tenant-{(n * 7 + i // 2) % TENANTS}", f"c{n}-k{i // 2}"
            payload = {"key": key, "n": n}
            d = Delivery(
                f"r{n}-{i}",
                tenant,
                "stripe",
                f"evt-{key}",
                "charge.succeeded",
                payload,
                fingerprint(payload),
                0,
            )
            try:
                # Per tenant, as the gateway claims on Citus: the call routed to the tenant's node.
                [[out]] = await claim_deliveries(
                    conn, [(d, [EffectRequest(key, "charge", 5, "redrive")])], topology=CITUS
                )
            except Exception as exc:  # an answer the gateway would turn into a 503: counted, the key retried
                errors.append(f"{type(exc).__name__}: {exc}"[:160])
                await asyncio.sleep(0.05)
                continue
            answers[type(out).__name__] += 1
            if isinstance(out, Accepted):
                accepted.add((tenant, key))
            elif not isinstance(out, Duplicate):
                errors.append(f"unexpected answer {out}")
            i += 1


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--add-node", required=True, help="host:port of a running Citus node to add")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--remove-after", action="store_true", help="drain and remove the node at the end")
    parser.add_argument(
        "--transfer-mode",
        choices=TRANSFER_MODES,
        help="how shards move (auto and force_logical need wal_level = logical on every node);"
        " default: auto where every node has it, else block_writes",
    )
    args = parser.parse_args()
    url = os.environ["CITUS_URL"]
    behind = logical_wal(url, args.add_node)
    if args.transfer_mode is None:
        args.transfer_mode = preferred_transfer_mode(url, args.add_node)
    elif args.transfer_mode != "block_writes" and behind:
        parser.error(f"--transfer-mode {args.transfer_mode} needs wal_level = logical on {', '.join(behind)}")
    schema = f"effectgate_rebalance_{uuid.uuid4().hex[:8]}"
    await distributed_ledger(url, schema)
    placement_sql = (
        "SELECT nodeport, count(*) FROM citus_shards WHERE table_name = %s::regclass GROUP BY 1 ORDER BY 1"
    )
    table = f'"{schema}".effects'
    with psycopg.connect(url, autocommit=True) as c:
        before = dict(c.execute(placement_sql, (table,)).fetchall())  # type: ignore[arg-type]

    stop, answers, accepted, errors = asyncio.Event(), Counter[str](), set[tuple[str, str]](), list[str]()
    tasks = [
        asyncio.create_task(claimer(url, schema, n, stop, answers, accepted, errors))
        for n in range(args.claimers)
    ]
    await asyncio.sleep(args.seconds / 4)
    # In a thread: the claimers are tasks of this event loop, and a blocking call here would stop them for the
    # whole rebalance (as it did before: the claims then paused instead of flowing through it).
    during = sum(answers.values())
    took, _ = await asyncio.to_thread(rebalance_onto, url, schema, args.add_node, mode=args.transfer_mode)
    during = sum(answers.values()) - during
    await asyncio.sleep(args.seconds / 4)
    stop.set()
    await asyncio.gather(*tasks)

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        after = dict(c.execute(placement_sql, (table,)).fetchall())  # type: ignore[arg-type]
        effects = {(r[0], r[1]) for r in c.execute("SELECT tenant, effect_key FROM effects").fetchall()}
        [(jobs_n, jobs_distinct)] = c.execute(
            "SELECT count(*), count(DISTINCT (tenant, effect_id)) FROM jobs"
        )
        [(deliveries,)] = c.execute("SELECT count(*) FROM deliveries").fetchall()
    lost = accepted - effects
    extra = effects - accepted
    print(
        f"schema {schema}; {args.claimers} claimers, {args.seconds:.0f} s; rebalance ({args.transfer_mode}) took"
        f" {took:.1f} s,"
        f" {during} answers while it ran"
    )
    print(f"effects shards per node before: {before}")
    print(f"effects shards per node after:  {after}")
    print(f"answers: {dict(answers)}; errors: {len(errors)}")
    for e in sorted(set(errors))[:5]:
        print(f"  {e}")
    print(
        f"accepted {len(accepted)}, effects {len(effects)}, jobs {jobs_n} ({jobs_distinct} distinct), "
        f"deliveries {deliveries} (answers {sum(answers.values())})"
    )
    print(f"lost {len(lost)}, unanswered effects {len(extra)}, double jobs {jobs_n - jobs_distinct}")
    ok = (
        not lost
        and jobs_n == len(effects) == jobs_distinct
        and len(after) > len(before)
        and during > 0
        and not [e for e in errors if e.startswith("unexpected")]
    )
    print("OK" if ok else "FAILED")
    if args.remove_after:
        print(f"draining {args.add_node} and removing it from the cluster")
        remove_node(url, args.add_node, mode=args.transfer_mode)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
