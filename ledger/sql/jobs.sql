-- name: job_fetch_and_lease
-- Leases up to %(limit)s due pending jobs of the given kinds to one worker, each under a new random fencing
-- token and its own kind's TTL, and opens an attempt row for each. SKIP LOCKED lets many workers fetch at once
-- without waiting on each other. A job whose lock key a running job holds stays pending, and one batch
-- takes at most one job per lock key: the partial unique index would refuse a second. Paused kinds wait.
--
-- Cost does not grow with the backlog (invariant 13): each kind is read in (run_at, id) order from its own
-- index (jobs_kind_due_tenant_idx, migrations 0014 and 0026; for one tenant on Citus jobs_tenant_kind_due_idx,
-- deploy/citus/distribute.sql, so a tenant's walk never reads a shard-neighbour's rows) and stops after
-- %(limit)s eligible rows, and "is this lock key held?" is one probe of jobs_lock_key_running_unique per row read. The batch is then the earliest
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
            SELECT w.id, w.tenant, w.run_at FROM jobs w
            WHERE w.kind = k.kind AND w.state = 'pending' AND w.run_at <= (SELECT coalesce(%(now)s, now()))
              AND (%(tenant)s::text IS NULL OR w.tenant = %(tenant)s)
            ORDER BY w.run_at, w.id
            LIMIT %(scan_limit)s
        ) head
        -- By the whole primary key (id, tenant): on id alone, a planner without statistics yet (a new ledger's
        -- first backlog, before autovacuum's first ANALYZE) probed the partial due index with a skip scan,
        -- an index search per distinct (kind, run_at) rather than per row (docs/performance.md, "The worker's plans").
        JOIN jobs j ON j.id = head.id AND j.tenant = head.tenant
        WHERE j.state = 'pending' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
          AND NOT EXISTS (
              SELECT 1 FROM jobs holder
              WHERE holder.tenant = j.tenant AND holder.lock_key = j.lock_key AND holder.state = 'running'
                AND holder.lock_key IS NOT NULL AND (%(tenant)s::text IS NULL OR holder.tenant = %(tenant)s)
          )
        ORDER BY head.run_at, head.id
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) c
    ORDER BY c.run_at, c.id
    LIMIT %(limit)s
),
due AS (
    -- The expiry is computed here, in a read: Citus refuses a STABLE expression over a column (timestamptz +
    -- interval) in an UPDATE's SET (deploy/README.md, "Past one Postgres"). So is the new token (VOLATILE).
    --
    -- Each acquisition's token is random, 1 to 2^62, not the last one + 1: after a failover to a standby that
    -- had not received the last WAL, a job's row may be back at an earlier state, and a counter would hand
    -- the next holder the very token the lost holder (a worker still alive, still writing) holds, so the fence
    -- could not tell them apart. A random token repeats with odds of about one in 2^62. Below 2^62, so a
    -- previous release's `lease_token + 1` during a rolling upgrade cannot overflow.
    SELECT id, tenant, ttl, kind, superseded,
           (SELECT coalesce(%(now)s, now())) + make_interval(secs => ttl) AS expires_at,
           1 + (random() * 4.6e18)::bigint AS token
    FROM (
        SELECT c.id, c.tenant, c.ttl, c.kind, c.lock_key,
               row_number() OVER (PARTITION BY c.tenant, c.lock_key, c.superseded ORDER BY c.run_at, c.id) AS nth,
               c.superseded
        FROM (
            SELECT c.*,
               -- Latest wins (migrations/0020): a newer version of this object was claimed while the job
               -- waited, so it must not run after that one; one primary-key probe per versioned job.
               c.version IS NOT NULL AND EXISTS (
                   SELECT 1 FROM effect_versions v
                   WHERE v.tenant = c.tenant AND v.kind = c.kind AND v.lock_key = c.lock_key
                     AND v.version > c.version AND (%(tenant)s::text IS NULL OR v.tenant = %(tenant)s)
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
        finished_at = (SELECT coalesce(%(now)s, now())),
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM due
    -- A kind with an on_transition hook (%(hooked)s) ends its superseded jobs in the worker, through the cancel
    -- that runs the hook in its transaction: they stay pending, and their ids are returned below.
    WHERE j.id = due.id AND j.tenant = due.tenant AND due.superseded AND NOT due.kind = ANY(%(hooked)s::text[])
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id
),
leased AS (
    UPDATE jobs j SET
        state = 'running',
        attempt = j.attempt + 1,
        lease_token = due.token,
        lease_owner = %(owner)s,
        lease_expires_at = due.expires_at,
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM due
    WHERE j.id = due.id AND j.tenant = due.tenant AND NOT due.superseded
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.effect_id, j.kind, j.tenant, j.attempt, j.max_attempts, j.lease_token, j.checkpoint,
              j.cancel_requested, j.lock_key, j.trace_parent
),
-- On Citus this CTE is cut out (ledger/jobs/leases.py, _ROUTED_FETCH): an INSERT ... SELECT from a CTE makes Citus
-- plan every CTE as a subplan of its own, where without it the fetch is one router task; the attempts are then
-- opened by job_attempt_open in the same transaction.
attempt AS (
    INSERT INTO job_attempts (job_id, tenant, attempt, lease_token, worker, started_at)
    SELECT id, tenant, attempt, lease_token, %(owner)s, (SELECT coalesce(%(now)s, now())) FROM leased
)
-- At least one row: with nothing leased, one row of NULLs still says how many were superseded (the caller then
-- fetches again rather than wait for a wake-up that the superseded jobs' claims already spent).
SELECT l.*, e.effect_key, e.source, e.event_id, e.event_type, e.payload,
       EXISTS (SELECT 1 FROM steps s WHERE s.effect_id = l.effect_id AND s.tenant = l.tenant
                                          AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)) AS has_steps,
       n.superseded, n.to_supersede
FROM (SELECT (SELECT count(*) FROM superseded) AS superseded,
             (SELECT array_agg(id ORDER BY id) FROM due
              WHERE superseded AND kind = ANY(%(hooked)s::text[])) AS to_supersede) n
     LEFT JOIN (leased l JOIN effects e ON e.id = l.effect_id AND e.tenant = l.tenant
                                           AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)) ON true
ORDER BY l.id;

-- name: job_attempt_open
-- Leasing on Citus: opens the attempt row of one job the routed fetch leased (one row per statement, a router
-- INSERT to the tenant's shard; sent for a whole fetch at once with executemany, in the fetch's transaction).
INSERT INTO job_attempts (job_id, tenant, attempt, lease_token, worker, started_at)
VALUES (%(job_id)s, %(tenant)s, %(attempt)s, %(lease_token)s, %(owner)s, coalesce(%(now)s, now()));

-- name: job_tenants_due
-- Leasing on Citus (jobs.fetch_and_lease with per_tenant), the cheap first read: the tenants of the earliest %(limit)s
-- due pending jobs of the worker's kinds (those job_tenants_due_prepare found not paused), one row per job, earliest
-- first (the caller keeps each tenant's first). It is the answer when its rows are %(limit)s distinct tenants, or fewer
-- than %(limit)s rows (every due job seen); when a tenant holds several of the earliest rows (a hot tenant's backlog
-- holds them all), tenants behind it would be starved, so the caller asks job_tenants_due_on_shard instead. A read
-- without a lock, so Citus runs it on every shard; the fetch then leases each tenant's jobs with job_fetch_and_lease
-- restricted to that tenant, one routed statement each. A plain ORDER BY ... LIMIT with no subquery, so Citus pushes
-- both into each shard's plan (a walk of jobs_due_idx that stops after %(limit)s rows): grouped by tenant in SQL,
-- each shard sorted every due row (70 ms at 10^5 due jobs), and a subquery for the clock or the paused kinds is a
-- distributed subplan sent to every shard (50-80 ms against 5-13 ms on the cluster here).
-- A lost node fails it: then job_tenants_due_on_shard too (ledger/shards.py).
SELECT w.tenant FROM jobs w
WHERE w.state = 'pending' AND w.run_at <= coalesce(%(now)s::timestamptz, now()) AND w.kind = ANY(%(kinds)s::text[])
ORDER BY w.run_at, w.id
LIMIT %(limit)s;

-- name: job_tenants_due_on_shard
-- Fair discovery, one shard's part (ledger/shards.py runs it on every shard a node answers for): up to the limit
-- distinct tenants with due pending jobs of the kinds, ordered by each tenant's oldest due job, so a tenant's
-- backlog, however large, takes one place. %1$s the jobs shard, %3$L the parameters; the kinds come without the
-- paused ones (job_tenants_due_prepare). A loose index scan on jobs_tenant_kind_due_idx (deploy/citus/
-- distribute.sql): one probe for the next tenant with a pending job, then one per kind for its oldest due job, so
-- its cost grows with the tenants that have pending jobs in the shard, never with their jobs. Recursive, which Citus
-- refuses in a statement over many shards; here each shard's read is plain PostgreSQL on its node.
WITH RECURSIVE tenants AS (
    (SELECT s.tenant FROM %1$s s WHERE s.state = 'pending' ORDER BY s.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT s.tenant FROM %1$s s WHERE s.state = 'pending' AND s.tenant > t.tenant ORDER BY s.tenant LIMIT 1)
    FROM tenants t WHERE t.tenant IS NOT NULL
)
SELECT t.tenant, d.run_at AS at, d.id
FROM tenants t CROSS JOIN LATERAL (
    SELECT h.run_at, h.id
    FROM unnest(ARRAY(SELECT jsonb_array_elements_text(%3$L::jsonb -> 'kinds'))) AS k(kind)
    CROSS JOIN LATERAL (
        -- The tenant's oldest pending job of the kind is the first entry at or past (tenant, kind); it is due or
        -- nothing of theirs is. Asked as a row comparison in the index's whole order, which only the tenant-keyed
        -- index answers without a sort: asked as tenant = .. AND kind = .. ORDER BY run_at, id, the planner took
        -- jobs_due_idx for a neighbour, whose tenant the statistics put beside a hot tenant's, and walked the hot
        -- tenant's rows to find the neighbour's first (66,668 rows, tests/citus/test_hot_tenant.py).
        SELECT j.tenant, j.kind, j.run_at, j.id FROM %1$s j
        WHERE j.state = 'pending' AND (j.tenant, j.kind) >= (t.tenant, k.kind)
        ORDER BY j.tenant, j.kind, j.run_at, j.id
        LIMIT 1
    ) h
    WHERE h.tenant = t.tenant AND h.kind = k.kind AND h.run_at <= (%3$L::jsonb ->> 'now')::timestamptz
    ORDER BY h.run_at, h.id
    LIMIT 1
) d
ORDER BY d.run_at, d.id
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: job_tenants_due_one_node
-- Fair discovery on one Postgres (jobs.fetch_and_lease with per_tenant where jobs is not distributed: the tests that
-- keep the Citus path covered in CI; a worker on one node fetches in one statement and never asks this): the same
-- answer as job_tenants_due_on_shard, up to %(limit)s tenants by each one's oldest due job. Grouped over every due
-- row, on purpose: one node has no tenant-keyed index to step over (deploy/citus/distribute.sql makes it).
SELECT w.tenant FROM jobs w
WHERE w.state = 'pending' AND w.run_at <= coalesce(%(now)s::timestamptz, now()) AND w.kind = ANY(%(kinds)s::text[])
GROUP BY w.tenant
ORDER BY min(w.run_at), min(w.id)
LIMIT %(limit)s;

-- name: job_tenants_due_prepare
-- Before job_tenants_due, in its transaction, on the coordinator alone: which of %(kinds)s are not paused, and how
-- long a statement of the transaction waits for a worker node's connection (Citus's default is 30 s, for which a
-- node that drops packets instead of refusing them would hold every fetch). paused_kinds is a reference table with
-- a copy on the coordinator: read here, the reads over the shards need not join it (joined, each shard sorted all
-- its due rows of the kinds; as a subquery, it is a distributed subplan sent to every shard).
SELECT array(
    SELECT k.kind FROM unnest(%(kinds)s::text[]) AS k(kind)
    WHERE NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = k.kind)
) AS kinds, set_config('citus.node_connection_timeout', %(timeout_ms)s, true) AS node_connection_timeout;

-- name: jobs_distributed_citus
-- Whether the Citus extension is installed here (ledger/topology.py: how statements route).
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS citus;

-- name: jobs_distributed_table
-- Whether jobs (on the search_path) is a Citus distributed table; asked only where Citus is installed.
SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass) AS distributed;

