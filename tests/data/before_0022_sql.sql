-- The worker's statements that write job_attempts and steps as this release wrote them before migration 0022
-- (main at d1396ec, verbatim): they name no tenant, which a ledger before 0022 does not have on those tables.
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
