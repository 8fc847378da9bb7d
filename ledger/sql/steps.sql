-- name: steps_for_effect
-- Every recorded step of an effect: what a later attempt returns instead of calling again.
SELECT name, idempotency_key, status, result, error, job_id, lease_token, recorded_at
FROM steps WHERE effect_id = %(effect_id)s
ORDER BY recorded_at, name;

-- name: step_record_if_leased
-- Records a step's outcome, only for the holder of the current token; the primary key refuses a second
-- recording of the same name.
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
    ON CONFLICT (effect_id, name) DO NOTHING
    RETURNING name
)
SELECT (SELECT count(*) FROM lease) AS leased, (SELECT count(*) FROM recorded) AS recorded;
