-- A sketch for tests/citus/lease_bench.py --sketch, never shipped: the per-tenant fetch as the claim was made routable
-- (docs/adr/0023), to measure that candidate before anyone writes it for real. job_fetch_and_lease restricted
-- to one tenant is still nine single-shard subplans from the coordinator (its modifying CTEs; plain equality on
-- tenant instead of the `IS NULL OR` guard changes nothing). Here the same read (the walk per kind bounded by
-- scan_limit, paused kinds, the lock-key holder probe, SKIP LOCKED, the merge across kinds, one job per lock key,
-- the superseded probe) is one read-only router query, then each lease and its attempt row are single-row
-- writes with a constant tenant, then one router read returns what the worker needs. Distributed by its first
-- argument with effects, a call runs whole on the tenant's node, executed locally there.
-- Left out, because a sketch is timed on jobs that have neither: cancelling superseded jobs (they are skipped
-- here) and the hooked kinds' to_supersede list. The shipped function would need both, a _v1 name, a
-- migration, and a test that it leases exactly as the statement does (as tests/integration/
-- test_claim_function.py does for the claim).
CREATE FUNCTION lease_sketch(
    p_tenant text, p_kinds text[], p_ttls float8[], p_limit int, p_scan_limit int, p_owner text, p_now timestamptz
) RETURNS TABLE (id bigint, effect_id bigint, kind text, tenant text, attempt int, max_attempts int,
                 lease_token bigint, checkpoint jsonb, cancel_requested boolean, lock_key text, trace_parent text,
                 effect_key text, source text, event_id text, event_type text, payload jsonb, has_steps boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_ids bigint[];
    v_expires timestamptz[];
    r record;
BEGIN
    SELECT array_agg(d.id ORDER BY d.run_at, d.id), array_agg(d.expires_at ORDER BY d.run_at, d.id)
    INTO v_ids, v_expires
    FROM (
        SELECT c.id, c.run_at, c.lock_key, v_now + make_interval(secs => c.ttl) AS expires_at,
               row_number() OVER (PARTITION BY c.lock_key ORDER BY c.run_at, c.id) AS nth
        FROM (
            SELECT c.* FROM unnest(p_kinds, p_ttls) AS k(kind, ttl)
            CROSS JOIN LATERAL (
                SELECT j.id, j.kind, j.lock_key, j.version, j.run_at, k.ttl
                FROM (
                    SELECT w.id, w.run_at FROM jobs w
                    WHERE w.tenant = p_tenant AND w.kind = k.kind AND w.state = 'pending' AND w.run_at <= v_now
                    ORDER BY w.run_at, w.id
                    LIMIT greatest(p_scan_limit, p_limit)
                ) head
                JOIN jobs j ON j.id = head.id AND j.tenant = p_tenant
                WHERE j.state = 'pending'
                  AND NOT EXISTS (
                      SELECT 1 FROM jobs holder
                      WHERE holder.tenant = p_tenant AND holder.lock_key = j.lock_key AND holder.state = 'running'
                        AND holder.lock_key IS NOT NULL
                  )
                ORDER BY head.run_at, head.id
                LIMIT p_limit
                FOR UPDATE OF j SKIP LOCKED
            ) c
            WHERE NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = k.kind)
            ORDER BY c.run_at, c.id
            LIMIT p_limit
        ) c
        WHERE NOT (c.version IS NOT NULL AND EXISTS (
            SELECT 1 FROM effect_versions v
            WHERE v.tenant = p_tenant AND v.kind = c.kind AND v.lock_key = c.lock_key AND v.version > c.version
        ))
    ) d
    WHERE d.lock_key IS NULL OR d.nth = 1;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1 .. array_length(v_ids, 1) LOOP
        UPDATE jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
                          lease_owner = p_owner, lease_expires_at = v_expires[i], updated_at = v_now
        WHERE j.tenant = p_tenant AND j.id = v_ids[i]
        RETURNING j.id, j.attempt, j.lease_token INTO r;
        INSERT INTO job_attempts (job_id, tenant, attempt, lease_token, worker, started_at)
        VALUES (r.id, p_tenant, r.attempt, r.lease_token, p_owner, v_now);
    END LOOP;
    RETURN QUERY
    SELECT j.id, j.effect_id, j.kind, j.tenant, j.attempt, j.max_attempts, j.lease_token, j.checkpoint,
           j.cancel_requested, j.lock_key, j.trace_parent, e.effect_key, e.source, e.event_id, e.event_type,
           e.payload,
           EXISTS (SELECT 1 FROM steps s WHERE s.effect_id = j.effect_id AND s.tenant = p_tenant)
    FROM jobs j JOIN effects e ON e.id = j.effect_id AND e.tenant = p_tenant
    WHERE j.tenant = p_tenant AND j.id = ANY(v_ids)
    ORDER BY j.id;
END
$fn$;

-- Pinned to this schema, as the claim function is (migration 0023): Citus runs the call on a worker node in a
-- session with no search_path of ours.
DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION lease_sketch(text, text[], float8[], int, int, text, timestamptz)'
                   ' SET search_path = %I', current_schema());
END
$pin$;

SELECT create_distributed_function(
    'lease_sketch(text, text[], float8[], int, int, text, timestamptz)', '$1', colocate_with => 'effects');
