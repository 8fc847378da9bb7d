-- The fetch walks each kind's due jobs in (run_at, id) order on its own index, so leasing N jobs reads about N
-- index entries per kind whatever the backlog (issue 18: with only jobs_due_idx (run_at, id), the join with
-- the worker's kinds made the planner scan and sort every pending job on every fetch: 105 ms at 36,650).
-- Only pending rows are in it, so it is as small as the backlog and a claim writes it once.
--
-- Plain CREATE INDEX: the migration runner applies each file in one transaction, where CONCURRENTLY is
-- refused. It holds a SHARE lock on jobs while it builds (claims and leases wait; reads do not), about a
-- second per million pending rows: deploy/README.md ("Rolling upgrades") says when to build it by hand beforehand.
CREATE INDEX IF NOT EXISTS jobs_kind_due_idx ON jobs (kind, run_at, id) WHERE state = 'pending';

-- The lease rescuer takes expired leases oldest first, by (lease_expires_at, id): with the id in the index it
-- reads them in that order and stops at its batch, rather than sorting every expired lease. It replaces
-- 0001's (lease_expires_at), which nothing else reads; both hold running jobs only.
CREATE INDEX IF NOT EXISTS jobs_lease_expiry_id_idx ON jobs (lease_expires_at, id) WHERE state = 'running';
DROP INDEX IF EXISTS jobs_lease_expiry_idx;
