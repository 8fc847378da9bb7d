-- Operator reports. Every optional filter is `(%(x)s IS NULL OR col = %(x)s)`; ledger/reports/__init__.py runs these
-- unprepared, so Postgres plans each with its actual values, folds away the unused filters and picks the
-- index of the one that is set. Pagination is keyset on (sort columns, id): a page costs the same at any depth.
-- A paged report has one block with two holes that ledger/reports/spec.py fills from the report's declared
-- sort columns (never from input): {after}, the keyset condition (TRUE on the first page), and {order}.

-- name: effect_by_key
-- One effect by (tenant, key): the claim, and the id of the job it created.
SELECT e.id, e.tenant, e.effect_key, e.source, e.handler, e.event_id, e.event_type, e.fingerprint, e.payload,
       e.delivery_count, e.reject_count, e.first_seen_at, e.last_seen_at, j.id AS job_id
FROM effects e LEFT JOIN jobs j ON j.effect_id = e.id AND j.tenant = e.tenant
WHERE e.tenant = %(tenant)s AND e.effect_key = %(effect_key)s;

-- name: effect_tenants_holding_key
-- The tenants holding an effect key, for a lookup without a tenant: a loose index scan walks the few distinct
-- tenants of the (tenant, effect_key) unique index and probes each, instead of reading every effect.
WITH RECURSIVE tenants AS (
    (SELECT tenant FROM effects ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT e.tenant FROM effects e WHERE e.tenant > t.tenant ORDER BY e.tenant LIMIT 1)
    FROM tenants t WHERE t.tenant IS NOT NULL
)
SELECT e.tenant FROM tenants t JOIN effects e ON e.tenant = t.tenant AND e.effect_key = %(effect_key)s
ORDER BY e.tenant;

-- name: effect_deliveries
-- Every delivery that asked for an effect, oldest first.
SELECT id, request_id, received_at, source, event_id, event_type, outcome, fingerprint, secret_index
FROM deliveries WHERE effect_id = %(effect_id)s
ORDER BY received_at, id;

-- name: effect_rejects_for_effect
-- Deliveries that reused this effect's key with a different payload.
SELECT id, event_id, event_type, rejected_fingerprint, rejected_payload, received_at
FROM effect_rejects WHERE effect_id = %(effect_id)s
ORDER BY received_at, id;

-- name: report_duplicates
-- Effects delivered more than once, last seen in [since, until), one keyset page in the sort order given.
SELECT id, tenant, effect_key, source, event_type, delivery_count, first_seen_at, last_seen_at
FROM effects
WHERE delivery_count > 1 AND last_seen_at >= %(since)s AND last_seen_at < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)
  AND {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: report_duplicate_totals
-- Duplicated effects and their extra deliveries in [since, until), by source and event type.
SELECT source, event_type, count(*)::bigint AS effects, sum(delivery_count)::bigint AS deliveries,
       sum(delivery_count - 1)::bigint AS duplicate_deliveries
FROM effects
WHERE delivery_count > 1 AND last_seen_at >= %(since)s AND last_seen_at < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)
GROUP BY source, event_type
ORDER BY source, event_type;

-- name: report_key_conflicts
-- Deliveries rejected because their key was held by a different payload, with both payloads: one page.
SELECT r.id, r.tenant, r.effect_key, r.source, r.event_id, r.event_type, r.held_fingerprint,
       r.rejected_fingerprint, r.received_at, r.rejected_payload, e.event_id AS held_event_id,
       e.event_type AS held_event_type, e.payload AS held_payload
FROM effect_rejects r JOIN effects e ON e.id = r.effect_id AND e.tenant = r.tenant
WHERE r.received_at >= %(since)s AND r.received_at < %(until)s
  AND (%(source)s::text IS NULL OR r.source = %(source)s)
  AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
  AND (%(event_type)s::text IS NULL OR r.event_type = %(event_type)s)
  AND {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: report_key_conflict_totals
-- Key conflicts in [since, until), by source and event type.
SELECT source, event_type, count(*)::bigint AS rejects, count(DISTINCT effect_id)::bigint AS effects
FROM effect_rejects
WHERE received_at >= %(since)s AND received_at < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)
GROUP BY source, event_type
ORDER BY source, event_type;

-- name: report_refused_deliveries
-- Verified deliveries kept as refused (outcome 'refused'), one row per event, with why: one page.
SELECT d.id, d.received_at, d.source, d.tenant, d.event_id, d.event_type, d.refusal->>'reason' AS reason,
       d.refusal->>'handler' AS handler, d.refusal->>'error' AS error, d.refusal->>'detail' AS refusal_detail,
       (d.refusal->>'replayed_at')::timestamptz AS replayed_at, octet_length(d.body) AS body_bytes,
       d.payload IS NOT NULL AS replayable
