-- The claim statement as it stood before 0006 (from ledger/sql/claims.sql of that release), kept so the
-- upgrade test can populate an old ledger the way that release's gateway did; today's statement names
-- columns the old schema does not have.
-- name: effect_claim
-- Claims (tenant, effect_key) for one effect of a delivery, or counts it as a duplicate, or records it as a
-- reject; writes the delivery row and, for a new claim, the job, and wakes workers — all in one statement.
-- ON CONFLICT DO UPDATE (not DO NOTHING) so a claim committed concurrently by another replica is locked and
-- returned to us: a DO NOTHING would leave this statement's snapshot blind to it.
WITH claim AS (
    INSERT INTO effects AS e (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                              first_seen_at, last_seen_at)
    VALUES (%(tenant)s, %(effect_key)s, %(source)s, %(handler)s, %(event_id)s, %(event_type)s, %(fingerprint)s,
            %(payload)s, coalesce(%(now)s, now()), coalesce(%(now)s, now()))
    ON CONFLICT (tenant, effect_key) DO UPDATE SET
        delivery_count = e.delivery_count + (e.fingerprint = EXCLUDED.fingerprint)::int,
        reject_count = e.reject_count + (e.fingerprint <> EXCLUDED.fingerprint)::int,
        last_seen_at = CASE WHEN e.fingerprint = EXCLUDED.fingerprint
                            THEN EXCLUDED.last_seen_at ELSE e.last_seen_at END
    RETURNING e.id, (e.xmax = 0) AS created, e.fingerprint AS held_fingerprint, e.delivery_count
),
outcome AS (
    SELECT id AS effect_id, delivery_count, held_fingerprint,
           CASE WHEN created THEN 'accepted'
                WHEN held_fingerprint = %(fingerprint)s THEN 'duplicate'
                ELSE 'rejected' END AS outcome
    FROM claim
),
job AS (
    INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, lock_key, run_at, created_at,
                      updated_at)
    SELECT effect_id, %(tenant)s, %(handler)s, %(max_attempts)s, %(orphan_policy)s, %(lock_key)s,
           coalesce(%(now)s, now()), coalesce(%(now)s, now()), coalesce(%(now)s, now())
    FROM outcome WHERE outcome = 'accepted'
    RETURNING id
),
delivery AS (
    INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, effect_id, effect_key,
                            outcome, fingerprint, secret_index)
    SELECT %(request_id)s, coalesce(%(now)s, now()), %(tenant)s, %(source)s, %(event_id)s, %(event_type)s,
           effect_id, %(effect_key)s, outcome, %(fingerprint)s, %(secret_index)s
    FROM outcome
    RETURNING id
),
reject AS (
    INSERT INTO effect_rejects (effect_id, tenant, effect_key, source, event_id, event_type, held_fingerprint,
                                rejected_fingerprint, rejected_payload, received_at)
    SELECT effect_id, %(tenant)s, %(effect_key)s, %(source)s, %(event_id)s, %(event_type)s, held_fingerprint,
           %(fingerprint)s, %(payload)s, coalesce(%(now)s, now())
    FROM outcome WHERE outcome = 'rejected'
    RETURNING id
)
SELECT o.effect_id, o.outcome, o.delivery_count, o.held_fingerprint,
       (SELECT id FROM job) AS job_id,
       (SELECT count(pg_notify('effectgate_jobs', %(handler)s)) FROM job) AS notified,
       (SELECT count(*) FROM delivery) + (SELECT count(*) FROM reject) AS recorded
FROM outcome o;