-- name: lease_extend_if_held
-- Heartbeat for many leases at once: each pushed out by its own TTL, only where its token still holds. A row
-- that another transaction holds locked right now (this job's own fenced write, an operator's bulk action) is
-- skipped, never waited for: one slow writer must not stall every other lease's heartbeat past its TTL. So
-- each answer row is either extended (with whether a cancel was asked) or busy (locked, and its token still
-- held at the last commit: neither extended nor lost, ask again shortly); a lease missing from the answer is
-- lost. SKIP LOCKED never waits, so a heartbeat cannot deadlock with the terminal transitions either.
WITH asked AS (
    SELECT * FROM unnest(%(job_ids)b::bigint[], %(lease_tokens)b::bigint[], %(ttls)b::float8[])
        AS h(job_id, lease_token, ttl)
),
held AS (
    -- The expiry is computed in this read: Citus refuses a STABLE expression over a column in an UPDATE's SET.
    SELECT j.id, (SELECT coalesce(%(now)s, now())) + make_interval(secs => a.ttl) AS expires_at
    FROM jobs j JOIN asked a ON j.id = a.job_id AND j.lease_token = a.lease_token
    WHERE j.state = 'running' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
),
extended AS (
    UPDATE jobs j SET
        lease_expires_at = held.expires_at,
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM held
    WHERE j.id = held.id AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.cancel_requested
)
SELECT id, cancel_requested, false AS busy FROM extended
UNION ALL
-- Read from the statement's snapshot, without a lock: a row skipped above whose token held at the last
-- commit. If the locker is taking the lease away, the next heartbeat finds it lost.
SELECT j.id, false, true
FROM jobs j JOIN asked a ON j.id = a.job_id AND j.lease_token = a.lease_token
WHERE j.state = 'running' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s) AND NOT EXISTS (SELECT 1 FROM held WHERE held.id = j.id);