FROM deliveries d
WHERE d.outcome = 'refused' AND d.received_at >= %(since)s AND d.received_at < %(until)s
  AND (%(source)s::text IS NULL OR d.source = %(source)s)
  AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s)
  AND (%(event_type)s::text IS NULL OR d.event_type = %(event_type)s)
  AND (%(event_id)s::text IS NULL OR d.event_id = %(event_id)s)
  AND {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: report_auth_failures_by_reason
-- Verification failures in the minutes of [since, until), by (source, reason), most first.
SELECT source, reason, sum(count)::bigint AS count, sum(bytes_total)::bigint AS bytes_total,
       min(minute) AS first_minute, max(last_seen_at) AS last_seen_at
FROM signature_failures
WHERE minute >= date_trunc('minute', %(since)s::timestamptz) AND minute < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
GROUP BY source, reason
ORDER BY count DESC, source, reason;

-- name: report_auth_failures_per_minute
-- Verification failure counts per (minute, source, reason) in [since, until), newest minute first.
SELECT minute, source, reason, count, bytes_total, last_detail, hint, last_seen_at
FROM signature_failures
WHERE minute >= date_trunc('minute', %(since)s::timestamptz) AND minute < %(until)s
  AND (%(source)s::text IS NULL OR source = %(source)s)
  AND {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: report_jobs
-- Jobs created in [since, until) (either end open when NULL) by state, kind, source and tenant: one keyset page.
SELECT j.id, j.tenant, j.kind, j.state::text AS state, j.attempt, j.max_attempts, j.run_at, j.lease_token,
       j.lease_owner, j.lease_expires_at, j.cancel_requested, j.unrecoverable, j.terminal_reason,
       j.terminal_by, j.created_at, j.updated_at, j.finished_at, j.resolved_at, j.resolved_by, j.resolved_reason,
       e.effect_key, e.source, e.event_type
FROM jobs j JOIN effects e ON e.id = j.effect_id AND e.tenant = j.tenant
WHERE j.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
  AND j.created_at < coalesce(%(until)s::timestamptz, 'infinity')
  AND (%(state)s::job_state[] IS NULL OR j.state = ANY(%(state)s::job_state[]))
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
  AND (%(source)s::text IS NULL OR e.source = %(source)s)
  AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
  AND {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: report_delivery_outcomes
-- Deliveries received in [since, until) per source by outcome, with duplicate and reject rates: one page.
SELECT * FROM (
    SELECT source, count(*)::bigint AS deliveries,
           count(*) FILTER (WHERE outcome = 'accepted')::bigint AS accepted,
           count(*) FILTER (WHERE outcome = 'duplicate')::bigint AS duplicates,
           count(*) FILTER (WHERE outcome = 'rejected')::bigint AS rejected,
           count(*) FILTER (WHERE outcome = 'unmatched')::bigint AS unmatched,
           count(*) FILTER (WHERE outcome = 'superseded')::bigint AS superseded,
           count(*) FILTER (WHERE outcome = 'refused')::bigint AS refused,
           (count(*) FILTER (WHERE outcome = 'duplicate'))::float8 / count(*) AS duplicate_rate,
           (count(*) FILTER (WHERE outcome = 'rejected'))::float8 / count(*) AS reject_rate
    FROM deliveries
    WHERE received_at >= %(since)s AND received_at < %(until)s
      AND (%(source)s::text IS NULL OR source = %(source)s)
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    GROUP BY source
) per_source
WHERE {after}
ORDER BY {order}
LIMIT %(limit)s;

-- name: metrics_jobs_not_done_by_state_kind
-- Jobs waiting, running or needing a human, by state and kind; succeeded, cancelled and resolved-by-hand jobs
-- only grow and are left out, so a scrape reads the live part of the table, not its history — and a failed or
-- parked job an operator resolved stops counting as waiting for a human (the alert built on it clears).
SELECT state::text AS state, kind, count(*)::bigint AS n
FROM jobs
WHERE state IN ('pending', 'running', 'failed', 'parked')
GROUP BY state, kind
ORDER BY state, kind;

-- name: metrics_oldest_due_job
-- When the longest-waiting due pending job became due, or NULL when none is waiting.
SELECT min(run_at) AS run_at, coalesce(%(now)s, now()) AS now
FROM jobs
WHERE state = 'pending' AND run_at <= coalesce(%(now)s, now());

-- name: report_activity
-- Duplicate deliveries, key conflicts and authentication failures per %(bucket)s of [since, until), every
-- bucket present (zero when quiet), oldest first: the series behind the dashboard's charts.
WITH buckets AS (
    SELECT generate_series(
        date_bin(%(bucket)s::interval, %(since)s::timestamptz, timestamptz 'epoch'),
        %(until)s::timestamptz - interval '1 microsecond',
        %(bucket)s::interval
    ) AS bucket
),
duplicates AS (
    SELECT date_bin(%(bucket)s::interval, received_at, timestamptz 'epoch') AS bucket, count(*) AS n
    FROM deliveries
    WHERE outcome = 'duplicate' AND received_at >= %(since)s AND received_at < %(until)s
      AND (%(source)s::text IS NULL OR source = %(source)s)
    GROUP BY 1
),
conflicts AS (
    SELECT date_bin(%(bucket)s::interval, received_at, timestamptz 'epoch') AS bucket, count(*) AS n
    FROM effect_rejects
    WHERE received_at >= %(since)s AND received_at < %(until)s
      AND (%(source)s::text IS NULL OR source = %(source)s)
    GROUP BY 1
),
auth AS (
    SELECT date_bin(%(bucket)s::interval, minute, timestamptz 'epoch') AS bucket, sum(count) AS n
    FROM signature_failures
    WHERE minute >= date_trunc('minute', %(since)s::timestamptz) AND minute < %(until)s
      AND (%(source)s::text IS NULL OR source = %(source)s)
    GROUP BY 1
)
SELECT b.bucket, coalesce(d.n, 0)::bigint AS duplicates, coalesce(c.n, 0)::bigint AS conflicts,
       coalesce(a.n, 0)::bigint AS auth_failures
FROM buckets b
LEFT JOIN duplicates d ON d.bucket = b.bucket
LEFT JOIN conflicts c ON c.bucket = b.bucket
LEFT JOIN auth a ON a.bucket = b.bucket
ORDER BY b.bucket;
