-- name: job_rescue_expired_batch
-- Lease rescuer: takes up to %(limit)s jobs whose lease expired off 'running' in one statement, each by the
-- release rule (migration 0006, _v1 since 0017): cancelled if a cancel was asked, parked as poison after its kind's
-- threshold of orphanings in a row without a commit, else re-queued (orphan_policy redrive) or parked
-- (park). SKIP LOCKED passes over a job whose worker is inside a fenced write right now (the next pass sees
-- it again) and lets two rescuers split the work; the state and expiry guard makes a second rescue of the
-- same lease match nothing. %(tenant)s NULL: every tenant (one node); else that tenant's alone, which Citus
-- routes to its shard group (it refuses the FOR UPDATE over every shard; job_tenants_expired_on_shard says which).
WITH policy AS (
    SELECT p.kind, p.poison_threshold
    FROM unnest(%(kinds)s::text[], %(poison_thresholds)s::int[]) AS p(kind, poison_threshold)
),
locked AS (
    SELECT j.id FROM jobs j
    WHERE j.state = 'running' AND j.lease_expires_at < (SELECT coalesce(%(now)s, now()))
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    ORDER BY j.lease_expires_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
expired AS (
    -- Apart from the lock: Citus 12.1.9 sends a FOR UPDATE subplan's rows in one copy format and reads them
    -- back in another ("invalid input syntax for type bigint: PGCOPY") when the UPDATE below joins them.
    SELECT j.id,
           job_release_verdict_v1(j.cancel_requested, j.committed_since_release, j.releases_without_commit,
                                  coalesce(p.poison_threshold, %(poison_threshold)s), j.orphan_policy) AS verdict,
           job_release_count_v1(j.committed_since_release, j.releases_without_commit) AS releases
    FROM jobs j LEFT JOIN policy p ON p.kind = j.kind
    WHERE j.id = ANY (ARRAY(SELECT id FROM locked)) AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
),
rescued AS (
    UPDATE jobs j SET
        releases_without_commit = expired.releases,
        committed_since_release = false,
        state = CASE WHEN expired.verdict = 'redrive' THEN 'pending' WHEN expired.verdict = 'cancelled' THEN 'cancelled'
                                     ELSE 'parked' END::job_state,
        terminal_reason = CASE
            WHEN expired.verdict = 'cancelled' THEN 'cancelled; its worker lost the lease'
            WHEN expired.verdict = 'poison' THEN 'poison: orphaned ' || expired.releases || ' times without committing'
            WHEN expired.verdict = 'park' THEN 'orphaned: lease expired and orphan_policy is park'
            END,
        terminal_by = CASE WHEN expired.verdict = 'redrive' THEN NULL
                                           WHEN expired.verdict = 'cancelled' THEN coalesce(j.terminal_by, 'reconciler')
                                           ELSE 'reconciler' END,
        finished_at = CASE WHEN expired.verdict <> 'redrive' THEN (SELECT coalesce(%(now)s, now())) END,
        -- run_at is kept: a re-queued orphan was due first and stays first in line (for its lock key too).
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM expired
    WHERE j.id = expired.id AND j.state = 'running' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.tenant, j.kind, j.state, j.terminal_reason, j.lease_token, j.effect_id
),
closed AS (
    UPDATE job_attempts a SET finished_at = (SELECT coalesce(%(now)s, now())), outcome = 'lease_expired'
    FROM rescued
    WHERE a.job_id = rescued.id AND a.tenant = rescued.tenant AND a.lease_token = rescued.lease_token
      AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
),
woken AS (
    SELECT count(pg_notify('effectgate_jobs', k.kind)) AS n
    FROM (SELECT DISTINCT kind FROM rescued WHERE state = 'pending') k
)
SELECT r.id, r.kind, r.state::text AS state, r.terminal_reason, e.effect_key, (SELECT n FROM woken) AS woken
FROM rescued r JOIN effects e ON e.id = r.effect_id AND e.tenant = r.tenant
WHERE (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)
ORDER BY r.id;

-- name: job_tenants_expired_on_shard
-- Lease rescuer on Citus, one shard's read (ledger/shards.py): %1$s the jobs shard, %3$L the parameters. The
-- tenants of the shard's earliest expired leases; each tenant's are then rescued by job_rescue_expired_batch.
SELECT tenant, lease_expires_at AS at, id FROM %1$s
WHERE state = 'running' AND lease_expires_at < (%3$L::jsonb ->> 'now')::timestamptz
ORDER BY lease_expires_at, id
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: maintenance_lock_try
-- One process runs each maintenance service (or sweep) per tick: a transaction-scoped advisory lock,
-- released at commit, so a process that dies holds nothing; one frozen or cut off holds it no longer than the
-- session's idle_in_transaction_session_timeout (ledger/db.py).
SELECT pg_try_advisory_xact_lock(%(lock_id)s) AS owned;

-- name: maintenance_clock
-- The database's clock, the one every other maintenance statement uses when no clock is passed in.
SELECT now() AS now;

-- name: maintenance_session_lock_try
-- The partition and retention keepers' ownership: a session-level advisory lock, so their work can commit one
-- partition or batch at a time (holding one table's lock at a time, never several) while each stays the only
-- keeper. Between those transactions the session is idle outside any transaction, where
-- idle_in_transaction_session_timeout does not reach: while the lock is held, idle_session_timeout (PostgreSQL
-- 14+; NULL before, and then nothing is set) takes the same figure, so a holder frozen between two statements is
-- ended and the lock freed as one frozen inside a transaction is. The work between statements is the keeper's
-- own Python, never a wait. The previous setting is read first (MATERIALIZED: before set_config runs) and given
-- back by maintenance_session_unlock, so a pooled session keeps no idle bound once the lock is released.
WITH before AS MATERIALIZED (
    SELECT current_setting('idle_session_timeout', true) AS idle_session_timeout
),
lock AS MATERIALIZED (
    SELECT pg_try_advisory_lock(%(lock_id)s) AS owned
)
SELECT lock.owned, before.idle_session_timeout,
       CASE WHEN lock.owned AND before.idle_session_timeout IS NOT NULL
            THEN set_config('idle_session_timeout', current_setting('idle_in_transaction_session_timeout'), false)
       END AS bounded
FROM before, lock;

-- name: maintenance_session_unlock
-- Releases a keeper's session-level advisory lock and gives the session back the idle_session_timeout it had
-- (%(idle_session_timeout)s NULL: the server has no such setting, nothing to give back).
SELECT pg_advisory_unlock(%(lock_id)s) AS released,
       CASE WHEN %(idle_session_timeout)s::text IS NOT NULL
            THEN set_config('idle_session_timeout', %(idle_session_timeout)s::text, false)
       END AS restored;
