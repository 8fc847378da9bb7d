-- Unmatched deliveries are de-duplicated: one captured delivery that no effect claims (or whose effects'
-- require guards it fails), replayed a thousand times, keeps one deliveries row with its payload and a count
-- here, not a thousand rows. deliveries is partitioned by time, so it cannot carry a unique constraint on the
-- body; this table is the arbiter, keyed by tenant first like every other unique key (Citus distribution).
CREATE TABLE unmatched_deliveries (
    tenant         text        NOT NULL,
    source         text        NOT NULL,
    fingerprint    text        NOT NULL,
    delivery_count bigint      NOT NULL DEFAULT 1 CHECK (delivery_count >= 1),
    first_seen_at  timestamptz NOT NULL,
    last_seen_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant, source, fingerprint)
);

-- Retention forgets a body once its kept payload would have aged out, oldest first.
CREATE INDEX unmatched_deliveries_first_seen_idx ON unmatched_deliveries (first_seen_at);
