-- name: signature_failures_delete_expired
-- Retention: forgets up to %(limit)s failed-verification counters from before %(before)s (the window's cutoff, or
-- the first time partition's start if earlier: the legacy and DEFAULT partitions only).
WITH expired AS (
    SELECT source, reason, minute FROM signature_failures
    WHERE minute < %(before)s
    LIMIT %(limit)s
)
DELETE FROM signature_failures f
USING expired
WHERE f.source = expired.source AND f.reason = expired.reason AND f.minute = expired.minute;

-- name: signature_failures_default_delete_expired
-- Retention: forgets up to %(limit)s counters of the DEFAULT partition older than the window.
WITH expired AS (
    SELECT source, reason, minute FROM signature_failures_default
    WHERE minute < coalesce(%(now)s, now()) - make_interval(secs => %(window)s)
    LIMIT %(limit)s
)
DELETE FROM signature_failures_default f
USING expired
WHERE f.source = expired.source AND f.reason = expired.reason AND f.minute = expired.minute;

-- name: effect_payloads_purge_expired
-- Retention: turns up to %(limit)s effects whose job finished longer ago than their source's payload window
-- into tombstones — payload and step answers (result, error) purged, the job's outcome kept — oldest first.
-- Only finished jobs: a pending, running, failed-but-retrying job keeps everything it runs on.
WITH policy AS (
    SELECT p.source, p.secs FROM unnest(%(sources)s::text[], %(windows)s::float8[]) AS p(source, secs)
),
locked AS (
    -- The outcome is read here, from the row as locked: a resolve (failed -> resolved) that committed after this
    -- statement began is what the lock returns, where a second, plain read would see the statement's snapshot.
    SELECT j.id AS job_id, j.effect_id, j.state::text AS outcome
    FROM jobs j JOIN effects e ON e.id = j.effect_id AND e.tenant = j.tenant LEFT JOIN policy p ON p.source = e.source
    WHERE j.finished_at IS NOT NULL AND NOT j.payload_purged
      AND j.finished_at < coalesce(%(now)s, now()) - make_interval(secs => coalesce(p.secs, %(window)s))
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s) AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)
    ORDER BY j.finished_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j, e SKIP LOCKED
),
-- The writes below find their rows by id from an array (`= ANY(ARRAY(…))`), not by joining `locked`: with a
-- batch of a thousand rows a planner may hash-join, which reads the whole of jobs and effects once per batch
-- (PostgreSQL 18 did, at 10^5 jobs: tests/integration/ledger/test_query_plans.py). On Citus (12.1.9) the locked rows
-- cannot be joined at all: the FOR UPDATE subplan's result is written in one copy format and read back in
-- another ("invalid input syntax for type bigint: PGCOPY"). So each effect's outcome comes as a pair of arrays
-- in job order (`due`), and the clock as a column: Citus refuses now() inside an UPDATE's coalesce.
due AS (
    SELECT d.effect_id, d.outcome, coalesce(%(now)s, now()) AS purged_at
    FROM unnest(ARRAY(SELECT effect_id FROM locked ORDER BY job_id),
                ARRAY(SELECT outcome FROM locked ORDER BY job_id)) AS d(effect_id, outcome)
),
marked AS (
    UPDATE jobs j SET payload_purged = true
    WHERE j.id = ANY (ARRAY(SELECT job_id FROM locked)) AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id
),
purged AS (
    UPDATE effects e SET payload = NULL, purged_at = due.purged_at, outcome = due.outcome
    FROM due
    WHERE e.id = ANY (ARRAY(SELECT effect_id FROM locked)) AND e.id = due.effect_id
      AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)
    RETURNING e.id
),
answers AS (
    UPDATE steps s SET result = NULL, error = NULL
    WHERE s.effect_id = ANY (ARRAY(SELECT effect_id FROM locked)) AND (s.result IS NOT NULL OR s.error IS NOT NULL)
      AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM purged) AS payloads, (SELECT count(*) FROM answers) AS answers,
       (SELECT count(*) FROM marked) AS jobs;

