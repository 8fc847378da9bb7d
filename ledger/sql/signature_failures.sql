-- name: signature_failures_add_batch
-- Adds the failures counted in memory since the last flush, one row per (source, reason, minute), in one statement.
-- The batch holds each key once (the counter aggregates first), so ON CONFLICT never meets a row twice. A row
-- with count 0 only carries a diagnosis hint that arrived after its counts were written: it keeps the stored
-- sample and detail.
INSERT INTO signature_failures AS f (source, reason, minute, count, bytes_total, last_body_sha256, last_detail,
                                     last_seen_at, hint)
SELECT * FROM unnest(%(source)s::text[], %(reason)s::text[], %(minute)s::timestamptz[], %(count)s::integer[],
                     %(bytes_total)s::bigint[], %(body_sha256)s::text[], %(detail)s::text[],
                     %(last_seen_at)s::timestamptz[], %(hint)s::text[])
ON CONFLICT (source, reason, minute) DO UPDATE SET
    count = f.count + EXCLUDED.count,
    bytes_total = f.bytes_total + EXCLUDED.bytes_total,
    last_body_sha256 = CASE WHEN EXCLUDED.count > 0 THEN EXCLUDED.last_body_sha256 ELSE f.last_body_sha256 END,
    last_detail = CASE WHEN EXCLUDED.count > 0 THEN EXCLUDED.last_detail ELSE f.last_detail END,
    last_seen_at = greatest(f.last_seen_at, EXCLUDED.last_seen_at),
    hint = coalesce(EXCLUDED.hint, f.hint);
