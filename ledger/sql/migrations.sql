-- name: migrations_lock
-- Serialises migration runs across processes starting at once; held until migrations_unlock.
SELECT pg_advisory_lock(%(lock_id)s);

-- name: migrations_unlock
-- Releases the migration lock.
SELECT pg_advisory_unlock(%(lock_id)s);

-- name: migrations_table_ensure
-- The record of what was applied, by name and checksum.
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
-- What this database has applied.
SELECT name, checksum FROM schema_migrations ORDER BY name;

-- name: migration_record
-- Records one applied migration, in the transaction that applied it.
INSERT INTO schema_migrations (name, checksum) VALUES (%(name)s, %(checksum)s);

-- name: migrations_public_ledger_shape
-- Whether `public` holds what a release before 0021 made there, from the catalog alone (a table there may be
-- anyone's, with any columns; Rails, golang-migrate, dbmate and Flyway keep a schema_migrations of their own there).
-- Asked only while effectgate's schema (the search_path) has no migration record. `record`: a schema_migrations of
-- exactly effectgate's three columns, whose rows migrations_public_ledger_first then reads; `tables`: effects and
-- jobs with columns and the job_state type only effectgate's 0001 makes. Read-only.
SELECT to_regclass('schema_migrations') IS NULL AND current_schema() IS DISTINCT FROM 'public' AS unmoved,
       coalesce((SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attname)
                 FROM pg_attribute a
                 WHERE a.attrelid = to_regclass('public.schema_migrations') AND a.attnum > 0 AND NOT a.attisdropped)
                = ARRAY['applied_at timestamp with time zone', 'checksum text', 'name text'], false) AS record,
       (SELECT count(*) FROM pg_attribute a
        WHERE a.attrelid = to_regclass('public.effects') AND NOT a.attisdropped
          AND a.attname IN ('tenant', 'effect_key', 'fingerprint')) = 3
       AND (SELECT count(*) FROM pg_attribute a
            WHERE a.attrelid = to_regclass('public.jobs') AND NOT a.attisdropped
              AND (a.attname IN ('effect_id', 'lease_token', 'orphan_policy')
                   OR (a.attname = 'state' AND a.atttypid = to_regtype('public.job_state')))) = 4 AS tables;

-- name: migrations_public_ledger_first
-- After migrations_public_ledger_shape found effectgate's columns: whether public.schema_migrations records effectgate's
-- first file with the checksum effectgate ships (a SHA-256 of that file's text, which no other tool writes).
SELECT EXISTS (SELECT FROM public.schema_migrations WHERE name = %(name)s AND checksum = %(checksum)s) AS ours;

-- name: migrations_applied_legacy
-- What a ledger of a release before 0021 has applied, and when, read where those releases kept it.
SELECT name, checksum, applied_at FROM public.schema_migrations ORDER BY name;

-- name: migration_search_path_set_local
-- The search_path for one migration's transaction only (reverts at COMMIT): a pre-0021 ledger's missing older
-- files run in `public` beside their tables, and 0021 sees effectgate's schema first and the old record behind it.
SELECT set_config('search_path',
                  (SELECT string_agg(quote_ident(s), ', ' ORDER BY n)
                   FROM unnest(%(schemas)s::text[]) WITH ORDINALITY AS t(s, n)),
                  true);

-- name: schema_present
-- Whether effectgate's schema exists (CREATE SCHEMA IF NOT EXISTS checks the CREATE right before existence, so
-- the runner asks first: a role without it can still find an up-to-date ledger up to date).
SELECT to_regnamespace(quote_ident(%(schema)s)) IS NOT NULL AS present;

-- name: schema_ensure
-- Creates effectgate's schema when missing ({schema} is an identifier composed by the runner, never input text).
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: migrations_table_exists
-- Whether the migration record exists, without creating it (readiness checks must not write).
SELECT to_regclass('schema_migrations') IS NOT NULL AS present;

-- name: migrations_applied_at
-- What this database has applied, and when (migrate --status; read-only, after migrations_table_exists).
SELECT name, checksum, applied_at FROM schema_migrations ORDER BY name;

-- name: migration_script_head
-- Opens a printed script (migrate --print-sql), which runs inside the caller's one transaction (psql -1, Alembic,
-- Flyway, golang-migrate): the lock `migrate` takes, held to that transaction's end; effectgate's schema, created
-- only when missing (CREATE SCHEMA IF NOT EXISTS checks the database's CREATE right before it looks, so an owner of a
-- pre-created schema could not run it); and the caller's search_path, kept for migration_script_tail.
DO $head$
BEGIN
    PERFORM pg_advisory_xact_lock(%(lock_id)s);
    IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = %(schema)s) THEN
        EXECUTE format('CREATE SCHEMA %%I', %(schema)s::text);
    END IF;
    PERFORM set_config('effectgate.search_path_before', current_setting('search_path'), true);
END
$head$;

-- name: migration_script_search_path
-- Before each migration in a printed script: the search_path that migration runs with, for this transaction only.
-- Outside one transaction (psql without -1) the head's kept search_path is gone by now, and so would this one be
-- before the next statement, which would then create effectgate's tables in the caller's schema: refused here.
DO $path$
BEGIN
    IF coalesce(current_setting('effectgate.search_path_before', true), '') = '' THEN
        RAISE EXCEPTION 'effectgate migration %% must run in one transaction with the whole script (psql -1)', %(name)s;
    END IF;
    PERFORM set_config('search_path',
                       (SELECT string_agg(quote_ident(s), ', ' ORDER BY n)
                        FROM unnest(%(schemas)s::text[]) WITH ORDINALITY AS t(s, n)),
                       true);
END
$path$;

-- name: migration_script_guard
-- In a printed script, before a migration: refuse it when it is applied already (the script was run twice), or
-- when the one before it is not ({record} is the migration table, schema-qualified by the runner).
DO $guard$
BEGIN
    IF EXISTS (SELECT FROM {record} WHERE name = %(name)s) THEN
        RAISE EXCEPTION 'effectgate migration %% is applied already', %(name)s;
    END IF;
    IF %(previous)s::text IS NOT NULL
       AND NOT EXISTS (SELECT FROM {record} WHERE name = %(previous)s::text) THEN
        RAISE EXCEPTION 'effectgate migration %% needs %% applied first', %(name)s, %(previous)s::text;
    END IF;
END
$guard$;

-- name: migration_script_record
-- Records one migration in a printed script, after its file ({record}: the migration table, schema-qualified, so a
-- search_path the file changed cannot send the record elsewhere).
INSERT INTO {record} (name, checksum) VALUES (%(name)s, %(checksum)s);

-- name: migration_script_tail
-- Ends a printed script: the caller's search_path back as it was before the head (its tool writes its own record
-- next, unqualified, in the same transaction), and the kept copy cleared.
DO $tail$
BEGIN
    PERFORM set_config('search_path', current_setting('effectgate.search_path_before'), true);
    PERFORM set_config('effectgate.search_path_before', '', true);
END
$tail$;

-- name: database_encoding
-- The database's name and encoding: migrate refuses anything but UTF8 before it writes.
SELECT current_database() AS db, current_setting('server_encoding') AS enc;

-- name: readiness_ping
-- Readiness on a connection that found the ledger migrated: only whether the server answers.
SELECT 1;