-- name: reject_payloads_purge_expired
-- Retention: purges the rejected payload of up to %(limit)s key conflicts older than their source's payload
-- window; the reject row (both fingerprints, when, which key) stays for the history window.
WITH policy AS (
    SELECT p.source, p.secs FROM unnest(%(sources)s::text[], %(windows)s::float8[]) AS p(source, secs)
),
due AS (
    SELECT r.id FROM effect_rejects r LEFT JOIN policy p ON p.source = r.source
    WHERE r.rejected_payload IS NOT NULL
      AND r.received_at < coalesce(%(now)s, now()) - make_interval(secs => coalesce(p.secs, %(window)s))
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
    ORDER BY r.received_at, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE effect_rejects r SET rejected_payload = NULL FROM due WHERE r.id = due.id AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s);

-- name: unmatched_payloads_purge_expired
-- Retention: purges the payload kept for replay of up to %(limit)s unmatched deliveries older than their
-- source's payload window; the delivery row stays for the history window.
WITH policy AS (
    SELECT p.source, p.secs FROM unnest(%(sources)s::text[], %(windows)s::float8[]) AS p(source, secs)
),
due AS (
    SELECT d.id, d.received_at FROM deliveries d LEFT JOIN policy p ON p.source = d.source
    WHERE d.payload IS NOT NULL
      AND d.received_at < coalesce(%(now)s, now()) - make_interval(secs => coalesce(p.secs, %(window)s))
      AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s)
    ORDER BY d.received_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE deliveries d SET payload = NULL, body = NULL FROM due
WHERE d.id = due.id AND d.received_at = due.received_at AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s);

-- name: unmatched_seen_purge_expired
-- Retention: forgets up to %(limit)s unmatched bodies first seen before their source's payload window, so the same
-- body arriving later is kept again (with its payload, replayable) instead of counted against a purged row.
WITH policy AS (
    SELECT p.source, p.secs FROM unnest(%(sources)s::text[], %(windows)s::float8[]) AS p(source, secs)
),
due AS (
    SELECT u.tenant, u.source, u.fingerprint FROM unmatched_deliveries u LEFT JOIN policy p ON p.source = u.source
    WHERE u.first_seen_at < coalesce(%(now)s, now()) - make_interval(secs => coalesce(p.secs, %(window)s))
      AND (%(tenant)s::text IS NULL OR u.tenant = %(tenant)s)
    ORDER BY u.first_seen_at
    LIMIT %(limit)s
    FOR UPDATE OF u SKIP LOCKED
)
DELETE FROM unmatched_deliveries u USING due
WHERE u.tenant = due.tenant AND u.source = due.source AND u.fingerprint = due.fingerprint AND (%(tenant)s::text IS NULL OR u.tenant = %(tenant)s);

-- name: deliveries_delete_expired
-- Retention: deletes up to %(limit)s delivery rows received before %(before)s, oldest first. The caller passes the
-- history cutoff, or the start of the first time partition if earlier: time partitions are dropped whole
-- (partitions.PartitionKeeper), so this prunes to the legacy and DEFAULT partitions and never scans a live one.
WITH due AS (
    SELECT id, received_at FROM deliveries
    WHERE received_at < %(before)s
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM deliveries d USING due
WHERE d.id = due.id AND d.received_at = due.received_at AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s);

-- name: deliveries_default_delete_expired
-- Retention: deletes up to %(limit)s rows of the DEFAULT partition of deliveries older than the history window
-- (rows that arrived where no time partition was made).
WITH due AS (
    SELECT id, received_at FROM deliveries_default
    WHERE received_at < coalesce(%(now)s, now()) - make_interval(secs => %(window)s)
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM deliveries_default d USING due
WHERE d.id = due.id AND d.received_at = due.received_at AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s);

-- name: effect_rejects_delete_expired
-- Retention: deletes up to %(limit)s key-conflict rows received before %(before)s (as deliveries_delete_expired:
-- the legacy and DEFAULT partitions only).
WITH due AS (
    SELECT id, received_at FROM effect_rejects
    WHERE received_at < %(before)s
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM effect_rejects r USING due
WHERE r.id = due.id AND r.received_at = due.received_at AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s);

