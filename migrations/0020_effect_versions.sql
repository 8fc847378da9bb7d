-- Latest wins, per object (issue 22). An effect may declare a version (a monotonic field of the signed
-- payload: Stripe's `created`, Shopify's `updated_at`, a sequence) together with its lock key (the object).
-- The claim keeps here, per (tenant, kind, lock key), the highest version claimed; a delivery older than it
-- is recorded `superseded` and never runs.
--
-- Per kind, not only per (tenant, lock key): two effects on one order may read different fields as their
-- version (an event's `created` seconds, the order's own `updated_at`), and those do not compare; and an
-- effect that must run for every event (a receipt) must never be superseded by another kind's newer sync.
-- Versions are bigints: integers as they are, times as microseconds since the epoch (handlers/registry.py).
CREATE TABLE effect_versions (
    tenant      text        NOT NULL,
    kind        text        NOT NULL,
    lock_key    text        NOT NULL,
    version     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, kind, lock_key)
);

-- A job remembers the version it was claimed at, so a fetch can cancel it as superseded when a newer one
-- was claimed while it waited (ledger/sql/jobs.sql job_fetch_and_lease). NULL: the effect declares none.
ALTER TABLE jobs ADD COLUMN version bigint;

ALTER TABLE deliveries DROP CONSTRAINT deliveries_outcome_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_outcome_check
    CHECK (outcome IN ('accepted', 'duplicate', 'rejected', 'unmatched', 'superseded'));
