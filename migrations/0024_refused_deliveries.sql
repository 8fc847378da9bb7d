-- Refused deliveries are kept (issue 37): a verified delivery that could not become effects — a key, lock-key,
-- tenant or require function raised, its tenant was missing or not allowed, or Postgres refused what it holds —
-- is a delivery row with outcome 'refused', its payload (for `effectgate ledger replay --refused` once the
-- cause is fixed), the raw body byte-exact and the reason. The provider may never send it again: this row is
-- the copy the operator replays.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_outcome_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_outcome_check
    CHECK (outcome IN ('accepted', 'duplicate', 'rejected', 'unmatched', 'superseded', 'refused'));

-- Why it was refused: {"reason", "event_id", "handler", "error_type", "error"}; NULL for every other outcome.
ALTER TABLE deliveries ADD COLUMN refusal jsonb;
-- The request body as it arrived, byte-exact; NULL for every other outcome. Purged with the payload, after the
-- source's payload window (ledger/sql/retention.sql unmatched_payloads_purge_expired).
ALTER TABLE deliveries ADD COLUMN body bytea;

-- The refused deliveries report and the replay read them by time: few rows, never scanned with the rest.
CREATE INDEX deliveries_refused_idx ON deliveries (received_at) WHERE outcome = 'refused';
