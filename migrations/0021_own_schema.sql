-- Its own schema (docs/adr/0019-own-schema.md). Every effectgate object lives in one Postgres schema, by default
-- `effectgate`, which the runner creates and puts alone on the search_path before it applies anything; so on a new
-- database migrations 0001-0018 already created everything there and this file does nothing.
--
-- A ledger made by an earlier release lives in `public`. The runner finds its migration record there, and applies
-- this file with the search_path on the configured schema (which is then empty): every object the earlier
-- migrations created moves across with ALTER ... SET SCHEMA, in this one transaction, the migration record last,
-- so the runner's INSERT of this file's record lands in the moved table. SET SCHEMA keeps every row, index,
-- constraint, identity sequence and grant (it changes the catalog, copying no data). Partitions are tables of their
-- own and move one by one. Nothing of an application's in `public` is touched: only these names move, and only
-- when public.schema_migrations is effectgate's own (it has the `checksum` column; Rails's and golang-migrate's
-- have `version`).
DO $move$
DECLARE
    target text := current_schema();
    tables text[] := ARRAY[
        'effects', 'jobs', 'job_attempts', 'steps', 'deliveries', 'effect_rejects', 'signature_failures',
        'paused_kinds', 'retention_purges', 'history_partitions', 'unmatched_deliveries', 'transmissions',
        'effect_versions'];
    functions text[] := ARRAY[
        'job_release_count', 'job_release_verdict', 'history_partition_create', 'history_partition_drop',
        'job_release_count_v1', 'job_release_verdict_v1', 'history_partition_create_v1', 'history_partition_drop_v1'];
    item record;
BEGIN
    IF target IS NULL OR target = 'public'
       OR to_regclass(format('%I.schema_migrations', target)) IS NOT NULL
       OR NOT EXISTS (SELECT FROM pg_attribute
                      WHERE attrelid = to_regclass('public.schema_migrations') AND attname = 'checksum'
                        AND NOT attisdropped) THEN
        RETURN;
    END IF;
    -- Partitions first, while their parents still say which they are.
    FOR item IN
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relnamespace = 'public'::regnamespace AND p.relname = ANY (tables)
          AND c.relnamespace = 'public'::regnamespace
        ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE public.%I SET SCHEMA %I', item.relname, target);
    END LOOP;
    FOR item IN
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname = ANY (tables)
        ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE public.%I SET SCHEMA %I', item.relname, target);
    END LOOP;
    IF to_regtype('public.job_state') IS NOT NULL THEN
        EXECUTE format('ALTER TYPE public.job_state SET SCHEMA %I', target);
    END IF;
    FOR item IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY (functions)
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET SCHEMA %I', item.signature, target);
    END LOOP;
    EXECUTE format('ALTER TABLE public.schema_migrations SET SCHEMA %I', target);
END
$move$;

-- The partition keeper runs in every worker and in `effectgate reconcile`, and its two verbs are DDL (CREATE TABLE
-- ... PARTITION OF, DROP TABLE), which only the tables' owner may run. Their _v2 run as the owner (SECURITY DEFINER),
-- so a runtime role with DML rights and EXECUTE on them keeps history partitioned. The bodies are 0017's, with one
-- more guard on the drop now that it runs as the owner: the name must be a partition of a history table, not merely
-- a row of history_partitions, which the runtime role may write. Their search_path is pinned to this schema with
-- pg_temp last (FROM CURRENT, set just below for this transaction), so no temporary object stands in for one of
-- ours, and PUBLIC may not call them: only roles granted EXECUTE.
SELECT set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

CREATE FUNCTION history_partition_create_v2(parent text, range_from timestamptz, range_to timestamptz)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
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

CREATE FUNCTION history_partition_drop_v2(partition text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM history_partitions WHERE name = partition) THEN
        RAISE EXCEPTION 'history_partition_drop: % is not a registered history partition', partition;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_inherits i
                   WHERE i.inhrelid = to_regclass(quote_ident(partition))
                     AND i.inhparent IN (to_regclass('deliveries'), to_regclass('effect_rejects'),
                                         to_regclass('signature_failures'))) THEN
        RAISE EXCEPTION 'history_partition_drop: % is not a partition of a history table', partition;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I', partition) INTO n;
    EXECUTE format('DROP TABLE %I', partition);
    DELETE FROM history_partitions WHERE name = partition;
    RETURN n;
END $$;

REVOKE EXECUTE ON FUNCTION history_partition_create_v2(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION history_partition_drop_v2(text) FROM PUBLIC;
