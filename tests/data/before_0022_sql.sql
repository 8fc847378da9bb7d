-- The worker's statements that write job_attempts and steps as this release wrote them before migration 0022
-- (main at d1396ec, verbatim): they name no tenant, which a ledger before 0022 does not have on those tables.
-- The fetch, the finish, retry and hand-back (which close the attempt) and the step statements.
-- Tests that populate such a ledger through the real code paths swap them in (tests/integration/before_0022.py).
-- Never edit them.

-- name: job_fetch_and_lease
-- Leases up to %(limit)s due pending jobs of the given kinds to one worker, each under a new fencing token
-- and its own kind's TTL, and opens an attempt row for each. SKIP LOCKED lets many workers fetch at once
-- without waiting on each other. A job whose lock key a running job holds stays pending, and one batch
-- takes at most one job per lock key: the partial unique index would refuse a second. Paused kinds wait.
--
-- Cost does not grow with the backlog (invariant 13): each kind is read in (run_at, id) order from its own
-- index (jobs_kind_due_idx, migration 0014) and stops after %(limit)s eligible rows, and "is this lock key
-- held?" is one probe of jobs_lock_key_running_unique per row read. The batch is then the earliest
-- %(limit)s across the kinds by (run_at, id): the global order a single scan would give, so no kind is
-- favoured over another (the top %(limit)s of the union are among each kind's own top %(limit)s). Each kind
-- locks up to %(limit)s rows; the ones the merge leaves out are unlocked when the statement commits.
-- A kind's walk is also bounded by %(scan_limit)s rows: a run of due jobs whose lock keys are all held (one
-- hot key with a backlog of its own) would otherwise be walked on every fetch. Past that run the kind
-- leases nothing until the holders finish and the head of the run becomes runnable (docs/performance.md).
-- A versioned job older than its object's newest claimed version is cancelled ('superseded') instead.
WITH kinds AS (
    SELECT k.kind, k.ttl FROM unnest(%(kinds)s::text[], %(ttls)s::float8[]) AS k(kind, ttl)
    -- A paused kind (an operator's `jobs pause`) is not leased; its jobs wait pending.
    WHERE NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = k.kind)
),
candidates AS (
    SELECT c.id, c.tenant, c.kind, c.lock_key, c.version, c.run_at, c.ttl
    FROM kinds k CROSS JOIN LATERAL (
        SELECT j.id, j.tenant, j.kind, j.lock_key, j.version, j.run_at, k.ttl
        FROM (
            -- The walk's bound, on the index alone; the row lock and the recheck are below.
            SELECT w.id, w.run_at FROM jobs w
            WHERE w.kind = k.kind AND w.state = 'pending' AND w.run_at <= coalesce(%(now)s, now())
            ORDER BY w.run_at, w.id
            LIMIT %(scan_limit)s
        ) head
        JOIN jobs j ON j.id = head.id
        WHERE j.state = 'pending'
          AND NOT EXISTS (
              SELECT 1 FROM jobs holder
              WHERE holder.tenant = j.tenant AND holder.lock_key = j.lock_key AND holder.state = 'running'
                AND holder.lock_key IS NOT NULL
          )
        ORDER BY head.run_at, head.id
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) c
    ORDER BY c.run_at, c.id
    LIMIT %(limit)s
),
due AS (
    SELECT id, ttl, kind, superseded FROM (
        SELECT c.id, c.ttl, c.kind, c.lock_key,
               row_number() OVER (PARTITION BY c.tenant, c.lock_key, c.superseded ORDER BY c.run_at, c.id) AS nth,
               c.superseded
        FROM (
            SELECT c.*,
               -- Latest wins (migrations/0020): a newer version of this object was claimed while the job
               -- waited, so it must not run after that one; one primary-key probe per versioned job.
               c.version IS NOT NULL AND EXISTS (
                   SELECT 1 FROM effect_versions v
                   WHERE v.tenant = c.tenant AND v.kind = c.kind AND v.lock_key = c.lock_key
                     AND v.version > c.version
               ) AS superseded
            FROM candidates c
        ) c
    ) c
    -- Every superseded candidate is cancelled, and the first of the others per lock key leased.
    WHERE superseded OR lock_key IS NULL OR nth = 1
),
superseded AS (
    UPDATE jobs j SET
        state = 'cancelled',
        terminal_reason = 'superseded',
        terminal_by = 'ledger',
        finished_at = coalesce(%(now)s, now()),
        updated_at = coalesce(%(now)s, now())
    FROM due
    -- A kind with an on_transition hook (%(hooked)s) ends its superseded jobs in the worker, through the cancel
    -- that runs the hook in its transaction: they stay pending, and their ids are returned below.
    WHERE j.id = due.id AND due.superseded AND NOT due.kind = ANY(%(hooked)s::text[])
    RETURNING j.id
),
leased AS (
    UPDATE jobs j SET
        state = 'running',
        attempt = j.attempt + 1,
        lease_token = j.lease_token + 1,
        lease_owner = %(owner)s,
        lease_expires_at = coalesce(%(now)s, now()) + make_interval(secs => due.ttl),
        updated_at = coalesce(%(now)s, now())
    FROM due
    WHERE j.id = due.id AND NOT due.superseded
    RETURNING j.id, j.effect_id, j.kind, j.tenant, j.attempt, j.max_attempts, j.lease_token, j.checkpoint,
              j.cancel_requested, j.lock_key, j.trace_parent
),
attempt AS (
    INSERT INTO job_attempts (job_id, attempt, lease_token, worker, started_at)
    SELECT id, attempt, lease_token, %(owner)s, coalesce(%(now)s, now()) FROM leased
)
-- At least one row: with nothing leased, one row of NULLs still says how many were superseded (the caller then
-- fetches again rather than wait for a wake-up that the superseded jobs' claims already spent).
SELECT l.*, e.effect_key, e.source, e.event_id, e.event_type, e.payload,
       EXISTS (SELECT 1 FROM steps s WHERE s.effect_id = l.effect_id) AS has_steps, n.superseded, n.to_supersede
FROM (SELECT (SELECT count(*) FROM superseded) AS superseded,
             (SELECT array_agg(id ORDER BY id) FROM due
              WHERE superseded AND kind = ANY(%(hooked)s::text[])) AS to_supersede) n
     LEFT JOIN (leased l JOIN effects e ON e.id = l.effect_id) ON true
ORDER BY l.id;

-- name: job_finish_if_leased
-- The one terminal transition a worker makes (succeeded, failed or parked), for many jobs at once, each row
-- fenced by its own token: a stale row changes nothing and is missing from the answer, the others go through.
-- A cancel requested while a job ran wins in this same statement, so a cancelled job is never reported
-- succeeded. Rows are locked in id order, so two batches sharing jobs cannot deadlock (a heartbeat skips a
-- locked row rather than wait for it). The caller makes every value storable first; a batch Postgres still
-- refuses for one row's data is split by ``jobs.finish_many`` until that row stands alone.
WITH input AS (
    SELECT * FROM unnest(%(job_ids)b::bigint[], %(lease_tokens)b::bigint[], %(states)b::text[], %(bys)b::text[],
                         %(reasons)b::text[], %(errors)b::text[], %(unrecoverables)b::bool[])
        AS i(job_id, lease_token, state, by, reason, error, unrecoverable)
),
held AS (
    SELECT i.*
    FROM jobs j JOIN input i ON j.id = i.job_id AND j.lease_token = i.lease_token
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
),
done AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE held.state::job_state END,
        terminal_reason = CASE WHEN j.cancel_requested THEN 'cancelled while running' ELSE held.reason END,
        terminal_by = CASE WHEN j.cancel_requested THEN coalesce(j.terminal_by, 'operator') ELSE held.by END,
        last_error = coalesce(held.error::jsonb, j.last_error),
        unrecoverable = held.unrecoverable AND NOT j.cancel_requested,
        lease_owner = NULL,
        lease_expires_at = NULL,
        finished_at = coalesce(%(now)s, now()),
        updated_at = coalesce(%(now)s, now())
    FROM held
    WHERE j.id = held.job_id
    RETURNING j.id, j.state, j.terminal_reason, j.lease_token, held.error::jsonb AS error
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = coalesce(%(now)s, now()),
        outcome = done.state::text,
        error_type = done.error ->> 'type',
        error_message = done.error ->> 'message',
        traceback = done.error ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
)
SELECT id AS job_id, state::text AS state, terminal_reason FROM done;

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
        last_error = %(error)s::jsonb,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s, now())
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING id, kind, state, terminal_reason, lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = coalesce(%(now)s, now()),
        outcome = CASE WHEN done.state = 'pending' THEN 'retry' ELSE done.state::text END,
        error_type = %(error)s::jsonb ->> 'type',
        error_message = %(error)s::jsonb ->> 'message',
        traceback = %(error)s::jsonb ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
),
woken AS (
    -- A retry due at once (no backoff) must not wait for the next poll.
    SELECT count(pg_notify('effectgate_jobs', kind)) AS n FROM done WHERE state = 'pending' AND %(delay)s <= 0
)
SELECT state::text AS state, terminal_reason, (SELECT n FROM woken) AS woken FROM done;

