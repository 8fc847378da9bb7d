-- name: transmission_remember_first
-- Remembers (source, transmission id) with its body hash unless already remembered and not expired; returns
-- the body hash remembered first, and deletes up to %(sweep)s expired rows of any source on the way.
-- DO UPDATE, not DO NOTHING: it locks and returns the row a concurrent statement inserted, so two replicas
-- racing on one id both read the one hash that won (DO NOTHING plus a SELECT could miss a row committed
-- after this statement's snapshot). An expired row is replaced: its id can no longer pass the time window.
-- SKIP LOCKED keeps two sweeping statements from waiting on (or deadlocking over) the same expired rows.
WITH swept AS (
    DELETE FROM transmissions t
    WHERE (t.source, t.transmission_id) IN (
        SELECT e.source, e.transmission_id FROM transmissions e
        WHERE e.expires_at < coalesce(%(now)s, now())
          AND NOT (e.source = %(source)s AND e.transmission_id = %(transmission_id)s)
        ORDER BY e.expires_at
        LIMIT %(sweep)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
INSERT INTO transmissions AS t (source, transmission_id, body_sha256, expires_at, first_seen_at, last_seen_at)
VALUES (%(source)s, %(transmission_id)s, %(body_sha256)s, %(expires_at)s, coalesce(%(now)s, now()),
        coalesce(%(now)s, now()))
ON CONFLICT (source, transmission_id) DO UPDATE SET
    body_sha256 = CASE WHEN t.expires_at < EXCLUDED.last_seen_at THEN EXCLUDED.body_sha256
                       ELSE t.body_sha256 END,
    first_seen_at = CASE WHEN t.expires_at < EXCLUDED.last_seen_at THEN EXCLUDED.first_seen_at
                         ELSE t.first_seen_at END,
    seen_count = CASE WHEN t.expires_at < EXCLUDED.last_seen_at THEN 1 ELSE t.seen_count + 1 END,
    expires_at = greatest(t.expires_at, EXCLUDED.expires_at),
    last_seen_at = EXCLUDED.last_seen_at
RETURNING t.body_sha256, t.seen_count, (SELECT count(*) FROM swept) AS swept;
