-- Versioned SQL functions (docs/adr/0017-versioned-sql-functions.md). During a rolling upgrade the previous
-- release's processes and this one's run against one schema, so a function that running code calls is never
-- changed in place: a new behaviour is a new name with the next version suffix, and the old name stays until no
-- process of the release that called it runs.
--
-- Expand (this migration): the four functions ledger/sql calls get their _v1 names, each with the body of its
-- unversioned original (a copy, not a call to it, so the contract step can drop the original alone). This
-- release's code calls only the _v1 names; the unversioned ones stay for the previous release's code.
-- Contract: the next release's migration drops job_release_count, job_release_verdict,
-- history_partition_create and history_partition_drop (unversioned), once no process of this release's
-- predecessor runs. tests/unit/ledger/test_sql_function_versions.py keeps ledger/sql on versioned names.

-- The job-release rule of migration 0006, unchanged. LANGUAGE sql, IMMUTABLE, one SELECT: the planner still
-- inlines it, so the hand-back and the lease rescuer cost what they did.
CREATE FUNCTION job_release_count_v1(committed_since_release boolean, releases_without_commit integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN committed_since_release THEN 0 ELSE releases_without_commit + 1 END $$;

CREATE FUNCTION job_release_verdict_v1(
    cancel_requested boolean,
    committed_since_release boolean,
    releases_without_commit integer,
    poison_threshold integer,
    orphan_policy text
)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE
    WHEN cancel_requested THEN 'cancelled'
    WHEN NOT committed_since_release AND releases_without_commit + 1 >= poison_threshold THEN 'poison'
    WHEN orphan_policy = 'redrive' THEN 'redrive'
    ELSE 'park'
END $$;

-- The partition keeper's two DDL verbs of migration 0008, unchanged.
CREATE FUNCTION history_partition_create_v1(parent text, range_from timestamptz, range_to timestamptz)
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

CREATE FUNCTION history_partition_drop_v1(partition text)
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
