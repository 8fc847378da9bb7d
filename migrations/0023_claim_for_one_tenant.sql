-- The claim for one tenant, as a function Citus routes whole to that tenant's node (issue 23; docs/adr/0023).
-- The claim statement (effect_claim_batch) cannot be routed: Citus plans each of its chained modifying CTEs as
-- a subplan with intermediate results, on the coordinator and again on a worker node (11 of them, ~20 times the
-- cost of this function there). Distributed by its first argument and colocated with effects
-- (deploy/citus/distribute.sql), a call made outside a transaction block runs on the tenant's node, and each
-- statement in it is a single-row write with a constant tenant: Citus's fast-path router, executed locally.
--
-- It decides exactly as effect_claim_batch does, for entries of one tenant (tests/integration/
-- test_claim_function.py runs both on the same deliveries and compares every outcome and row): version marks
-- raised first, in (kind, lock key) C order; then effects in key C order (the statement's lock order), each
-- accepted with a job, counted a duplicate, recorded a reject, or superseded; then unmatched bodies in (source,
-- fingerprint) C order. It sends no NOTIFY: one sent on a worker node is heard by no one, so the caller wakes the
-- workers from where they listen (ledger/claims.py). Created on every ledger, called only where jobs is
-- distributed. Frozen once released (ADR 0017): a change is effect_claim_tenant_v2.
CREATE FUNCTION effect_claim_tenant_v1(
    p_tenant text, p_ord int[], p_request_id text[], p_tenants text[], p_effect_key text[], p_source text[],
    p_handler text[], p_event_id text[], p_event_type text[], p_fingerprint text[], p_payload_ix int[],
    p_max_attempts int[], p_orphan_policy text[], p_lock_key text[], p_secret_index int[], p_version int8[],
    p_trace_parent text[], p_payloads text[], p_now timestamptz
) RETURNS TABLE (ord int, effect_id bigint, outcome text, delivery_count int, held_fingerprint text,
                 job_id bigint, version bigint, latest_version bigint, notified bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    marks jsonb := '{}';
    mark bigint;
    r record;
    d record;
    e_id bigint;
    e_created boolean;
    e_held text;
    e_count int;
    j_id bigint;
    verdict text;
    created boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_tenants) AS t(tenant) WHERE t.tenant IS DISTINCT FROM p_tenant) THEN
        RAISE EXCEPTION 'a claim routed to tenant % carries another tenant''s entries', p_tenant
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Latest wins per object: each (kind, lock key)'s mark raised to the batch's newest version, locked first.
    FOR r IN
        SELECT i.handler, i.lock_key, max(i.version) AS version
        FROM unnest(p_handler, p_lock_key, p_version) AS i(handler, lock_key, version)
        WHERE i.version IS NOT NULL AND i.lock_key IS NOT NULL
        GROUP BY i.handler, i.lock_key
        ORDER BY i.handler COLLATE "C", i.lock_key COLLATE "C"
    LOOP
        INSERT INTO effect_versions AS v (tenant, kind, lock_key, version, updated_at)
        VALUES (p_tenant, r.handler, r.lock_key, r.version, v_now)
        ON CONFLICT (tenant, kind, lock_key) DO UPDATE SET
            version = GREATEST(v.version, EXCLUDED.version),
            updated_at = CASE WHEN EXCLUDED.version > v.version THEN EXCLUDED.updated_at ELSE v.updated_at END
        RETURNING v.version INTO mark;
        marks := marks || jsonb_build_object(jsonb_build_array(r.handler, r.lock_key)::text, mark);
    END LOOP;
    FOR r IN
        SELECT i.*, (marks ->> jsonb_build_array(i.handler, i.lock_key)::text)::bigint AS mark,
               p_payloads[i.payload_ix]::jsonb AS body
        FROM unnest(p_ord, p_request_id, p_effect_key, p_source, p_handler, p_event_id, p_event_type,
                    p_fingerprint, p_payload_ix, p_max_attempts, p_orphan_policy, p_lock_key, p_secret_index,
                    p_version, p_trace_parent)
            AS i(ord, request_id, effect_key, source, handler, event_id, event_type, fingerprint, payload_ix,
                 max_attempts, orphan_policy, lock_key, secret_index, version, trace_parent)
        WHERE i.effect_key IS NOT NULL
        ORDER BY i.effect_key COLLATE "C"
    LOOP
        e_id := NULL; e_held := NULL; e_count := NULL; j_id := NULL;
        IF coalesce(r.version < r.mark, false) THEN
            verdict := 'superseded';
        ELSE
            INSERT INTO effects AS e (tenant, effect_key, source, handler, event_id, event_type, fingerprint,
                                      payload, first_seen_at, last_seen_at)
            VALUES (p_tenant, r.effect_key, r.source, r.handler, r.event_id, r.event_type, r.fingerprint, r.body,
                    v_now, v_now)
            ON CONFLICT (tenant, effect_key) DO UPDATE SET
                delivery_count = e.delivery_count + (e.fingerprint = EXCLUDED.fingerprint)::int,
                reject_count = e.reject_count + (e.fingerprint <> EXCLUDED.fingerprint)::int,
                last_seen_at = CASE WHEN e.fingerprint = EXCLUDED.fingerprint
                                    THEN EXCLUDED.last_seen_at ELSE e.last_seen_at END
            RETURNING e.id, (e.xmax = 0), e.fingerprint, e.delivery_count INTO e_id, e_created, e_held, e_count;
            verdict := CASE WHEN e_created THEN 'accepted' WHEN e_held = r.fingerprint THEN 'duplicate'
                            ELSE 'rejected' END;
            IF verdict = 'accepted' THEN
                INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, lock_key, version, run_at,
                                  created_at, updated_at, trace_parent)
                VALUES (e_id, p_tenant, r.handler, r.max_attempts, r.orphan_policy, r.lock_key, r.version, v_now,
                        v_now, v_now, r.trace_parent)
                RETURNING jobs.id INTO j_id;
            ELSIF verdict = 'rejected' THEN
                INSERT INTO effect_rejects (effect_id, tenant, effect_key, source, event_id, event_type,
                                            held_fingerprint, rejected_fingerprint, rejected_payload, received_at)
                VALUES (e_id, p_tenant, r.effect_key, r.source, r.event_id, r.event_type, e_held, r.fingerprint,
                        r.body, v_now);
            END IF;
        END IF;
        INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, effect_id,
                                effect_key, outcome, fingerprint, secret_index, payload)
        VALUES (r.request_id, v_now, p_tenant, r.source, r.event_id, r.event_type, e_id, r.effect_key, verdict,
                r.fingerprint, r.secret_index, NULL);
        ord := r.ord; effect_id := e_id; outcome := verdict; delivery_count := e_count; held_fingerprint := e_held;
        job_id := j_id; version := r.version; latest_version := r.mark; notified := 0;
        RETURN NEXT;
    END LOOP;
    -- A body no handler asked for: one row per (source, body) ever seen, counted; its first delivery kept.
    FOR r IN
        SELECT i.source, i.fingerprint, count(*) AS n, min(i.ord) AS first
        FROM unnest(p_ord, p_effect_key, p_source, p_fingerprint) AS i(ord, effect_key, source, fingerprint)
        WHERE i.effect_key IS NULL
        GROUP BY i.source, i.fingerprint
        ORDER BY i.source COLLATE "C", i.fingerprint COLLATE "C"
    LOOP
        INSERT INTO unmatched_deliveries AS u (tenant, source, fingerprint, delivery_count, first_seen_at,
                                               last_seen_at)
        VALUES (p_tenant, r.source, r.fingerprint, r.n, v_now, v_now)
        ON CONFLICT (tenant, source, fingerprint) DO UPDATE SET
            delivery_count = u.delivery_count + EXCLUDED.delivery_count,
            last_seen_at = EXCLUDED.last_seen_at
        RETURNING (u.xmax = 0) INTO created;
        IF created THEN
            -- Read, then a single-row INSERT: an INSERT ... SELECT from unnest() is not a router write on Citus.
            SELECT i.request_id, i.event_id, i.event_type, i.secret_index, p_payloads[i.payload_ix]::jsonb AS body
            INTO d
            FROM unnest(p_ord, p_request_id, p_event_id, p_event_type, p_secret_index, p_payload_ix)
                AS i(ord, request_id, event_id, event_type, secret_index, payload_ix)
            WHERE i.ord = r.first;
            INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, effect_id,
                                    effect_key, outcome, fingerprint, secret_index, payload)
            VALUES (d.request_id, v_now, p_tenant, r.source, d.event_id, d.event_type, NULL, NULL, 'unmatched',
                    r.fingerprint, d.secret_index, d.body);
        END IF;
    END LOOP;
END
$fn$;

-- Pinned to this schema: Citus runs the call on a worker node in a session of its own, with no search_path of
-- ours (and a caller's own search_path must not decide which tables a claim writes).
DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[],'
                   ' text[], text[], int[], int[], text[], text[], int[], int8[], text[], text[], timestamptz)'
                   ' SET search_path = %I', current_schema());
END
$pin$;