-- name: lease_abandon_if_held
-- A stopping worker gives up leases it can no longer use, only where its token still holds: the lease
-- expires now, so the lease rescuer of any process applies the release rule (orphan policy, poison count,
-- an asked-for cancel) at its next tick instead of after the TTL. Nothing else of the row changes.
UPDATE jobs j SET lease_expires_at = (SELECT coalesce(%(now)s, now())), updated_at = (SELECT coalesce(%(now)s, now()))
FROM unnest(%(job_ids)b::bigint[], %(lease_tokens)b::bigint[]) AS a(job_id, lease_token)
WHERE j.id = a.job_id AND j.lease_token = a.lease_token AND j.state = 'running' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
RETURNING j.id;

-- name: lease_hold_if_leased
-- Locks the job row for the rest of the caller's transaction, only for the holder of the current token:
-- a reclaim cannot interleave with a fenced write, and the write counts as committed progress.
UPDATE jobs SET committed_since_release = true
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
RETURNING id;

-- name: checkpoint_save_if_leased
-- Commits a resume point, only for the holder of the current token.
UPDATE jobs SET
    checkpoint = %(checkpoint)s,
    committed_since_release = true,
    updated_at = (SELECT coalesce(%(now)s, now()))
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
RETURNING id;

-- name: job_finish_if_leased
-- The one terminal transition a worker makes (succeeded, failed or parked), for many jobs at once, each row
-- fenced by its own token: a stale row changes nothing and is missing from the answer, the others go through.
-- A cancel requested while a job ran wins in this same statement, so a cancelled job is never reported
-- succeeded. Rows are locked in id order, so two batches sharing jobs cannot deadlock (a heartbeat skips a
-- locked row rather than wait for it). The caller makes every value storable first; a batch Postgres still
-- refuses for one row's data is split by ``jobs.finish_many`` until that row stands alone.
WITH input AS (
    -- The states cast to job_state here, on the parameter: Citus refuses a STABLE cast (text to an enum) of a
    -- column inside CASE in an UPDATE.
    SELECT * FROM unnest(%(job_ids)b::bigint[], %(tenants)b::text[], %(lease_tokens)b::bigint[],
                         %(states)b::text[]::job_state[], %(bys)b::text[],
                         %(reasons)b::text[], %(errors)b::text[], %(unrecoverables)b::bool[])
        AS i(job_id, tenant, lease_token, state, by, reason, error, unrecoverable)
),
held AS (
    -- Each row by its whole primary key (id, tenant) and token, and its state read once it is locked (the
    -- row's latest version): with "state = 'running'" here, a planner without statistics for jobs (a new
    -- ledger's first backlog) probed the partial lease-expiry index, with a skip scan over every lease it
    -- still held entries for, instead of the primary key (docs/performance.md, "The worker's plans").
    SELECT i.*, j.state AS held_state
    FROM jobs j JOIN input i ON j.id = i.job_id AND j.tenant = i.tenant AND j.lease_token = i.lease_token
    WHERE (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    ORDER BY j.id
    FOR UPDATE OF j
),
done AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE held.state END,
        terminal_reason = CASE WHEN j.cancel_requested THEN 'cancelled while running' ELSE held.reason END,
        terminal_by = CASE WHEN j.cancel_requested THEN coalesce(j.terminal_by, 'operator') ELSE held.by END,
        last_error = coalesce(held.error::jsonb, j.last_error),
        unrecoverable = held.unrecoverable AND NOT j.cancel_requested,
        lease_owner = NULL,
        lease_expires_at = NULL,
        finished_at = (SELECT coalesce(%(now)s, now())),
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM held
    -- Only a job still running under the token: a stale token's row, or one a reclaim moved on, is unchanged.
    WHERE j.id = held.job_id AND j.tenant = held.tenant AND held.held_state = 'running'
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.tenant, j.state, j.terminal_reason, j.lease_token, held.error::jsonb AS error
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = (SELECT coalesce(%(now)s, now())),
        -- What the job's new state makes of the attempt (migration 0028, the three attempt-closing statements' one rule).
        outcome = job_attempt_outcome_v1(done.state, 'pending'),
        error_type = done.error ->> 'type',
        error_message = done.error ->> 'message',
        -- The rest of the record (code, HTTP status, the provider's request id, decline code), where known.
        error_facts = nullif(jsonb_strip_nulls(done.error - 'type' - 'message' - 'traceback'), '{}'::jsonb),
        traceback = done.error ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.tenant = done.tenant AND a.lease_token = done.lease_token
      AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
)
SELECT id AS job_id, state::text AS state, terminal_reason FROM done;

-- name: job_retry_if_leased
-- Gives the job back for another attempt at run_at = now + delay, fenced by the token; a pending cancel
-- ends it cancelled instead.
WITH held AS (
    -- The clock read here, in a read: Citus refuses a non-IMMUTABLE call inside CASE in an UPDATE, and cannot
    -- evaluate a sub-select inside a larger expression there.
    SELECT id, (SELECT coalesce(%(now)s, now())) AS now,
           (SELECT coalesce(%(now)s, now())) + make_interval(secs => %(delay)s) AS run_at
    FROM jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    FOR UPDATE
),
done AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE 'pending'::job_state END,
        terminal_reason = CASE WHEN j.cancel_requested THEN 'cancelled while running' END,
        terminal_by = CASE WHEN j.cancel_requested THEN coalesce(j.terminal_by, 'operator') END,
        finished_at = CASE WHEN j.cancel_requested THEN held.now END,
        run_at = held.run_at,
        last_error = %(error)s::jsonb,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM held
    WHERE j.id = held.id AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.tenant, j.kind, j.state, j.terminal_reason, j.lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = (SELECT coalesce(%(now)s, now())),
        outcome = job_attempt_outcome_v1(done.state, 'retry'),
        error_type = %(error)s::jsonb ->> 'type',
        error_message = %(error)s::jsonb ->> 'message',
        error_facts = nullif(jsonb_strip_nulls(%(error)s::jsonb - 'type' - 'message' - 'traceback'), '{}'::jsonb),
        traceback = %(error)s::jsonb ->> 'traceback'
    FROM done
    WHERE a.job_id = done.id AND a.tenant = done.tenant AND a.lease_token = done.lease_token
      AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
),
woken AS (
    -- A retry due at once (no backoff) must not wait for the next poll. On Citus this statement runs whole on
    -- the tenant's worker node, where nobody listens: jobs.retry(per_tenant=True) wakes from the coordinator.
    SELECT count(pg_notify('effectgate_jobs', kind)) AS n FROM done WHERE state = 'pending' AND %(delay)s <= 0
)
SELECT state::text AS state, terminal_reason, kind, (SELECT n FROM woken) AS woken FROM done;

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
           job_release_count_v1(committed_since_release, releases_without_commit) AS releases,
           -- The clock read here: Citus refuses a non-IMMUTABLE call inside CASE in an UPDATE.
           (SELECT coalesce(%(now)s, now())) AS now
    FROM jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    FOR UPDATE
),
done AS (
    UPDATE jobs j SET
        releases_without_commit = held.releases,
        committed_since_release = false,
        state = CASE WHEN held.verdict = 'cancelled' THEN 'cancelled'::job_state WHEN held.verdict = 'poison' THEN 'parked'::job_state
                                  ELSE 'pending'::job_state END,
        terminal_reason = CASE
            WHEN held.verdict = 'cancelled' THEN 'cancelled while running'
            WHEN held.verdict = 'poison' THEN 'poison: handed back ' || held.releases || ' times without committing'
            END,
        terminal_by = CASE WHEN held.verdict = 'cancelled' THEN coalesce(j.terminal_by, 'operator')
                                        WHEN held.verdict = 'poison' THEN %(by)s END,
        finished_at = CASE WHEN held.verdict <> 'redrive' THEN held.now END,
        -- A hand-back is not a failed attempt: it does not use up max_attempts.
        attempt = j.attempt - 1,
        run_at = (SELECT coalesce(%(now)s, now())),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = (SELECT coalesce(%(now)s, now()))
    FROM held
    WHERE j.id = held.id AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.tenant, j.kind, j.state, j.terminal_reason, j.lease_token
),
closed AS (
    UPDATE job_attempts a SET
        finished_at = (SELECT coalesce(%(now)s, now())),
        outcome = job_attempt_outcome_v1(done.state, 'handed_back')
    FROM done
    WHERE a.job_id = done.id AND a.tenant = done.tenant AND a.lease_token = done.lease_token
      AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
),
woken AS (
    SELECT count(pg_notify('effectgate_jobs', kind)) AS n FROM done WHERE state = 'pending'
)
SELECT state::text AS state, terminal_reason, (SELECT n FROM woken) AS woken FROM done;

