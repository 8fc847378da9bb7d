-- Time-partitioned history. deliveries, effect_rejects and signature_failures are append-only records of what
-- arrived, read by time and forgotten by age: each becomes a table partitioned by range of its arrival time,
-- so retention drops a whole partition (no DELETE, no vacuum) once all of it is past its window. The
-- partition keeper (ledger/maintenance/partitions.py) creates partitions ahead of time and drops expired ones.
--
-- Not partitioned, on purpose: effects (the claim's unique key must stay one global (tenant, effect_key)
-- constraint, which a time partition key would break), jobs (live state, updated in place), steps (their
-- primary key is invariant 7, "a step is never recorded twice", which must not depend on time) and
-- job_attempts (deleted with their job, when the job is, not by their own age).
--
-- Existing rows stay where they are: each old table is attached, as it is, as the partition for everything
-- before the end of today (its "legacy" partition, dropped when all of it has expired; until then retention
-- deletes its expired rows a batch at a time). A DEFAULT partition takes any row no partition covers (a
-- clock far ahead, a keeper that has not run), so an insert never fails for want of a partition.
--
-- Distributable by tenant (Citus): the history tables carry tenant in their primary keys, and refer to their
-- effect without a foreign key (a partitioned history row's reference is written by the claim statement that
-- returned the effect's id, and removed with the effect by the tombstone expiry): see
-- tests/integration/ledger/test_schema_distributable.py.

-- Which partitions the keeper made, and what each covers; range_from NULL is the legacy partition (MINVALUE).
CREATE TABLE history_partitions (
    name       text        PRIMARY KEY,
    parent     text        NOT NULL CHECK (parent IN ('deliveries', 'effect_rejects', 'signature_failures')),
    range_from timestamptz,
    range_to   timestamptz NOT NULL
);
CREATE INDEX history_partitions_parent_idx ON history_partitions (parent, range_to);

-- deliveries -------------------------------------------------------------------------------------------
ALTER TABLE deliveries RENAME TO deliveries_legacy;
ALTER TABLE deliveries_legacy DROP CONSTRAINT deliveries_pkey;
ALTER TABLE deliveries_legacy DROP CONSTRAINT deliveries_effect_id_fkey;
ALTER TABLE deliveries_legacy ALTER COLUMN id DROP IDENTITY;
-- An unmatched delivery keeps its payload for the payload window, so it can be replayed once a handler for it
-- exists (`effectgate ledger replay --unmatched`); NULL for every other outcome (the effect holds it).
ALTER TABLE deliveries_legacy ADD COLUMN payload jsonb;
ALTER INDEX deliveries_effect_idx RENAME TO deliveries_legacy_effect_idx;
ALTER INDEX deliveries_received_idx RENAME TO deliveries_legacy_received_idx;
ALTER INDEX deliveries_duplicate_idx RENAME TO deliveries_legacy_duplicate_idx;

CREATE TABLE deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY,
    request_id    text        NOT NULL,
    received_at   timestamptz NOT NULL,
    tenant        text        NOT NULL,
    source        text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text        NOT NULL,
    effect_id     bigint,
    effect_key    text,
    outcome       text        NOT NULL
        CONSTRAINT deliveries_outcome_check CHECK (outcome IN ('accepted', 'duplicate', 'rejected', 'unmatched')),
    fingerprint   text        NOT NULL,
    secret_index  integer,
    payload       jsonb,
    PRIMARY KEY (id, received_at, tenant)
) PARTITION BY RANGE (received_at);
CREATE INDEX deliveries_effect_idx ON deliveries (effect_id, received_at);
-- Only unmatched deliveries keep a payload: this index holds them alone (replay by source, purge by age).
CREATE INDEX deliveries_unmatched_payload_idx ON deliveries (source, received_at) WHERE payload IS NOT NULL;
CREATE INDEX deliveries_received_idx ON deliveries (received_at);
CREATE INDEX deliveries_duplicate_idx ON deliveries (received_at) WHERE outcome = 'duplicate';

-- effect_rejects ---------------------------------------------------------------------------------------
ALTER TABLE effect_rejects RENAME TO effect_rejects_legacy;
ALTER TABLE effect_rejects_legacy DROP CONSTRAINT effect_rejects_pkey;
ALTER TABLE effect_rejects_legacy DROP CONSTRAINT effect_rejects_effect_id_fkey;
ALTER TABLE effect_rejects_legacy ALTER COLUMN id DROP IDENTITY;
ALTER INDEX effect_rejects_received_idx RENAME TO effect_rejects_legacy_received_idx;
ALTER INDEX effect_rejects_effect_idx RENAME TO effect_rejects_legacy_effect_idx;
ALTER INDEX effect_rejects_source_idx RENAME TO effect_rejects_legacy_source_idx;
ALTER INDEX effect_rejects_tenant_idx RENAME TO effect_rejects_legacy_tenant_idx;
ALTER INDEX effect_rejects_type_idx RENAME TO effect_rejects_legacy_type_idx;