-- name: effect_rejects_default_delete_expired
-- Retention: deletes up to %(limit)s rows of the DEFAULT partition of effect_rejects older than the window.
WITH due AS (
    SELECT id, received_at FROM effect_rejects_default
    WHERE received_at < coalesce(%(now)s, now()) - make_interval(secs => %(window)s)
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM effect_rejects_default r USING due
WHERE r.id = due.id AND r.received_at = due.received_at AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s);

-- name: jobs_delete_expired
-- Retention: deletes up to %(limit)s finished jobs whose payload is purged and that finished longer ago than
-- the history window, with their attempts and steps; the effect's tombstone keeps the outcome.
WITH due AS (
    SELECT id, effect_id, tenant FROM jobs
    WHERE payload_purged AND finished_at < coalesce(%(now)s, now()) - make_interval(secs => %(window)s)
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY finished_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone_steps AS (
    DELETE FROM steps s USING due WHERE s.effect_id = due.effect_id AND s.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s) RETURNING 1
),
gone_attempts AS (
    DELETE FROM job_attempts a USING due WHERE a.job_id = due.id AND a.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s) RETURNING 1
),
gone_jobs AS (
    -- Steps and attempts reference the job; deleted by this same statement, the foreign keys (checked at its
    -- end) hold.
    DELETE FROM jobs j USING due WHERE j.id = due.id AND j.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s) RETURNING 1
)
SELECT (SELECT count(*) FROM gone_jobs) AS jobs, (SELECT count(*) FROM gone_attempts) AS attempts,
       (SELECT count(*) FROM gone_steps) AS steps;

-- name: effect_tombstones_delete_expired
-- Retention (opt-in dedupe window): deletes up to %(limit)s tombstones last seen longer ago than their
-- source's dedupe window, with whatever history still references them; a later delivery of the key is new.
-- No window (NULL: the default, or a source's own NULL) keeps its tombstones forever.
WITH policy AS (
    SELECT p.source, p.secs FROM unnest(%(sources)s::text[], %(windows)s::float8[]) AS p(source, secs)
),
due AS (
    SELECT e.id, e.tenant FROM effects e LEFT JOIN policy p ON p.source = e.source
    CROSS JOIN LATERAL (
        SELECT CASE WHEN p.source IS NULL THEN %(window)s::float8 ELSE p.secs END AS secs
    ) w
    WHERE e.purged_at IS NOT NULL AND w.secs IS NOT NULL
      AND e.last_seen_at < coalesce(%(now)s, now()) - make_interval(secs => w.secs)
      AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)
    ORDER BY e.last_seen_at, e.id
    LIMIT %(limit)s
    FOR UPDATE OF e SKIP LOCKED
),
gone_steps AS (
    DELETE FROM steps s USING due WHERE s.effect_id = due.id AND s.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s) RETURNING 1
),
gone_attempts AS (
    DELETE FROM job_attempts a USING jobs j, due
    WHERE j.effect_id = due.id AND j.tenant = due.tenant AND a.job_id = j.id AND a.tenant = j.tenant
      AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s) RETURNING 1
),
gone_jobs AS (
    DELETE FROM jobs j USING due WHERE j.effect_id = due.id AND j.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s) RETURNING 1
),
gone_deliveries AS (
    DELETE FROM deliveries d USING due WHERE d.effect_id = due.id AND d.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s) RETURNING 1
),
gone_rejects AS (
    DELETE FROM effect_rejects r USING due WHERE r.effect_id = due.id AND r.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s) RETURNING 1
),
gone AS (
    DELETE FROM effects e USING due WHERE e.id = due.id AND e.tenant = due.tenant
        AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s) RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS tombstones, (SELECT count(*) FROM gone_deliveries) AS deliveries,
       (SELECT count(*) FROM gone_rejects) AS rejects, (SELECT count(*) FROM gone_jobs) AS jobs,
       (SELECT count(*) FROM gone_attempts) AS attempts, (SELECT count(*) FROM gone_steps) AS steps;

