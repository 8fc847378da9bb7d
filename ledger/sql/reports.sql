-- name: effect_by_key
-- One effect by (tenant, key), with its job.
SELECT e.id, e.tenant, e.effect_key, e.source, e.handler, e.event_id, e.event_type, e.fingerprint, e.payload,
       e.delivery_count, e.reject_count, e.first_seen_at, e.last_seen_at,
       j.id AS job_id, j.state::text AS job_state, j.attempt, j.max_attempts, j.terminal_reason, j.terminal_by,
       j.last_error, j.checkpoint, j.cancel_requested, j.finished_at
FROM effects e LEFT JOIN jobs j ON j.effect_id = e.id
WHERE e.tenant = %(tenant)s AND e.effect_key = %(effect_key)s;

-- name: effect_deliveries
-- Every delivery that asked for an effect, oldest first.
SELECT request_id, received_at, source, event_id, event_type, outcome, fingerprint, secret_index
FROM deliveries WHERE effect_id = %(effect_id)s
ORDER BY received_at, id;

-- name: effect_attempts
-- Every attempt of an effect's job: worker, token, when, how it ended.
SELECT a.attempt, a.lease_token, a.worker, a.started_at, a.finished_at, a.outcome, a.error_type,
       a.error_message, a.traceback
FROM job_attempts a JOIN jobs j ON j.id = a.job_id
WHERE j.effect_id = %(effect_id)s
ORDER BY a.lease_token;

-- name: effect_rejects_for_effect
-- Deliveries that reused this effect's key with a different payload.
SELECT event_id, event_type, rejected_fingerprint, rejected_payload, received_at
FROM effect_rejects WHERE effect_id = %(effect_id)s
ORDER BY received_at, id;

-- name: report_duplicates
-- Effects delivered more than once, last seen in [since, until), newest first.
SELECT tenant, effect_key, source, event_type, delivery_count, first_seen_at, last_seen_at
FROM effects
WHERE delivery_count > 1 AND last_seen_at >= %(since)s AND last_seen_at < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
ORDER BY last_seen_at DESC, id DESC
LIMIT %(limit)s;

-- name: report_key_conflicts
-- Deliveries rejected because their key was held by a different payload, newest first.
SELECT r.tenant, r.effect_key, r.source, r.event_id, r.event_type, r.held_fingerprint, r.rejected_fingerprint,
       r.received_at, e.event_id AS held_event_id, e.event_type AS held_event_type
FROM effect_rejects r JOIN effects e ON e.id = r.effect_id
WHERE r.received_at >= %(since)s AND r.received_at < %(until)s
  AND (%(source)s::text IS NULL OR r.source = %(source)s)
ORDER BY r.received_at DESC, r.id DESC
LIMIT %(limit)s;

-- name: report_signature_failures
-- Verification failures by (source, reason), summed over [since, until).
SELECT source, reason, sum(count)::bigint AS count, max(last_seen_at) AS last_seen_at
FROM signature_failures
WHERE minute >= date_trunc('minute', %(since)s::timestamptz) AND minute < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
GROUP BY source, reason
ORDER BY count DESC, source, reason;
