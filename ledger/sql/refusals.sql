-- name: refused_deliveries_keep
-- Keeps the events of one refused delivery (outcome 'refused'), each with its payload, the raw body and why.
INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, outcome, fingerprint,
                        secret_index, payload, refusal, body)
SELECT %(request_id)s, coalesce(%(now)s, now()), r.tenant, %(source)s, r.event_id, r.event_type, 'refused',
       r.fingerprint, %(secret_index)s, r.payload::jsonb, %(refusal)s, %(body)s
FROM unnest(%(tenant)s::text[], %(event_id)s::text[], %(event_type)s::text[], %(fingerprint)s::text[],
            %(payload)s::text[]) AS r(tenant, event_id, event_type, fingerprint, payload);

-- name: refused_deliveries_for_replay
-- Replay: up to %(limit)s refused deliveries of a source received in [since, until) whose payload is still
-- kept and that were not replayed yet, oldest first.
SELECT id, request_id, received_at, tenant AS row_tenant, source, event_id, event_type, fingerprint,
       secret_index, payload, refusal
FROM deliveries
WHERE outcome = 'refused' AND payload IS NOT NULL AND source = %(source)s
  AND NOT refusal ? 'replayed_at'
  AND received_at >= %(since)s AND received_at < coalesce(%(until)s::timestamptz, 'infinity')
ORDER BY received_at, id
LIMIT %(limit)s;

-- name: refused_delivery_mark_replayed
-- Replay: marks one refused delivery replayed, with when and what its effects came to.
UPDATE deliveries SET refusal = refusal || %(replayed)s
WHERE id = %(id)s AND received_at = %(received_at)s AND tenant = %(tenant)s AND outcome = 'refused';
