-- Retention with tombstones. Effects are claimed forever in meaning, not in bytes: once an effect's job has
-- finished and its payload window has passed, the payload and the providers' answers are purged and the
-- effects row stays as a tombstone — tenant, key, fingerprint, outcome, first/last seen — so a provider's
-- late retry still meets the unique constraint and is answered duplicate (the claim statement is unchanged:
-- ON CONFLICT never reads the payload). Delivery rows, attempts, rejects and finished jobs go next; the
-- tombstone itself only when the operator opts in to a dedupe window.

ALTER TABLE effects ALTER COLUMN payload DROP NOT NULL;
-- When the payload and the step answers were purged: from then on the row is a tombstone.
ALTER TABLE effects ADD COLUMN purged_at timestamptz;
-- The job's terminal state when the effect became a tombstone; the job row itself may be gone later.
ALTER TABLE effects ADD COLUMN outcome text;
ALTER TABLE effects ADD CONSTRAINT effects_tombstone_check
    CHECK ((purged_at IS NULL) = (outcome IS NULL) AND (purged_at IS NULL OR payload IS NULL));

ALTER TABLE effect_rejects ALTER COLUMN rejected_payload DROP NOT NULL;

-- Set with effects.purged_at, on the job, so the purge scans stay on small partial indexes: the first holds
-- only finished jobs whose payload is still kept (bounded by the payload window), the second only purged ones
-- (bounded by the history window). The claim hot path writes neither: a new job is not finished.
ALTER TABLE jobs ADD COLUMN payload_purged boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_finished_unpurged_idx ON jobs (finished_at, id)
    WHERE finished_at IS NOT NULL AND NOT payload_purged;
CREATE INDEX jobs_finished_purged_idx ON jobs (finished_at, id) WHERE payload_purged;

-- Tombstones by age, for the opt-in dedupe window; only tombstones are in it, so claims never write it.
CREATE INDEX effects_tombstone_last_seen_idx ON effects (last_seen_at, id) WHERE purged_at IS NOT NULL;

-- What retention purged, cumulatively, per table (or column): what /metrics reports as counters and the
-- retention report shows, the same for every process whichever one ran the purge. A local (reference)
-- table of a handful of rows, not tenant data.
CREATE TABLE retention_purges (
    what           text        PRIMARY KEY,
    purged         bigint      NOT NULL DEFAULT 0,
    last_purged_at timestamptz,
    last_run_at    timestamptz NOT NULL
);