-- name: job_cancel
-- Cancels a pending job at once; on a running job sets the flag its worker sees at the next heartbeat and
-- that its terminal transition honours. %(tenant)s: the job's, on a ledger distributed by tenant (NULL on one
-- node), so Citus routes it; the clock is read in `held`, as Citus refuses now() in an UPDATE's CASE.
WITH held AS (
    SELECT id, (SELECT coalesce(%(now)s, now())) AS now FROM jobs
    WHERE id = %(job_id)s AND state IN ('pending', 'running') AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    -- The lock an UPDATE of these columns takes (no key changes): a child row's foreign-key check does not wait.
    FOR NO KEY UPDATE
)
UPDATE jobs j SET
    cancel_requested = true,
    state = CASE WHEN j.state = 'pending' THEN 'cancelled'::job_state ELSE j.state END,
    terminal_reason = CASE WHEN j.state = 'pending' THEN %(reason)s ELSE j.terminal_reason END,
    terminal_by = %(by)s,
    finished_at = CASE WHEN j.state = 'pending' THEN held.now ELSE j.finished_at END,
    updated_at = held.now
FROM held
WHERE j.id = held.id AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
RETURNING j.state;

-- name: job_redrive_if_allowed
-- Puts a failed or parked job back to pending with a fresh set of attempts. Succeeded and cancelled jobs
-- are done; an unrecoverable failure, or a step's recorded terminal error, needs force; a lock key another live
-- job holds refuses it; a job whose payload retention purged cannot run again. The row
-- lock and the WHERE clause make two racing redrives one: the second re-reads a pending row and matches
-- nothing. %(tenant)s as job_cancel. No NOTIFY here: job_admin.redrive wakes the workers after the commit, from
-- the caller's session (on Citus a pg_notify in this statement made it a distributed subplan run on the
-- coordinator, and the workers heard each redrive twice). The clock is read in `held`, as job_cancel reads it:
-- in the UPDATE itself Citus planned it as a subplan and sent the update to all 32 shards.
WITH held AS (
    SELECT id, (SELECT coalesce(%(now)s, now())) AS now FROM jobs
    WHERE id = %(job_id)s AND state IN ('failed', 'parked') AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    -- The lock an UPDATE of these columns takes (no key changes): a child row's foreign-key check does not wait.
    FOR NO KEY UPDATE
)
UPDATE jobs j SET
    state = 'pending',
    attempt = 0,
    run_at = held.now,
    finished_at = NULL,
    terminal_reason = NULL,
    terminal_by = NULL,
    unrecoverable = false,
    cancel_requested = false,
    releases_without_commit = 0,
    committed_since_release = false,
    updated_at = held.now
