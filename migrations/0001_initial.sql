-- The effect ledger, its jobs and what they recorded.
--
-- The one rule: an effect is claimed by (tenant, effect_key) under a unique constraint before it is
-- performed. Everything else here is either the work that claim created (jobs, attempts, steps) or
-- the record of what arrived (deliveries, rejects, signature failures).

CREATE TABLE effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text        NOT NULL,
    effect_key      text        NOT NULL,
    source          text        NOT NULL,
    handler         text        NOT NULL,
    event_id        text        NOT NULL,
    event_type      text        NOT NULL,
    fingerprint     text        NOT NULL,
    payload         jsonb       NOT NULL,
    delivery_count  integer     NOT NULL DEFAULT 1,
    reject_count    integer     NOT NULL DEFAULT 0,
    first_seen_at   timestamptz NOT NULL,
    last_seen_at    timestamptz NOT NULL,
    -- The arbiter of invariant 3: across every gateway replica, exactly one claim per key.
    CONSTRAINT effects_tenant_key_unique UNIQUE (tenant, effect_key)
);
CREATE INDEX effects_duplicates_idx ON effects (last_seen_at) WHERE delivery_count > 1;
CREATE INDEX effects_source_type_idx ON effects (source, event_type, last_seen_at);

CREATE TYPE job_state AS ENUM ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'parked');

CREATE TABLE jobs (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_id               bigint      NOT NULL UNIQUE REFERENCES effects (id),
    tenant                  text        NOT NULL,
    kind                    text        NOT NULL,
    state                   job_state   NOT NULL DEFAULT 'pending',
    attempt                 integer     NOT NULL DEFAULT 0,
    max_attempts            integer     NOT NULL,
    orphan_policy           text        NOT NULL CHECK (orphan_policy IN ('redrive', 'park')),
    run_at                  timestamptz NOT NULL,
    -- Fencing: every acquisition increments lease_token; every write after a claim matches it.
    lease_token             bigint      NOT NULL DEFAULT 0,
    lease_owner             text,
    lease_expires_at        timestamptz,
    checkpoint              jsonb,
    cancel_requested        boolean     NOT NULL DEFAULT false,
    -- Poison detection: a hand-back or orphaning counts as progress only if something was
    -- committed (checkpoint or step) since the previous one.
    committed_since_release boolean     NOT NULL DEFAULT false,
    releases_without_commit integer     NOT NULL DEFAULT 0,
    unrecoverable           boolean     NOT NULL DEFAULT false,
    last_error              jsonb,
    terminal_reason         text,
    terminal_by             text,
    created_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL,
    finished_at             timestamptz,
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'parked')) = (finished_at IS NOT NULL))
);
CREATE INDEX jobs_due_idx ON jobs (run_at, id) WHERE state = 'pending';
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_state_kind_idx ON jobs (state, kind, created_at);

CREATE TABLE job_attempts (
    job_id        bigint      NOT NULL REFERENCES jobs (id),
    attempt       integer     NOT NULL,
    lease_token   bigint      NOT NULL,
    worker        text        NOT NULL,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    outcome       text,
    error_type    text,
    error_message text,
    traceback     text,
    PRIMARY KEY (job_id, lease_token)
);

CREATE TABLE steps (
    effect_id       bigint      NOT NULL REFERENCES effects (id),
    name            text        NOT NULL,
    idempotency_key text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    result          jsonb,
    error           jsonb,
    job_id          bigint      NOT NULL REFERENCES jobs (id),
    lease_token     bigint      NOT NULL,
    recorded_at     timestamptz NOT NULL,
    -- A recorded step is never run again: the second recording of a name is refused here.
    PRIMARY KEY (effect_id, name)
);

CREATE TABLE deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id    text        NOT NULL,
    received_at   timestamptz NOT NULL,
    tenant        text        NOT NULL,
    source        text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text        NOT NULL,
    effect_id     bigint      REFERENCES effects (id),
    effect_key    text,
    outcome       text        NOT NULL CHECK (outcome IN ('accepted', 'duplicate', 'rejected', 'unmatched')),
    fingerprint   text        NOT NULL,
    secret_index  integer
);
CREATE INDEX deliveries_effect_idx ON deliveries (effect_id, received_at);
CREATE INDEX deliveries_received_idx ON deliveries (received_at);

CREATE TABLE effect_rejects (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_id            bigint      NOT NULL REFERENCES effects (id),
    tenant               text        NOT NULL,
    effect_key           text        NOT NULL,
    source               text        NOT NULL,
    event_id             text        NOT NULL,
    event_type           text        NOT NULL,
    held_fingerprint     text        NOT NULL,
    rejected_fingerprint text        NOT NULL,
    rejected_payload     jsonb       NOT NULL,
    received_at          timestamptz NOT NULL
);
CREATE INDEX effect_rejects_received_idx ON effect_rejects (received_at);

-- Authentication failures keep metadata only, one row per (source, reason, minute): a flood of
-- forged requests moves counters, it cannot grow the table without bound.
CREATE TABLE signature_failures (
    source           text        NOT NULL,
    reason           text        NOT NULL,
    minute           timestamptz NOT NULL,
    count            integer     NOT NULL,
    bytes_total      bigint      NOT NULL,
    last_body_sha256 text        NOT NULL,
    last_detail      text        NOT NULL,
    last_seen_at     timestamptz NOT NULL,
    PRIMARY KEY (source, reason, minute)
);