-- name: retention_purges_count
-- Adds one pass's purges to the cumulative counters (what /metrics and the retention report read).
INSERT INTO retention_purges AS r (what, purged, last_purged_at, last_run_at)
SELECT w.what, w.n, CASE WHEN w.n > 0 THEN coalesce(%(now)s, now()) END, coalesce(%(now)s, now())
FROM unnest(%(whats)s::text[], %(counts)s::bigint[]) AS w(what, n)
ON CONFLICT (what) DO UPDATE SET
    purged = r.purged + EXCLUDED.purged,
    last_purged_at = coalesce(EXCLUDED.last_purged_at, r.last_purged_at),
    last_run_at = EXCLUDED.last_run_at;

-- name: retention_purges_all
-- The cumulative purge counters, per table or column.
SELECT what, purged, last_purged_at, last_run_at FROM retention_purges ORDER BY what;

-- name: retention_oldest_held
-- The oldest row each retention window still holds (NULL when none), read through the purge indexes.
SELECT
    (SELECT min(finished_at) FROM jobs WHERE finished_at IS NOT NULL AND NOT payload_purged) AS payloads,
    (SELECT min(received_at) FROM deliveries) AS deliveries,
    (SELECT min(received_at) FROM effect_rejects) AS effect_rejects,
    (SELECT min(finished_at) FROM jobs WHERE payload_purged) AS jobs,
    (SELECT min(last_seen_at) FROM effects WHERE purged_at IS NOT NULL) AS tombstones,
    (SELECT count(*) FROM effects WHERE purged_at IS NOT NULL) AS tombstone_count,
    (SELECT min(minute) FROM signature_failures) AS signature_failures;

-- name: history_partitions_list
-- The partitions the keeper knows, per parent, oldest first (range_from NULL: the legacy partition).
SELECT name, parent, range_from, range_to FROM history_partitions ORDER BY parent, range_to;

-- name: history_partition_create_for_range
-- Creates the partition of %(parent)s covering [%(range_from)s, %(range_to)s), moving in any rows DEFAULT holds
-- for that range; returns its name. Runs as the schema's owner (migration 0021).
SELECT history_partition_create_v2(%(parent)s, %(range_from)s, %(range_to)s) AS name;

-- name: history_partition_drop_registered
-- Drops one registered history partition (DROP TABLE, no DELETE); returns how many rows went with it. Runs as the
-- schema's owner (migration 0021), so a runtime role without DDL rights can call it.
SELECT history_partition_drop_v2(%(name)s) AS rows;

-- name: maintenance_lock_timeout_set
-- Bounds how long this transaction waits for a lock: partition DDL needs the parent table exclusively for a
-- moment, and must give up (and try next tick) rather than queue every claim behind it.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);


-- name: effect_payloads_purge_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for effect_payloads_purge_expired
-- (%1$s the shard of jobs, %2$s its effects shard, %3$L the parameters); that statement then runs once per tenant, routed.
WITH policy AS (
    SELECT p.source, p.secs
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'sources')),
                ARRAY(SELECT (jsonb_array_elements_text(%3$L::jsonb -> 'windows'))::float8)) AS p(source, secs)
)
SELECT j.tenant, j.finished_at AS at, j.id FROM %1$s j
JOIN %2$s e ON e.id = j.effect_id AND e.tenant = j.tenant LEFT JOIN policy p ON p.source = e.source
WHERE j.finished_at IS NOT NULL AND NOT j.payload_purged
  AND j.finished_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => coalesce(p.secs, (%3$L::jsonb ->> 'window')::float8))
ORDER BY j.finished_at, j.id
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: reject_payloads_purge_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for reject_payloads_purge_expired
-- (%1$s the shard of effect_rejects, %3$L the parameters); that statement then runs once per tenant, routed.
WITH policy AS (
    SELECT p.source, p.secs
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'sources')),
                ARRAY(SELECT (jsonb_array_elements_text(%3$L::jsonb -> 'windows'))::float8)) AS p(source, secs)
)
SELECT r.tenant, r.received_at AS at, NULL::bigint AS id FROM %1$s r LEFT JOIN policy p ON p.source = r.source
WHERE r.rejected_payload IS NOT NULL
  AND r.received_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => coalesce(p.secs, (%3$L::jsonb ->> 'window')::float8))