FROM held
WHERE j.id = held.id AND j.state IN ('failed', 'parked') AND (NOT j.unrecoverable OR %(force)s)
  -- A step that recorded a terminal error (a decline) is replayed, not called, by the next run: without
  -- force the redrive would only fail again the same way.
  AND (%(force)s OR NOT EXISTS (
      SELECT 1 FROM steps s
      WHERE s.effect_id = j.effect_id AND s.tenant = j.tenant AND s.status = 'failed'
        AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)
  ))
  AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
  -- Retention purged what it would run on (payload, recorded steps): a redrive could repeat a step.
  AND NOT j.payload_purged
  AND NOT EXISTS (
      SELECT 1 FROM jobs holder
      WHERE holder.tenant = j.tenant AND holder.lock_key = j.lock_key AND holder.id <> j.id
        AND holder.state IN ('pending', 'running') AND (%(tenant)s::text IS NULL OR holder.tenant = %(tenant)s)
  )
RETURNING j.id, j.kind;

-- name: job_tenant_get
-- The tenant of one job, by id alone (on Citus a read of every shard): what routes an operator's write to it.
SELECT tenant FROM jobs WHERE id = %(job_id)s;

-- name: job_tenants_get
-- The tenants of many jobs, by id alone (on Citus a read of every shard): what a terminal transition asked
-- for without its tenant (a caller other than the worker, which always has it) is matched on.
SELECT id, tenant FROM jobs WHERE id = ANY(%(job_ids)s::bigint[]);

