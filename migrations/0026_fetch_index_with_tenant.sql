-- The fetch reads each due job's tenant from its per-kind index, so it can lock the row by its whole primary key
-- (id, tenant): by id alone, a planner without statistics for jobs (a new ledger's first backlog, before
-- autovacuum's first ANALYZE) probed the due index again with a skip scan instead, hundreds of index searches
-- per fetch; and a head that had to visit the heap for the tenant was planned on jobs_due_idx, walking every kind's
-- due jobs (docs/performance.md, "The worker's plans"). The tenant is carried, not a key column: the order the
-- fetch walks is still (kind, run_at, id). Same rows as jobs_kind_due_idx (pending jobs only), which it replaces.
--
-- Plain CREATE INDEX, as 0014: a SHARE lock on jobs while it builds (claims and leases wait, reads do not), about a
-- second per million pending rows. With a large backlog build it by hand first (deploy/README.md, "Rolling
-- upgrades"); the migration then finds it and only drops the old index.
CREATE INDEX IF NOT EXISTS jobs_kind_due_tenant_idx ON jobs (kind, run_at, id) INCLUDE (tenant) WHERE state = 'pending';
DROP INDEX IF EXISTS jobs_kind_due_idx;
