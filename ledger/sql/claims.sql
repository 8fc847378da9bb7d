-- name: effect_claim_batch
-- Claims the effects of many deliveries in one statement: new keys get a claim and a job, the same payload is
-- counted a duplicate, another payload is recorded as a reject, a version older than its object's newest is
-- recorded superseded; every delivery gets its rows (an unmatched body
-- only the first time it is seen, later ones counted); workers are woken.
-- Entries are parallel arrays, one element per effect (effect_key NULL: a delivery no handler asked for);
-- payloads are sent once per delivery (the payloads array, indexed by payload_ix). The arrays go in binary:
-- psycopg dumps a text array in Python, escaping every quote of every JSON payload (~1 ms a batch of 32).
-- A key appears at most once per statement (ledger/claims.py splits repeats into rounds): ON CONFLICT DO
-- UPDATE may touch a row only once. Rows are inserted in (tenant, key) order under the C collation, as Python sorts them, so concurrent batches
-- lock their keys in one global order and cannot deadlock. DO UPDATE (not DO NOTHING) so a claim committed
-- concurrently by another replica is locked and returned to us: a DO NOTHING would leave the snapshot blind.
WITH input AS (
    SELECT * FROM unnest(%(ord)b::int[], %(request_id)b::text[], %(tenant)b::text[], %(effect_key)b::text[],
                         %(source)b::text[], %(handler)b::text[], %(event_id)b::text[], %(event_type)b::text[],
                         %(fingerprint)b::text[], %(payload_ix)b::int[], %(max_attempts)b::int[],
                         %(orphan_policy)b::text[], %(lock_key)b::text[], %(secret_index)b::int[],
                         %(version)b::int8[], %(trace_parent)b::text[])
        AS i(ord, request_id, tenant, effect_key, source, handler, event_id, event_type, fingerprint,
             payload_ix, max_attempts, orphan_policy, lock_key, secret_index, version, trace_parent)
),
payloads AS (
    SELECT p.ix::int AS ix, p.body::jsonb AS body FROM unnest(%(payloads)b::text[]) WITH ORDINALITY AS p(body, ix)
),
latest AS (
    -- Latest wins per object (migrations/0020): raise each (tenant, kind, lock key)'s high-water mark to the
    -- newest version of this batch. DO UPDATE locks the row, so a concurrent batch for the same object waits
    -- for our commit and then compares against our mark, not its own snapshot's: racing deliveries resolve
    -- as if they ran one after another. Batch-mates are concurrent, so the newest of them is taken to have
    -- arrived first. Rows are locked in C order, before any effect key (the sort below needs all of this).
    INSERT INTO effect_versions AS v (tenant, kind, lock_key, version, updated_at)
    SELECT i.tenant, i.handler, i.lock_key, max(i.version), coalesce(%(now)s, now())
    FROM input i WHERE i.version IS NOT NULL AND i.lock_key IS NOT NULL
    GROUP BY i.tenant, i.handler, i.lock_key
    ORDER BY i.tenant COLLATE "C", i.handler COLLATE "C", i.lock_key COLLATE "C"
    ON CONFLICT (tenant, kind, lock_key) DO UPDATE SET
        version = GREATEST(v.version, EXCLUDED.version),
        updated_at = CASE WHEN EXCLUDED.version > v.version THEN EXCLUDED.updated_at ELSE v.updated_at END
    RETURNING v.tenant, v.kind, v.lock_key, v.version
),
versioned AS (
    -- Older than the mark: superseded, never claimed. An equal version goes on to the usual duplicate and
    -- conflict rules.
    SELECT i.*, l.version AS latest_version, coalesce(i.version < l.version, false) AS superseded
    FROM input i LEFT JOIN latest l ON l.tenant = i.tenant AND l.kind = i.handler AND l.lock_key = i.lock_key
),
claim AS (
    INSERT INTO effects AS e (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                              first_seen_at, last_seen_at)
    SELECT i.tenant, i.effect_key, i.source, i.handler, i.event_id, i.event_type, i.fingerprint, p.body,
           coalesce(%(now)s, now()), coalesce(%(now)s, now())
    FROM versioned i JOIN payloads p ON p.ix = i.payload_ix
    WHERE i.effect_key IS NOT NULL AND NOT i.superseded
    ORDER BY i.tenant COLLATE "C", i.effect_key COLLATE "C"
    ON CONFLICT (tenant, effect_key) DO UPDATE SET
        delivery_count = e.delivery_count + (e.fingerprint = EXCLUDED.fingerprint)::int,
        reject_count = e.reject_count + (e.fingerprint <> EXCLUDED.fingerprint)::int,
        last_seen_at = CASE WHEN e.fingerprint = EXCLUDED.fingerprint
                            THEN EXCLUDED.last_seen_at ELSE e.last_seen_at END
    RETURNING e.id, e.tenant, e.effect_key, (e.xmax = 0) AS created, e.fingerprint AS held_fingerprint,
              e.delivery_count
),
outcome AS (
    SELECT i.*, c.id AS effect_id, c.delivery_count, c.held_fingerprint,
           CASE WHEN c.created THEN 'accepted'
                WHEN c.held_fingerprint = i.fingerprint THEN 'duplicate'
                ELSE 'rejected' END AS outcome
    FROM versioned i JOIN claim c ON c.tenant = i.tenant AND c.effect_key = i.effect_key
    UNION ALL
    SELECT i.*, NULL::bigint, NULL::int, NULL::text, 'superseded'
    FROM versioned i WHERE i.effect_key IS NOT NULL AND i.superseded
),
unmatched AS (
    -- One row per (tenant, source, body) ever seen unmatched: a replayed unmatched delivery is counted, and gets
    -- no second deliveries row. Grouped first, so repeats within this batch touch the row only once.
    INSERT INTO unmatched_deliveries AS u (tenant, source, fingerprint, delivery_count, first_seen_at, last_seen_at)
    SELECT i.tenant, i.source, i.fingerprint, count(*), coalesce(%(now)s, now()), coalesce(%(now)s, now())
    FROM input i WHERE i.effect_key IS NULL
    GROUP BY i.tenant, i.source, i.fingerprint
    ORDER BY i.tenant COLLATE "C", i.source COLLATE "C", i.fingerprint COLLATE "C"
    ON CONFLICT (tenant, source, fingerprint) DO UPDATE SET
        delivery_count = u.delivery_count + EXCLUDED.delivery_count,
        last_seen_at = EXCLUDED.last_seen_at
    RETURNING u.tenant, u.source, u.fingerprint, (u.xmax = 0) AS created
),
job AS (
    INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, lock_key, version, run_at,
                      created_at, updated_at, trace_parent)
    SELECT effect_id, tenant, handler, max_attempts, orphan_policy, lock_key, version,
           coalesce(%(now)s, now()), coalesce(%(now)s, now()), coalesce(%(now)s, now()), trace_parent
    FROM outcome WHERE outcome = 'accepted'
    RETURNING id, effect_id, kind
),
delivery AS (
    -- An unmatched delivery keeps its payload (for the payload window) so it can be replayed once a handler
    -- exists; a claimed one's payload lives on its effect.
    INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, effect_id, effect_key,
                            outcome, fingerprint, secret_index, payload)
    SELECT request_id, coalesce(%(now)s, now()), tenant, source, event_id, event_type, effect_id, effect_key,
           outcome, fingerprint, secret_index, NULL::jsonb
    FROM outcome
    UNION ALL
    (SELECT DISTINCT ON (i.tenant, i.source, i.fingerprint)
            i.request_id, coalesce(%(now)s, now()), i.tenant, i.source, i.event_id, i.event_type, NULL, NULL,
            'unmatched', i.fingerprint, i.secret_index, p.body
     FROM input i JOIN payloads p ON p.ix = i.payload_ix
          JOIN unmatched s ON s.tenant = i.tenant AND s.source = i.source AND s.fingerprint = i.fingerprint
     WHERE i.effect_key IS NULL AND s.created
     ORDER BY i.tenant, i.source, i.fingerprint, i.ord)
),
reject AS (
    INSERT INTO effect_rejects (effect_id, tenant, effect_key, source, event_id, event_type, held_fingerprint,
                                rejected_fingerprint, rejected_payload, received_at)
    SELECT o.effect_id, o.tenant, o.effect_key, o.source, o.event_id, o.event_type, o.held_fingerprint,
           o.fingerprint, p.body, coalesce(%(now)s, now())
    FROM outcome o JOIN payloads p ON p.ix = o.payload_ix
    WHERE o.outcome = 'rejected'
),
woken AS (
    -- One wake-up per kind and batch: a wake-up only says "fetch now", and Postgres folds repeats anyway.
    SELECT count(pg_notify('effectgate_jobs', k.kind)) AS n FROM (SELECT DISTINCT kind FROM job) k
)
SELECT o.ord, o.effect_id, o.outcome, o.delivery_count, o.held_fingerprint, j.id AS job_id,
       o.version, o.latest_version, (SELECT n FROM woken) AS notified
