-- name: job_fetch_and_lease
-- Leases up to %(limit)s due pending jobs of the given kinds to one worker, each under a new fencing token,
-- and opens an attempt row for each. SKIP LOCKED lets many workers fetch at once without waiting on each other.
WITH due AS (
    SELECT id FROM jobs
    WHERE state = 'pending' AND run_at <= coalesce(%(now)s, now()) AND kind = ANY(%(kinds)s)
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
leased AS (
    UPDATE jobs j SET
        state = 'running',
        attempt = j.attempt + 1,
        lease_token = j.lease_token + 1,
        lease_owner = %(owner)s,
        lease_expires_at = coalesce(%(now)s, now()) + make_interval(secs => %(ttl)s),
        updated_at = coalesce(%(now)s, now())
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.effect_id, j.kind, j.tenant, j.attempt, j.max_attempts, j.lease_token, j.checkpoint,
              j.cancel_requested
),
attempt AS (
    INSERT INTO job_attempts (job_id, attempt, lease_token, worker, started_at)
    SELECT id, attempt, lease_token, %(owner)s, coalesce(%(now)s, now()) FROM leased
)
SELECT l.*, e.effect_key, e.source, e.event_id, e.event_type, e.payload
FROM leased l JOIN effects e ON e.id = l.effect_id
ORDER BY l.id;

-- name: lease_extend_if_held
-- Heartbeat: pushes the lease expiry out, only for the holder of the current token; tells it of a cancel.
UPDATE jobs SET
    lease_expires_at = coalesce(%(now)s, now()) + make_interval(secs => %(ttl)s),
    updated_at = coalesce(%(now)s, now())
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING cancel_requested;

-- name: lease_hold_if_leased
-- Locks the job row for the rest of the caller's transaction, only for the holder of the current token:
-- a reclaim cannot interleave with a fenced write, and the write counts as committed progress.
UPDATE jobs SET committed_since_release = true
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING id;

-- name: checkpoint_save_if_leased
-- Commits a resume point, only for the holder of the current token.
UPDATE jobs SET
    checkpoint = %(checkpoint)s,
    committed_since_release = true,
    updated_at = coalesce(%(now)s, now())
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING id;

-- name: job_finish_if_leased
-- The one terminal transition a worker makes (succeeded, failed or parked), fenced by the token. A cancel
-- requested while the job ran wins in this same statement, so a cancelled job is never reported succeeded.
WITH done AS (
    UPDATE jobs SET
        state = CASE WHEN cancel_requested THEN 'cancelled'::job_state ELSE %(state)s::job_state END,
        terminal_reason = CASE WHEN cancel_requested THEN 'cancelled while running' ELSE %(reason)s END,
        terminal_by = CASE WHEN cancel_requested THEN coalesce(terminal_by, 'operator') ELSE %(by)s END,
        last_error = coalesce(%(error)s, last_error),
        unrecoverable = %(unrecoverable)s,
        lease_owner = NULL,
        lease_expires_at = NULL,
        finished_at = coalesce(%(now)s, now()),
        updated_at = coalesce(%(now)s, now())
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING id, state, lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = coalesce(%(now)s, now()),
        outcome = done.state::text,
        error_type = %(error)s ->> 'type',
        error_message = %(error)s ->> 'message',
        traceback = %(error)s ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
)
SELECT state::text FROM done;

-- name: job_retry_if_leased
-- Gives the job back for another attempt at run_at = now + delay, fenced by the token; a pending cancel
-- ends it cancelled instead.
WITH done AS (
    UPDATE jobs SET
        state = CASE WHEN cancel_requested THEN 'cancelled'::job_state ELSE 'pending'::job_state END,
        terminal_reason = CASE WHEN cancel_requested THEN 'cancelled while running' END,
        terminal_by = CASE WHEN cancel_requested THEN coalesce(terminal_by, 'operator') END,
        finished_at = CASE WHEN cancel_requested THEN coalesce(%(now)s, now()) END,
        run_at = coalesce(%(now)s, now()) + make_interval(secs => %(delay)s),
        last_error = %(error)s,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s, now())
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING id, state, lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = coalesce(%(now)s, now()),
        outcome = 'retry',
        error_type = %(error)s ->> 'type',
        error_message = %(error)s ->> 'message',
        traceback = %(error)s ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
)
SELECT state::text FROM done;

-- name: job_hand_back_if_leased
-- A slice spent its budget and hands the rest back: re-queued at once, lease released, fenced by the token.
-- A hand-back is progress only if something was committed since the last release; after
-- %(poison_threshold)s releases in a row without one, the job is parked as poison.
WITH done AS (
    UPDATE jobs SET
        releases_without_commit = CASE WHEN committed_since_release THEN 0 ELSE releases_without_commit + 1 END,
        committed_since_release = false,
        state = CASE
            WHEN cancel_requested THEN 'cancelled'::job_state
            WHEN NOT committed_since_release AND releases_without_commit + 1 >= %(poison_threshold)s
                THEN 'parked'::job_state
            ELSE 'pending'::job_state END,
        terminal_reason = CASE
            WHEN cancel_requested THEN 'cancelled while running'
            WHEN NOT committed_since_release AND releases_without_commit + 1 >= %(poison_threshold)s
                THEN 'poison: handed back ' || (releases_without_commit + 1) || ' times without committing'
            END,
        terminal_by = CASE WHEN cancel_requested THEN coalesce(terminal_by, 'operator')
                           WHEN NOT committed_since_release AND releases_without_commit + 1 >= %(poison_threshold)s
                               THEN %(by)s END,
        finished_at = CASE
            WHEN cancel_requested
              OR (NOT committed_since_release AND releases_without_commit + 1 >= %(poison_threshold)s)
                THEN coalesce(%(now)s, now()) END,
        -- A hand-back is not a failed attempt: it does not use up max_attempts.
        attempt = attempt - 1,
        run_at = coalesce(%(now)s, now()),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s, now())
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING id, state, lease_token
),
closed AS (
    UPDATE job_attempts a SET finished_at = coalesce(%(now)s, now()), outcome = 'handed_back'
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
)
SELECT state::text FROM done;

