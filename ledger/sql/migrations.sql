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

-- name: migrations_table_exists
-- Whether the migration record exists, without creating it (readiness checks must not write).
SELECT to_regclass('schema_migrations') IS NOT NULL AS present;