-- name: job_get
-- One job with its effect, and the live job (if any) holding its lock key, for status and refusal reasons.
SELECT j.id, j.effect_id, j.tenant, j.kind, j.state::text AS state, j.attempt, j.max_attempts,
       j.orphan_policy, j.run_at, j.lease_token, j.lease_owner, j.lease_expires_at, j.checkpoint,
       j.cancel_requested, j.unrecoverable, j.releases_without_commit, j.committed_since_release,
       j.last_error, j.terminal_reason, j.terminal_by, j.created_at, j.updated_at, j.finished_at, j.lock_key,
       j.payload_purged, j.resolved_from::text AS resolved_from, j.resolved_at, j.resolved_by, j.resolved_reason,
       (SELECT holder.id FROM jobs holder
        WHERE holder.tenant = j.tenant AND holder.lock_key = j.lock_key AND holder.id <> j.id
          AND holder.state IN ('pending', 'running')
        ORDER BY holder.state = 'running' DESC, holder.id
        LIMIT 1) AS lock_key_held_by,
       e.effect_key, e.source, e.event_type
FROM jobs j JOIN effects e ON e.id = j.effect_id AND e.tenant = j.tenant
WHERE j.id = %(job_id)s;

-- name: job_attempts_for_job
-- Every attempt of a job, oldest first: who ran it under which token, and how it ended. By start, not token:
-- tokens are random (job_fetch_and_lease).
SELECT job_id, attempt, lease_token, worker, started_at, finished_at, outcome, error_type, error_message,
       error_facts, traceback
