-- A downstream's pace shared by every worker process of the ledger (issue 40; handlers/downstream/pace.py).
-- One row per [downstream.NAME] whose max_per_second is kept ledger-wide: the earliest start the next call may
-- reserve, and the end of the latest 429's hold. A call reserves its turn with one upsert (ledger/sql/paces.sql),
-- so N worker processes together start at most max_per_second calls a second, spaced by this server's clock.
-- Not tenant data (a provider account's limit is the deployment's): a local table, on Citus the coordinator's,
-- as the failure counters. A handful of rows, each updated at the provider's pace: no index beyond the key.
-- UNLOGGED: a schedule of the next second is soft state, and a reservation that waited for a WAL flush held the
-- row's lock through it, so every worker's calls queued behind the disk (python -m tests.bench.pace_cost: about
-- 1,400 reservations a second logged, 3,000 unlogged, p50 1.2 against 0.56 ms). A crash or a failover empties the
-- table: the calls already waiting keep their turns and new ones are spaced from then, so for at most the
-- downstream's timeout up to twice the rate is sent, and a 429's hold may be forgotten until the provider's next
-- 429 sets it again; either costs attempts, never a second charge. Nothing about a charge is kept here.
CREATE UNLOGGED TABLE downstream_paces (
    name        text PRIMARY KEY,
    next_at     timestamptz NOT NULL,
    held_until  timestamptz NOT NULL
);