-- name: job_hand_back_if_leased
-- A slice spent its budget and hands the rest back: re-queued at once, lease released, fenced by the token.
-- A hand-back is progress only if something was committed since the last release; after
-- %(poison_threshold)s releases in a row without one, the job is parked as poison.
WITH held AS (
    -- The release rule (migration 0006, _v1 since 0017) is shared with the lease rescuer; a hand-back's "orphan policy"
    -- is always to re-queue.
    SELECT id,
           job_release_verdict_v1(cancel_requested, committed_since_release, releases_without_commit,
                                  %(poison_threshold)s, 'redrive') AS verdict,
           job_release_count_v1(committed_since_release, releases_without_commit) AS releases
    FROM jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    FOR UPDATE
),
done AS (
    UPDATE jobs j SET
        releases_without_commit = held.releases,
        committed_since_release = false,
        state = CASE held.verdict WHEN 'cancelled' THEN 'cancelled' WHEN 'poison' THEN 'parked'
                                  ELSE 'pending' END::job_state,
        terminal_reason = CASE held.verdict
            WHEN 'cancelled' THEN 'cancelled while running'
            WHEN 'poison' THEN 'poison: handed back ' || held.releases || ' times without committing'
            END,
        terminal_by = CASE held.verdict WHEN 'cancelled' THEN coalesce(j.terminal_by, 'operator')
                                        WHEN 'poison' THEN %(by)s END,
        finished_at = CASE WHEN held.verdict <> 'redrive' THEN coalesce(%(now)s, now()) END,
        -- A hand-back is not a failed attempt: it does not use up max_attempts.
        attempt = j.attempt - 1,
        run_at = coalesce(%(now)s, now()),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s, now())
    FROM held
    WHERE j.id = held.id
    RETURNING j.id, j.kind, j.state, j.terminal_reason, j.lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = coalesce(%(now)s, now()),
        outcome = CASE WHEN done.state = 'pending' THEN 'handed_back' ELSE done.state::text END
    FROM done
    WHERE a.job_id = done.id AND a.lease_token = done.lease_token
),
woken AS (
    SELECT count(pg_notify('effectgate_jobs', kind)) AS n FROM done WHERE state = 'pending'
)
SELECT state::text AS state, terminal_reason, (SELECT n FROM woken) AS woken FROM done;