FROM job_attempts WHERE job_id = %(job_id)s
ORDER BY started_at, attempt, lease_token;

-- name: job_tenants_stale_pending_on_shard
-- Pending waker on Citus, one shard's read (ledger/shards.py): %1$s the jobs shard, %3$L the parameters. The
-- tenants of the shard's earliest due jobs pending past the shortest TTL (a superset of the stale ones); each
-- tenant is then woken by job_wake_stale_pending, which applies each kind's own TTL.
SELECT tenant, run_at AS at, id FROM %1$s
WHERE state = 'pending'
  AND run_at < (%3$L::jsonb ->> 'now')::timestamptz - make_interval(secs => (%3$L::jsonb ->> 'pending_ttl')::float8)
ORDER BY run_at, id
LIMIT (%3$L::jsonb ->> 'limit')::int;

-- name: job_wake_stale_pending
-- Reconciler: due jobs that waited longer than their kind's pending_ttl get a fresh wake-up, in case every
-- worker missed the first one (a lost LISTEN connection, a worker that was down). updated_at marks the
-- wake-up, so a job nobody can run is woken once per pending_ttl, not on every tick.
-- Its walk of jobs_due_idx stops at the shortest TTL's cutoff: no job due after it can be stale (run_at is at
-- most greatest(run_at, updated_at)), and without the bound the walk read every pending job on every tick
-- when none was stale yet — the fresh backlog of the day after an outage (docs/performance.md). The woken rows
-- are updated by id (= ANY of an array): joined to the CTE, the planner chose a Seq Scan of jobs. %(tenant)s:
-- NULL on one node; on Citus one tenant, so the FOR UPDATE routes (job_tenants_stale_pending_on_shard says which).
WITH policy AS (
    SELECT p.kind, p.pending_ttl
    FROM unnest(%(kinds)s::text[], %(pending_ttls)s::float8[]) AS p(kind, pending_ttl)
),
stale AS (
    SELECT j.id FROM jobs j LEFT JOIN policy p ON p.kind = j.kind
    WHERE j.state = 'pending'
      AND j.run_at < (SELECT coalesce(%(now)s, now())) - make_interval(
          secs => least(%(pending_ttl)s, (SELECT min(pending_ttl) FROM policy)))
      AND greatest(j.run_at, j.updated_at)
          < (SELECT coalesce(%(now)s, now())) - make_interval(secs => coalesce(p.pending_ttl, %(pending_ttl)s))
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    ORDER BY j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
woken AS (
    UPDATE jobs j SET updated_at = (SELECT coalesce(%(now)s, now()))
    WHERE j.id = ANY (ARRAY(SELECT id FROM stale)) AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
    RETURNING j.id, j.kind
)
SELECT count(*) AS woken,
       (SELECT count(pg_notify('effectgate_jobs', k.kind))
        FROM (SELECT DISTINCT kind FROM woken) k) AS notified,
       ARRAY(SELECT DISTINCT kind FROM woken) AS kinds
FROM woken;

-- name: job_notifications_listen
-- Subscribes this session to the wake-ups sent when a job is claimed, re-queued or redriven.
LISTEN effectgate_jobs;

-- name: jobs_notify
-- Wakes the workers of these kinds, from the node this session is on (on Citus: the coordinator, where they
-- listen; a NOTIFY inside a statement routed to a worker node fires there, unheard).
SELECT count(pg_notify('effectgate_jobs', k.kind)) AS n FROM unnest(%(kinds)s::text[]) AS k(kind);
