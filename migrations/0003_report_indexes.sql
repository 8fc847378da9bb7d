-- Indexes for the operator reports: every filter a report offers is served by an index, so a report over a
-- million-row ledger reads the rows it returns, not the table (checked by tests/bench_reports.py).
--
-- The duplicate indexes are partial (delivery_count > 1): a new claim is inserted with delivery_count = 1,
-- so the ingress hot path never writes to them; only a duplicate delivery does.

-- The window index carries what the totals group and filter by, so totals over a month of duplicates are an
-- index-only scan. It supersedes 0001's effects_duplicates_idx (last_seen_at), which only the reports used.
CREATE INDEX effects_dup_last_seen_idx ON effects (last_seen_at, id)
    INCLUDE (source, event_type, tenant, delivery_count) WHERE delivery_count > 1;
DROP INDEX effects_duplicates_idx;
CREATE INDEX effects_dup_source_idx ON effects (source, last_seen_at, id) WHERE delivery_count > 1;
CREATE INDEX effects_dup_tenant_idx ON effects (tenant, last_seen_at, id) WHERE delivery_count > 1;
CREATE INDEX effects_dup_type_idx ON effects (event_type, last_seen_at, id) WHERE delivery_count > 1;

-- The dashboard's chart of duplicate deliveries over time; only duplicates are written to it.
CREATE INDEX deliveries_duplicate_idx ON deliveries (received_at) WHERE outcome = 'duplicate';

-- Key conflicts are rare next to claims; their indexes cost the hot path nothing. The first serves an
-- effect's lineage, which lists the rejects of its key.
CREATE INDEX effect_rejects_effect_idx ON effect_rejects (effect_id, received_at);
CREATE INDEX effect_rejects_source_idx ON effect_rejects (source, received_at, id);
CREATE INDEX effect_rejects_tenant_idx ON effect_rejects (tenant, received_at, id);
CREATE INDEX effect_rejects_type_idx ON effect_rejects (event_type, received_at, id);

-- The primary key (source, reason, minute) serves a source filter; a window over every source needs this.
CREATE INDEX signature_failures_minute_idx ON signature_failures (minute);

-- Job lists are ordered by (created_at, id) and filtered by state or kind; a source filter goes through
-- the effect (effects_source_type_idx).
CREATE INDEX jobs_created_idx ON jobs (created_at, id);
CREATE INDEX jobs_state_created_idx ON jobs (state, created_at, id);
CREATE INDEX jobs_kind_created_idx ON jobs (kind, created_at, id);
