-- name: steps_for_effect
-- Every recorded step of an effect: what a later attempt returns instead of calling again. %(tenant)s, where known
-- (the worker's lease), lets Citus send it to the tenant's shard instead of every shard.
SELECT name, idempotency_key, status, result, error, found, job_id, lease_token, recorded_at
FROM steps WHERE effect_id = %(effect_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY recorded_at, name;

-- name: step_record_if_leased
-- Records a step's outcome, only for the holder of the current token; the primary key refuses a second
-- recording of the same name. A 'started' marker (step_start_if_leased) is the one row an outcome replaces.
WITH lease AS (
    UPDATE jobs SET committed_since_release = true, updated_at = (SELECT coalesce(%(now)s, now()))
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    RETURNING id, effect_id, tenant
),
recorded AS (
    INSERT INTO steps (effect_id, tenant, name, idempotency_key, status, result, error, found, job_id, lease_token,
                       recorded_at)
    SELECT effect_id, tenant, %(name)s, %(idempotency_key)s, %(status)s, %(result)s, %(error)s, %(found)s, id,
           %(lease_token)s, (SELECT coalesce(%(now)s, now()))
    FROM lease
    ON CONFLICT (effect_id, name, tenant) DO UPDATE SET
        idempotency_key = EXCLUDED.idempotency_key, status = EXCLUDED.status, result = EXCLUDED.result,
        error = EXCLUDED.error, found = EXCLUDED.found, job_id = EXCLUDED.job_id, lease_token = EXCLUDED.lease_token,
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
    SELECT id, effect_id, tenant FROM jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    FOR NO KEY UPDATE
),
marked AS (
    INSERT INTO steps (effect_id, tenant, name, idempotency_key, status, job_id, lease_token, recorded_at)
    SELECT effect_id, tenant, %(name)s, %(idempotency_key)s, 'started', id, %(lease_token)s, (SELECT coalesce(%(now)s, now()))
    FROM lease
    ON CONFLICT (effect_id, name, tenant) DO UPDATE SET
        job_id = EXCLUDED.job_id, lease_token = EXCLUDED.lease_token, recorded_at = EXCLUDED.recorded_at
    WHERE steps.status = 'started'
    RETURNING name
)
SELECT (SELECT count(*) FROM lease) AS leased, (SELECT count(*) FROM marked) AS marked;

-- name: step_lease_progress_if_leased
-- On Citus, the first half of step_record_if_leased (steps.record with per_tenant): counts the lease's progress and
-- locks its job row for the transaction, only for the holder of the current token; returns the effect. Split in two
-- because Citus plans an INSERT ... SELECT from a modifying CTE as subplans; each half is one router task.
UPDATE jobs SET committed_since_release = true, updated_at = (SELECT coalesce(%(now)s, now()))
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND tenant = %(tenant)s
RETURNING effect_id;

-- name: step_lease_lock_if_leased
-- On Citus, the first half of step_start_if_leased: locks the job row for the transaction, only for the holder of
-- the current token, without counting progress (a marker is not progress); returns the effect.
SELECT effect_id FROM jobs
WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running' AND tenant = %(tenant)s
FOR NO KEY UPDATE;

-- name: step_upsert_over_started
-- On Citus, the second half of both (the job row locked by the first): writes the step, or replaces its 'started'
-- marker; an outcome already recorded is left alone and nothing is returned. A marker (%(status)s 'started') has
-- no result or error, so replacing a marker with a marker moves it to this attempt, as step_start_if_leased does.
INSERT INTO steps (effect_id, tenant, name, idempotency_key, status, result, error, found, job_id, lease_token,
                   recorded_at)
VALUES (%(effect_id)s, %(tenant)s, %(name)s, %(idempotency_key)s, %(status)s, %(result)s, %(error)s, %(found)s,
        %(job_id)s, %(lease_token)s, coalesce(%(now)s, now()))
ON CONFLICT (effect_id, name, tenant) DO UPDATE SET
    idempotency_key = EXCLUDED.idempotency_key, status = EXCLUDED.status, result = EXCLUDED.result,
    error = EXCLUDED.error, found = EXCLUDED.found, job_id = EXCLUDED.job_id, lease_token = EXCLUDED.lease_token,
    recorded_at = EXCLUDED.recorded_at
WHERE steps.status = 'started'
RETURNING name;
