-- name: jobs_match_filter
-- Bulk recovery: the ids of up to %(limit)s jobs matching a filter (states, kind, source, finished — or, not
-- finished, created — since), oldest first; every filter is optional.
SELECT j.id FROM jobs j JOIN effects e ON e.id = j.effect_id AND e.tenant = j.tenant
-- The states as job_state[], so the planner reads them as a constant: a text cast of the column hid every
-- state index (a Seq Scan of jobs under a backlog), and a cast of text[] to the enum its estimate.
WHERE (%(states)s::job_state[] IS NULL OR j.state = ANY(%(states)s::job_state[]))
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
  AND (%(source)s::text IS NULL OR e.source = %(source)s::text)
  AND (%(since)s::timestamptz IS NULL OR coalesce(j.finished_at, j.created_at) >= %(since)s::timestamptz)
ORDER BY j.id
LIMIT %(limit)s;

-- name: kind_pause
-- Stops leasing a kind's jobs (a downstream outage): the fetch skips paused kinds; running jobs finish.
INSERT INTO paused_kinds AS p (kind, paused_at, paused_by, reason)
VALUES (%(kind)s, coalesce(%(now)s, now()), %(by)s, %(reason)s)
ON CONFLICT (kind) DO UPDATE SET paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason
RETURNING kind, paused_at, paused_by, reason;

-- name: kind_resume
-- Leases a paused kind's jobs again, and wakes the workers for the ones that waited.
WITH resumed AS (
    DELETE FROM paused_kinds WHERE kind = %(kind)s RETURNING kind
)
SELECT kind, pg_notify('effectgate_jobs', kind) IS NOT NULL AS notified FROM resumed;

-- name: kinds_paused
-- Every paused kind, with who paused it, when and why, and how many of its jobs wait.
SELECT p.kind, p.paused_at, p.paused_by, p.reason,
       (SELECT count(*) FROM jobs j WHERE j.kind = p.kind AND j.state = 'pending') AS pending
FROM paused_kinds p ORDER BY p.kind;

-- name: deliveries_unmatched_for_replay
-- Replay: up to %(limit)s unmatched deliveries of a source received in [since, until) whose payload is still
-- kept, oldest first.
SELECT request_id, received_at, tenant, source, event_id, event_type, fingerprint, secret_index, payload
FROM deliveries
WHERE payload IS NOT NULL AND outcome = 'unmatched' AND source = %(source)s
  AND received_at >= %(since)s AND received_at < coalesce(%(until)s::timestamptz, 'infinity')
ORDER BY received_at, id
LIMIT %(limit)s;
