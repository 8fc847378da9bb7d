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
        'paused_kinds', 'retention_purges', 'history_partitions', 'unmatched_deliveries', 'transmissions'];
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