-- name: job_cancel
-- Cancels a pending job at once; on a running job sets the flag its worker sees at the next heartbeat and
-- that its terminal transition honours.
UPDATE jobs SET
    cancel_requested = true,
    state = CASE WHEN state = 'pending' THEN 'cancelled'::job_state ELSE state END,
    terminal_reason = CASE WHEN state = 'pending' THEN %(reason)s ELSE terminal_reason END,
    terminal_by = %(by)s,
    finished_at = CASE WHEN state = 'pending' THEN coalesce(%(now)s, now()) ELSE finished_at END,
    updated_at = coalesce(%(now)s, now())
WHERE id = %(job_id)s AND state IN ('pending', 'running')
RETURNING state::text;

-- name: job_redrive_if_allowed
-- Puts a failed or parked job back to pending with a fresh set of attempts. Succeeded and cancelled jobs
-- are done; an unrecoverable failure needs force. Row lock + WHERE make two racing redrives one.
UPDATE jobs SET
    state = 'pending',
    attempt = 0,
    run_at = coalesce(%(now)s, now()),
    finished_at = NULL,
    terminal_reason = NULL,
    terminal_by = NULL,
    unrecoverable = false,
    cancel_requested = false,
    releases_without_commit = 0,
    committed_since_release = false,
    updated_at = coalesce(%(now)s, now())
WHERE id = %(job_id)s AND state IN ('failed', 'parked') AND (NOT unrecoverable OR %(force)s)
RETURNING id, pg_notify('effectgate_jobs', kind) IS NULL AS notified;

-- name: job_get
-- One job with its effect, for status checks and refusal reasons.
SELECT j.id, j.effect_id, j.tenant, j.kind, j.state::text AS state, j.attempt, j.max_attempts,
       j.orphan_policy, j.run_at, j.lease_token, j.lease_owner, j.lease_expires_at, j.checkpoint,
       j.cancel_requested, j.unrecoverable, j.releases_without_commit, j.last_error, j.terminal_reason,
       j.terminal_by, j.created_at, j.updated_at, j.finished_at, e.effect_key, e.source, e.event_type
FROM jobs j JOIN effects e ON e.id = j.effect_id
WHERE j.id = %(job_id)s;

-- name: job_rescue_expired_leases
-- Reconciler: a running job whose lease expired lost its worker. Re-queue it (orphan_policy redrive) or
-- park it for a human (park); park it as poison after %(poison_threshold)s releases without a commit.
WITH expired AS (
    SELECT id FROM jobs
    WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s, now())
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE jobs j SET
        releases_without_commit = CASE WHEN j.committed_since_release THEN 0 ELSE j.releases_without_commit + 1 END,
        committed_since_release = false,
        state = CASE
            WHEN j.cancel_requested THEN 'cancelled'::job_state
            WHEN NOT j.committed_since_release AND j.releases_without_commit + 1 >= %(poison_threshold)s
                THEN 'parked'::job_state
            WHEN j.orphan_policy = 'redrive' THEN 'pending'::job_state
            ELSE 'parked'::job_state END,
        terminal_reason = CASE
            WHEN j.cancel_requested THEN 'cancelled; its worker lost the lease'
            WHEN NOT j.committed_since_release AND j.releases_without_commit + 1 >= %(poison_threshold)s
                THEN 'poison: orphaned ' || (j.releases_without_commit + 1) || ' times without committing'
            WHEN j.orphan_policy = 'redrive' THEN NULL
            ELSE 'orphaned: lease expired and orphan_policy is park' END,
        terminal_by = CASE WHEN j.orphan_policy = 'redrive' AND NOT j.cancel_requested
                            AND (j.committed_since_release
                                 OR j.releases_without_commit + 1 < %(poison_threshold)s)
                           THEN NULL ELSE 'reconciler' END,
        finished_at = CASE
            WHEN j.orphan_policy = 'redrive' AND NOT j.cancel_requested
             AND (j.committed_since_release OR j.releases_without_commit + 1 < %(poison_threshold)s)
                THEN NULL ELSE coalesce(%(now)s, now()) END,
        run_at = coalesce(%(now)s, now()),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s, now())
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.kind, j.state, j.lease_token
),
closed AS (
    UPDATE job_attempts a SET finished_at = coalesce(%(now)s, now()), outcome = 'lease_expired'
    FROM rescued
    WHERE a.job_id = rescued.id AND a.lease_token = rescued.lease_token
),
woken AS (
    SELECT count(pg_notify('effectgate_jobs', kind)) AS n FROM rescued WHERE state = 'pending'
)
SELECT r.id, r.state::text AS state, (SELECT n FROM woken) AS woken FROM rescued r;

-- name: job_wake_stale_pending
-- Reconciler: due jobs that waited longer than pending_ttl get a fresh wake-up, in case every worker
-- missed the first one (a lost LISTEN connection, a worker that was down).
SELECT count(pg_notify('effectgate_jobs', kind)) AS woken
FROM (
    SELECT DISTINCT kind FROM jobs
    WHERE state = 'pending' AND run_at < coalesce(%(now)s, now()) - make_interval(secs => %(pending_ttl)s)
) stale;

-- name: reconciler_tick_lock
-- One process owns each reconciler pass: a transaction-scoped advisory lock, released at commit.
SELECT pg_try_advisory_xact_lock(%(lock_id)s) AS owned;