CREATE TABLE effect_rejects (
    id                   bigint GENERATED ALWAYS AS IDENTITY,
    effect_id            bigint      NOT NULL,
    tenant               text        NOT NULL,
    effect_key           text        NOT NULL,
    source               text        NOT NULL,
    event_id             text        NOT NULL,
    event_type           text        NOT NULL,
    held_fingerprint     text        NOT NULL,
    rejected_fingerprint text        NOT NULL,
    rejected_payload     jsonb,
    received_at          timestamptz NOT NULL,
    PRIMARY KEY (id, received_at, tenant)
) PARTITION BY RANGE (received_at);
CREATE INDEX effect_rejects_received_idx ON effect_rejects (received_at);
CREATE INDEX effect_rejects_effect_idx ON effect_rejects (effect_id, received_at);
CREATE INDEX effect_rejects_source_idx ON effect_rejects (source, received_at, id);
CREATE INDEX effect_rejects_tenant_idx ON effect_rejects (tenant, received_at, id);
CREATE INDEX effect_rejects_type_idx ON effect_rejects (event_type, received_at, id);

-- signature_failures -----------------------------------------------------------------------------------
ALTER TABLE signature_failures RENAME TO signature_failures_legacy;
ALTER TABLE signature_failures_legacy DROP CONSTRAINT signature_failures_pkey;
ALTER INDEX signature_failures_minute_idx RENAME TO signature_failures_legacy_minute_idx;

CREATE TABLE signature_failures (
    source           text        NOT NULL,
    reason           text        NOT NULL,
    minute           timestamptz NOT NULL,
    count            integer     NOT NULL,
    bytes_total      bigint      NOT NULL,
    last_body_sha256 text        NOT NULL,
    last_detail      text        NOT NULL,
    last_seen_at     timestamptz NOT NULL,
    PRIMARY KEY (source, reason, minute)
) PARTITION BY RANGE (minute);
CREATE INDEX signature_failures_minute_idx ON signature_failures (minute);

-- The old tables become the legacy partitions; everything else lands in DEFAULT until the keeper's first
-- pass makes partitions from the end of today on.
DO $$
DECLARE
    cutover timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day';
    parent text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['deliveries', 'effect_rejects', 'signature_failures'] LOOP
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       parent, parent || '_legacy', cutover);
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', parent || '_default', parent);
        INSERT INTO history_partitions (name, parent, range_from, range_to)
        VALUES (parent || '_legacy', parent, NULL, cutover);
    END LOOP;
END $$;

SELECT setval(pg_get_serial_sequence('deliveries', 'id'), coalesce((SELECT max(id) FROM deliveries), 0) + 1, false);
SELECT setval(pg_get_serial_sequence('effect_rejects', 'id'),
              coalesce((SELECT max(id) FROM effect_rejects), 0) + 1, false);

-- The keeper's two DDL verbs, so its SQL stays in named blocks and table names never come from input: only
-- the three parents above are accepted, and partition names are derived, never passed in.
CREATE FUNCTION history_partition_create(parent text, range_from timestamptz, range_to timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := parent || '_p' || to_char(range_from AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
    col text := CASE parent WHEN 'signature_failures' THEN 'minute' ELSE 'received_at' END;
    stray boolean;
BEGIN
    IF parent NOT IN ('deliveries', 'effect_rejects', 'signature_failures') THEN
        RAISE EXCEPTION 'history_partition_create: % is not a partitioned history table', parent;
    END IF;
    -- Rows already in DEFAULT for this range (a clock ahead of the keeper) would make the CREATE fail: they
    -- are moved into the new partition, in this same transaction.
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= %L AND %I < %L)',
                   parent || '_default', col, range_from, col, range_to) INTO stray;
    IF stray THEN
        EXECUTE format('CREATE TEMP TABLE history_partition_moving ON COMMIT DROP AS '
                       'WITH moved AS (DELETE FROM %I WHERE %I >= %L AND %I < %L RETURNING *) SELECT * FROM moved',
                       parent || '_default', col, range_from, col, range_to);
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   name, parent, range_from, range_to);
    IF stray THEN
        EXECUTE format('INSERT INTO %I OVERRIDING SYSTEM VALUE SELECT * FROM history_partition_moving', parent);
        DROP TABLE history_partition_moving;
    END IF;
    INSERT INTO history_partitions (name, parent, range_from, range_to)
    VALUES (name, parent, range_from, range_to);
    RETURN name;
END $$;

-- Drops one registered partition and says how many rows went with it.
CREATE FUNCTION history_partition_drop(partition text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM history_partitions WHERE name = partition) THEN
        RAISE EXCEPTION 'history_partition_drop: % is not a registered history partition', partition;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I', partition) INTO n;
    EXECUTE format('DROP TABLE %I', partition);
    DELETE FROM history_partitions WHERE name = partition;
    RETURN n;
END $$;
