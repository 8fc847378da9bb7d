-- Distributes a freshly migrated ledger by tenant on Citus (12.1, PostgreSQL 15): run once on the coordinator,
-- after `effectgate migrate`, with the search_path on effectgate's schema:
--     psql "$CITUS_URL" -v ON_ERROR_STOP=1 -c 'SET search_path TO effectgate' -f deploy/citus/distribute.sql
-- (`make citus-check` runs it). deploy/README.md, "Past one Postgres", says what holds and what does not yet.
--
-- The tables that grow with traffic are hash-distributed on `tenant` and colocated with effects, so every key
-- and every join on (id, tenant) stays within one shard group. The small global tables are reference tables
-- (a copy on every node) or stay on the coordinator.

-- One connection per node for the whole script: create_distributed_function refuses to run in a transaction that
-- already wrote to distributed tables over several connections (as when the script is sent as one statement).
SET citus.multi_shard_modify_mode TO 'sequential';

-- 0022's fill triggers serve a previous release's inserts while it drains on one node; a cluster is set up
-- fresh by this release, and Citus refuses to distribute a table with triggers.
DROP TRIGGER IF EXISTS job_attempts_tenant_fill ON job_attempts;
DROP TRIGGER IF EXISTS steps_tenant_fill ON steps;

-- Referenced by the distributed tables' statements (the fetch reads paused_kinds): copies on every node.
SELECT create_reference_table('paused_kinds');
SELECT create_reference_table('kind_actions');

-- The fetch on Citus is per tenant (a multi-shard FOR UPDATE is refused), and a shard holds many tenants. On
-- jobs_kind_due_tenant_idx (kind, run_at, id), where the tenant is only carried, one tenant's fetch walks every
-- due row of its kind in the shard until it finds its own: a hot tenant's 10^5 due jobs were read and discarded
-- by each of its shard-neighbours' fetches (5.0 -> 16.7 ms). Keyed by tenant first, a tenant's fetch reads only
-- its own rows, and the fair discovery (job_tenants_due_on_shard) steps from tenant to tenant on it. Here
-- and not in a migration: one Postgres never fetches per tenant, and its claims would write a second index of
-- every pending job for nothing. Made before distributing, so each shard is made with it (in this
-- script, after distributing, Citus fails to send the CREATE INDEX to the shards: "cannot insert multiple commands
-- into a prepared statement"); on a ledger distributed by an older distribute.sql, run it once as a statement of its own
-- (deploy/README.md, "Past one Postgres").
CREATE INDEX IF NOT EXISTS jobs_tenant_kind_due_idx ON jobs (tenant, kind, run_at, id) WHERE state = 'pending';

SELECT create_distributed_table('effects', 'tenant');
SELECT create_distributed_table('jobs', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('job_attempts', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('steps', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('job_actions', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('effect_versions', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('unmatched_deliveries', 'tenant', colocate_with => 'effects');
-- Partitioned by time: Citus distributes each partition with its parent, and the partition keeper's
-- CREATE TABLE ... PARTITION OF on the coordinator makes the new partition's shards.
SELECT create_distributed_table('deliveries', 'tenant', colocate_with => 'effects');
SELECT create_distributed_table('effect_rejects', 'tenant', colocate_with => 'effects');

-- The claim for one tenant (migration 0023), distributed by its tenant argument with effects: a call outside a
-- transaction block runs whole on the node holding that tenant's shards, where the gateway sends each batch.
SELECT create_distributed_function(
    'effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[], text[], text[], int[],'
    ' int[], text[], text[], int[], int8[], text[], text[], timestamptz)',
    '$1', colocate_with => 'effects');

-- Left on the coordinator, on purpose: schema_migrations (the runner's own), history_partitions (the keeper's
-- registry, beside the DDL it records), signature_failures and transmissions (written before any tenant is
-- known, keyed by source), and retention_purges (retention's counters, written with every batch: a write to a
-- reference table needs every node, so while one worker node was down no tenant's rows could be purged).