FROM outcome o LEFT JOIN job j ON j.effect_id = o.effect_id;

-- name: signature_failure_count
-- Counts a failed verification in its (source, reason, minute) bucket; never stores the body.
INSERT INTO signature_failures AS f (source, reason, minute, count, bytes_total, last_body_sha256, last_detail,
                                     last_seen_at)
VALUES (%(source)s, %(reason)s, date_trunc('minute', coalesce(%(now)s, now())), 1, %(size)s, %(body_sha256)s,
        %(detail)s, coalesce(%(now)s, now()))
ON CONFLICT (source, reason, minute) DO UPDATE SET
    count = f.count + 1,
    bytes_total = f.bytes_total + EXCLUDED.bytes_total,
    last_body_sha256 = EXCLUDED.last_body_sha256,
    last_detail = EXCLUDED.last_detail,
    last_seen_at = EXCLUDED.last_seen_at;

-- name: session_schema_set
-- Points this session's search_path at effectgate's schema alone (quoted, so any name is taken literally).
SELECT set_config('search_path', quote_ident(%(schema)s), false);

-- name: session_timeouts_set
-- Sets this session's lock_timeout and statement_timeout (milliseconds as text; '0' is no limit).
SELECT set_config('lock_timeout', %(lock_timeout)s, false), set_config('statement_timeout', %(statement_timeout)s, false);