-- name: steps_for_effect
-- Every recorded step of an effect: what a later attempt returns instead of calling again.
SELECT name, idempotency_key, status, result, error, job_id, lease_token, recorded_at
FROM steps WHERE effect_id = %(effect_id)s
ORDER BY recorded_at, name;

-- name: step_record_if_leased
-- Records a step's outcome, only for the holder of the current token; the primary key refuses a second
-- recording of the same name. A 'started' marker (step_start_if_leased) is the one row an outcome replaces.
WITH lease AS (
    UPDATE jobs SET committed_since_release = true, updated_at = coalesce(%(now)s, now())
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING id, effect_id
),
recorded AS (
    INSERT INTO steps (effect_id, name, idempotency_key, status, result, error, job_id, lease_token, recorded_at)
    SELECT effect_id, %(name)s, %(idempotency_key)s, %(status)s, %(result)s, %(error)s, id, %(lease_token)s,
           coalesce(%(now)s, now())
    FROM lease
    ON CONFLICT (effect_id, name) DO UPDATE SET
        idempotency_key = EXCLUDED.idempotency_key, status = EXCLUDED.status, result = EXCLUDED.result,
        error = EXCLUDED.error, job_id = EXCLUDED.job_id, lease_token = EXCLUDED.lease_token,
        recorded_at = EXCLUDED.recorded_at
    WHERE steps.status = 'started'
    RETURNING name
)
SELECT (SELECT count(*) FROM lease) AS leased, (SELECT count(*) FROM recorded) AS recorded;

-- name: step_start_if_leased
-- Marks a step 'started' before its downstream call, only for the holder of the current token: the commit a
-- later attempt reads as "the call may have reached the API". It locks the job row (a reclaim cannot slip in
-- between the check and the commit) but is not progress: a step that crashes its worker every time must
-- still count towards poison. Re-marking by a later attempt moves the marker to that attempt; an outcome
-- already recorded is left alone and reported.
WITH lease AS (
    SELECT id, effect_id FROM jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    FOR NO KEY UPDATE
),
marked AS (
    INSERT INTO steps (effect_id, name, idempotency_key, status, job_id, lease_token, recorded_at)
    SELECT effect_id, %(name)s, %(idempotency_key)s, 'started', id, %(lease_token)s, coalesce(%(now)s, now())
    FROM lease
    ON CONFLICT (effect_id, name) DO UPDATE SET
        job_id = EXCLUDED.job_id, lease_token = EXCLUDED.lease_token, recorded_at = EXCLUDED.recorded_at
    WHERE steps.status = 'started'
    RETURNING name
)
SELECT (SELECT count(*) FROM lease) AS leased, (SELECT count(*) FROM marked) AS marked;
