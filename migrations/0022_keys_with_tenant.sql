-- Keys with tenant (issue 23): every primary, unique and foreign key among the tables that grow with traffic
-- names `tenant`, so the ledger can be distributed by tenant on Citus (create_distributed_table refuses a
-- unique key without the distribution column, and a foreign key between distributed tables must join on it).
-- deliveries, effect_rejects, unmatched_deliveries and effect_versions already had it; this file does effects,
-- jobs, job_attempts and steps. tests/integration/ledger/test_schema_distributable.py reads the rule off the catalog.
--
-- The id comes first and tenant second in each key: a lookup by id alone (the worker's fenced writes, the
-- operator's `jobs show`) still uses the key's index on one node, and nothing is unique per tenant that was not
-- already unique on its own (ids come from one identity sequence), so no row that was valid is refused.
--
-- job_attempts and steps gain a tenant column, copied from their job. The statements of this release write it;
-- a process of the previous release still draining does not, so a BEFORE INSERT trigger fills it from the job
-- when the insert leaves it NULL (WHEN (NEW.tenant IS NULL): this release's inserts never call it). On Citus
-- those two triggers are dropped before the tables are distributed (deploy/citus/distribute.sql): a cluster is
-- set up fresh by this release.
--
-- Cost on an existing ledger: the new columns are filled by one UPDATE each (a rewrite of job_attempts and
-- steps), and every key is rebuilt and every foreign key re-checked, under ACCESS EXCLUSIVE locks, in this one
-- transaction. Stop the processes first (0021 already requires it); docs/migrations.md gives a measured time
-- (python -m tests.bench.keys_with_tenant).

ALTER TABLE job_attempts ADD COLUMN tenant text;
UPDATE job_attempts a SET tenant = j.tenant FROM jobs j WHERE j.id = a.job_id;
ALTER TABLE job_attempts ALTER COLUMN tenant SET NOT NULL;

ALTER TABLE steps ADD COLUMN tenant text;
UPDATE steps s SET tenant = j.tenant FROM jobs j WHERE j.id = s.job_id;
ALTER TABLE steps ALTER COLUMN tenant SET NOT NULL;

-- The references go first: a key cannot be dropped while a foreign key depends on it.
ALTER TABLE steps DROP CONSTRAINT steps_effect_id_fkey;
ALTER TABLE steps DROP CONSTRAINT steps_job_id_fkey;
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_job_id_fkey;
ALTER TABLE jobs DROP CONSTRAINT jobs_effect_id_fkey;

ALTER TABLE effects DROP CONSTRAINT effects_pkey;
ALTER TABLE effects ADD CONSTRAINT effects_pkey PRIMARY KEY (id, tenant);

ALTER TABLE jobs DROP CONSTRAINT jobs_pkey;
ALTER TABLE jobs ADD CONSTRAINT jobs_pkey PRIMARY KEY (id, tenant);
-- One job per effect, as before: an effect belongs to one tenant, so (effect_id, tenant) is as strict.
ALTER TABLE jobs DROP CONSTRAINT jobs_effect_id_key;
ALTER TABLE jobs ADD CONSTRAINT jobs_effect_id_key UNIQUE (effect_id, tenant);
ALTER TABLE jobs ADD CONSTRAINT jobs_effect_id_fkey
    FOREIGN KEY (effect_id, tenant) REFERENCES effects (id, tenant);

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_pkey;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_pkey PRIMARY KEY (job_id, lease_token, tenant);
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_job_id_fkey
    FOREIGN KEY (job_id, tenant) REFERENCES jobs (id, tenant);

-- Invariant 7, "a step is never recorded twice", per (effect, name): tenant is implied by the effect.
ALTER TABLE steps DROP CONSTRAINT steps_pkey;
ALTER TABLE steps ADD CONSTRAINT steps_pkey PRIMARY KEY (effect_id, name, tenant);
ALTER TABLE steps ADD CONSTRAINT steps_effect_id_fkey
    FOREIGN KEY (effect_id, tenant) REFERENCES effects (id, tenant);
ALTER TABLE steps ADD CONSTRAINT steps_job_id_fkey
    FOREIGN KEY (job_id, tenant) REFERENCES jobs (id, tenant);

-- The previous release's inserts, which name no tenant, while it drains (see the head of this file).
CREATE FUNCTION job_child_tenant_fill() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    SELECT j.tenant INTO NEW.tenant FROM jobs j WHERE j.id = NEW.job_id;
    RETURN NEW;
END $$;

CREATE TRIGGER job_attempts_tenant_fill BEFORE INSERT ON job_attempts
    FOR EACH ROW WHEN (NEW.tenant IS NULL) EXECUTE FUNCTION job_child_tenant_fill();
CREATE TRIGGER steps_tenant_fill BEFORE INSERT ON steps
    FOR EACH ROW WHEN (NEW.tenant IS NULL) EXECUTE FUNCTION job_child_tenant_fill();
