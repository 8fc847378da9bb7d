-- name: job_action_record
-- The record of one operator action on a job (redrive, cancel, resolve, replay), with its tenant read from the job.
-- %(tenant)s: the job's, on a ledger distributed by tenant (NULL on one node), so Citus routes it.
INSERT INTO job_actions (tenant, job_id, action, acted_by, reason, detail, acted_at)
SELECT j.tenant, j.id, %(action)s, %(by)s, %(reason)s, %(detail)s, (SELECT coalesce(%(now)s, now()))
FROM jobs j WHERE j.id = %(job_id)s AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
RETURNING id, acted_at;

-- name: kind_action_record
-- The record of one operator action on a handler kind (pause, resume).
INSERT INTO kind_actions (kind, action, acted_by, reason, acted_at)
VALUES (%(kind)s, %(action)s, %(by)s, %(reason)s, coalesce(%(now)s, now()))
RETURNING id, acted_at;

-- name: job_actions_for_job
-- Every operator action on one job, oldest first (job_actions_job_idx).
SELECT action, acted_by, reason, detail, acted_at FROM job_actions
WHERE job_id = %(job_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY acted_at, id;

-- name: kind_actions_for_kind_between
-- The pauses and resumes of one kind in [since, until], oldest first, at most %(limit)s (kind_actions_kind_idx):
-- the ones a job of the kind lived through.
SELECT kind, action, acted_by, reason, acted_at FROM kind_actions
WHERE kind = %(kind)s AND acted_at >= %(since)s AND acted_at <= coalesce(%(until)s::timestamptz, 'infinity')
ORDER BY acted_at, id
LIMIT %(limit)s;

-- name: steps_failed_for_job
-- The steps of a job's effect that recorded a terminal error: each is replayed, not called, by the next run.
SELECT s.name, s.error, s.recorded_at FROM jobs j
JOIN steps s ON s.effect_id = j.effect_id AND s.tenant = j.tenant
WHERE j.id = %(job_id)s AND s.status = 'failed' AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
ORDER BY s.recorded_at, s.name;