ORDER BY r.received_at
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: unmatched_payloads_purge_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for unmatched_payloads_purge_expired
-- (%1$s the shard of deliveries, %3$L the parameters); that statement then runs once per tenant, routed.
WITH policy AS (
    SELECT p.source, p.secs
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'sources')),
                ARRAY(SELECT (jsonb_array_elements_text(%3$L::jsonb -> 'windows'))::float8)) AS p(source, secs)
)
SELECT d.tenant, d.received_at AS at, NULL::bigint AS id FROM %1$s d LEFT JOIN policy p ON p.source = d.source
WHERE d.payload IS NOT NULL
  AND d.received_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => coalesce(p.secs, (%3$L::jsonb ->> 'window')::float8))
ORDER BY d.received_at
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: unmatched_seen_purge_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for unmatched_seen_purge_expired
-- (%1$s the shard of unmatched_deliveries, %3$L the parameters); that statement then runs once per tenant, routed.
WITH policy AS (
    SELECT p.source, p.secs
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'sources')),
                ARRAY(SELECT (jsonb_array_elements_text(%3$L::jsonb -> 'windows'))::float8)) AS p(source, secs)
)
SELECT u.tenant, u.first_seen_at AS at, NULL::bigint AS id FROM %1$s u LEFT JOIN policy p ON p.source = u.source
WHERE u.first_seen_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => coalesce(p.secs, (%3$L::jsonb ->> 'window')::float8))
ORDER BY u.first_seen_at
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: deliveries_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for deliveries_delete_expired
-- (%1$s the shard of deliveries, %3$L the parameters); that statement then runs once per tenant, routed.
SELECT tenant, received_at AS at, NULL::bigint AS id FROM %1$s WHERE received_at < (%3$L::jsonb ->> 'before')::timestamptz
ORDER BY received_at LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: deliveries_default_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for deliveries_default_delete_expired
-- (%1$s the shard of deliveries_default, %3$L the parameters); that statement then runs once per tenant, routed.
SELECT tenant, received_at AS at, NULL::bigint AS id FROM %1$s
WHERE received_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => (%3$L::jsonb ->> 'window')::float8)
ORDER BY received_at LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: effect_rejects_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for effect_rejects_delete_expired
-- (%1$s the shard of effect_rejects, %3$L the parameters); that statement then runs once per tenant, routed.
SELECT tenant, received_at AS at, NULL::bigint AS id FROM %1$s WHERE received_at < (%3$L::jsonb ->> 'before')::timestamptz
ORDER BY received_at LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: effect_rejects_default_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for effect_rejects_default_delete_expired
-- (%1$s the shard of effect_rejects_default, %3$L the parameters); that statement then runs once per tenant, routed.
SELECT tenant, received_at AS at, NULL::bigint AS id FROM %1$s
WHERE received_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => (%3$L::jsonb ->> 'window')::float8)
ORDER BY received_at LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: jobs_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for jobs_delete_expired
-- (%1$s the shard of jobs, %3$L the parameters); that statement then runs once per tenant, routed.
SELECT tenant, finished_at AS at, id FROM %1$s
WHERE payload_purged AND finished_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => (%3$L::jsonb ->> 'window')::float8)
ORDER BY finished_at, id LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: effect_tombstones_delete_expired_on_shard
-- Retention on Citus, one shard's read (ledger/shards.py): the tenants of the shard's oldest rows due for effect_tombstones_delete_expired
-- (%1$s the shard of effects, %3$L the parameters); that statement then runs once per tenant, routed.
WITH policy AS (
    SELECT p.source, p.secs
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'sources')),
                ARRAY(SELECT (jsonb_array_elements_text(%3$L::jsonb -> 'windows'))::float8)) AS p(source, secs)
)
SELECT e.tenant, e.last_seen_at AS at, e.id FROM %1$s e LEFT JOIN policy p ON p.source = e.source
CROSS JOIN LATERAL (SELECT CASE WHEN p.source IS NULL THEN (%3$L::jsonb ->> 'window')::float8 ELSE p.secs END AS secs) w
WHERE e.purged_at IS NOT NULL AND w.secs IS NOT NULL
  AND e.last_seen_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => w.secs)
ORDER BY e.last_seen_at, e.id
LIMIT (%3$L::jsonb ->> 'limit')::int;
