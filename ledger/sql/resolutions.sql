-- name: job_resolve_if_failed_or_parked
-- Resolved by hand: closes a failed or parked job without running it, recording who, why and when, and which
-- state it closed. The row lock and the state in the WHERE clause make a resolve racing a redrive (or another
-- resolve) one transition: whichever commits second re-reads the row and matches nothing. A job whose payload
-- retention already purged has a tombstone that kept "failed" or "parked": it says "resolved" from now on, as it
-- would had the resolution come before the purge.
-- %(tenant)s: the job's, on a ledger distributed by tenant (NULL on one node), so Citus routes it; the clock is a
-- sub-select because Citus refuses now() inside an UPDATE's coalesce.
WITH resolved AS (
    UPDATE jobs SET
        state = 'resolved',
        resolved_from = state,
        resolved_at = (SELECT coalesce(%(now)s, now())),
        resolved_by = %(by)s,
        resolved_reason = %(reason)s,
        updated_at = (SELECT coalesce(%(now)s, now()))
    WHERE id = %(job_id)s AND state IN ('failed', 'parked') AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    RETURNING id, effect_id, tenant, payload_purged, resolved_from, resolved_at, resolved_by, resolved_reason
),
tombstone AS (
    UPDATE effects e SET outcome = 'resolved'
    FROM resolved r
    WHERE e.id = r.effect_id AND e.tenant = r.tenant AND r.payload_purged AND e.purged_at IS NOT NULL
      AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s)
    RETURNING e.id
)
SELECT r.id, r.resolved_from::text AS resolved_from, r.resolved_at, r.resolved_by, r.resolved_reason,
       (SELECT count(*) FROM tombstone) AS tombstones
FROM resolved r;

-- name: job_resolution_get
-- A job's state and resolution, to answer a resolve that changed nothing (why, or the resolution it repeats).
SELECT id, state::text AS state, resolved_from::text AS resolved_from, resolved_at, resolved_by, resolved_reason
FROM jobs WHERE id = %(job_id)s;

-- name: jobs_resolved_count_between
-- How many jobs were resolved by hand in [since, until): the dashboard overview's card. Only resolved rows are
-- read (jobs_state_kind_idx leads with the state), however long the rest of the history.
SELECT count(*)::bigint AS n FROM jobs
WHERE state = 'resolved' AND resolved_at >= %(since)s AND resolved_at < %(until)s;
