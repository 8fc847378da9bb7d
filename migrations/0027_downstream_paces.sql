-- A downstream's pace shared by every worker process of the ledger (issue 40; handlers/downstream/pace.py).
-- One row per [downstream.NAME] whose max_per_second is kept ledger-wide: the earliest start the next call may
-- reserve, and the end of the latest 429's hold. A call reserves its turn with one upsert (ledger/sql/paces.sql),
-- so N worker processes together start at most max_per_second calls a second, spaced by this server's clock.
-- Not tenant data (a provider account's limit is the deployment's): a local table, on Citus the coordinator's,
-- as the failure counters. A handful of rows, each updated at the provider's pace: no index beyond the key.
CREATE TABLE downstream_paces (
    name        text PRIMARY KEY,
    next_at     timestamptz NOT NULL,
    held_until  timestamptz NOT NULL
);
