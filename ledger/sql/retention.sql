-- name: signature_failures_delete_expired
-- Retention: forgets failed-verification counters older than the window, a batch at a time.
WITH expired AS (
    SELECT source, reason, minute FROM signature_failures
    WHERE minute < coalesce(%(now)s, now()) - make_interval(secs => %(retention)s)
    LIMIT %(limit)s
)
DELETE FROM signature_failures f
USING expired
WHERE f.source = expired.source AND f.reason = expired.reason AND f.minute = expired.minute;