-- name: session_server_bounds_set
-- Sets this session's server-side bounds on a client that is gone (ledger/db.py, SERVER_BOUNDS): how long it may sit
-- idle inside a transaction (milliseconds as text; '0' is no limit), and the server's own TCP keepalives and user
-- timeout, so the server ends the session — and frees its locks — without waiting for the client to come back.
SELECT set_config('idle_in_transaction_session_timeout', %(idle_in_transaction)s, false),
       set_config('tcp_keepalives_idle', %(keepalives_idle)s, false),
       set_config('tcp_keepalives_interval', %(keepalives_interval)s, false),
       set_config('tcp_keepalives_count', %(keepalives_count)s, false),
       set_config('tcp_user_timeout', %(user_timeout)s, false);

-- name: session_writable_check
-- Whether this session can write: false on a standby (in recovery) or a server whose sessions start read-only, so a
-- pool never hands out a connection that landed on a standby during a failover (ledger/db.py, _check_writable).
-- And the primary's WAL timeline (the first 8 hex digits of the current WAL file's name; no privilege needed, unlike
-- pg_control_checkpoint), which a promotion raises (ledger/timeline.py); null on a standby.
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END AS timeline;

-- name: effect_keys_locked
-- Of the given (tenant, effect key) pairs, those whose effect row another transaction holds locked now (a
-- claim's ON CONFLICT DO UPDATE would wait for it); SKIP LOCKED, so it never waits itself.
WITH wanted AS (
    SELECT DISTINCT w.tenant, w.effect_key
    FROM unnest(%(tenant)s::text[], %(effect_key)s::text[]) AS w(tenant, effect_key)
),
present AS (
    SELECT e.tenant, e.effect_key FROM effects e JOIN wanted w ON e.tenant = w.tenant AND e.effect_key = w.effect_key
),
free AS (
    SELECT e.tenant, e.effect_key FROM effects e JOIN wanted w ON e.tenant = w.tenant AND e.effect_key = w.effect_key
    FOR NO KEY UPDATE OF e SKIP LOCKED
)
SELECT tenant, effect_key FROM present
EXCEPT
SELECT tenant, effect_key FROM free;

-- name: effect_claim_tenant
-- The claim for entries of one tenant through effect_claim_tenant_v1 (migration 0023), which Citus runs whole
-- on the tenant's node when called outside a transaction block; the same parameters as effect_claim_batch.
SELECT * FROM effect_claim_tenant_v1(%(tenant_id)b::text, %(ord)b::int[], %(request_id)b::text[], %(tenant)b::text[],
    %(effect_key)b::text[], %(source)b::text[], %(handler)b::text[], %(event_id)b::text[], %(event_type)b::text[],
    %(fingerprint)b::text[], %(payload_ix)b::int[], %(max_attempts)b::int[], %(orphan_policy)b::text[],
    %(lock_key)b::text[], %(secret_index)b::int[], %(version)b::int8[], %(trace_parent)b::text[],
    %(payloads)b::text[], %(now)s::timestamptz);

-- name: claim_tenant_distributed
-- Whether effect_claim_tenant_v1 in this schema is a Citus distributed function (`effectgate migrate` made it
-- one, ledger/distribution.py); asked only where jobs is distributed.
SELECT EXISTS (
    SELECT 1 FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
    WHERE o.classid = 'pg_proc'::regclass AND p.proname = 'effect_claim_tenant_v1'
      AND p.pronamespace = current_schema()::regnamespace
      -- By its tenant argument: Citus 12 also lists a function it merely propagated (no argument; not routed).
      AND o.distribution_argument_index IS NOT NULL
) AS distributed;

-- name: effects_held_of
-- Of one tenant's given effect keys, those the ledger holds (so the rest are missing): after a failover, the check of
-- the claims a gateway answered 2xx for that the new primary never received (gateway/ingress/acknowledged.py). One
-- index-only scan of effects_tenant_key_unique, and on Citus a router statement to the tenant's shard. (A join of
-- unnest() with effects was a hash anti-join reading all of effects at 50,000 keys, and Citus refuses one:
-- tests/integration/ledger/test_query_plans.py, tests/citus/test_ledger_on_citus.py.)
SELECT effect_key
FROM effects
WHERE tenant = %(tenant)s AND effect_key = ANY(%(keys)s::text[]);
