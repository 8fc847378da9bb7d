-- A record an auditor can read (issue 38, item 4). Three additions, each read by the effect's timeline.
-- (Numbered 0025 on its branch; if another branch took 0025 first, this file takes the next free number: nothing
-- in it depends on its place after 0024.)
--
-- 1. job_actions: every operator action on a job — redrive, cancel, resolve by hand, and the replay that created
--    it — with who, when, why and what the action saw (force, the recorded failures a redrive replays, the
--    delivery a replay came from). Written by one function (ledger/jobs/audit.py record) in the same transaction
--    as the action, so an action without its record, or a record without its action, cannot commit. The job's
--    own columns (terminal_by, resolved_*) say how it stands now; this table says everything that was done to it.
--    Keyed with tenant like job_attempts (0022): distributed by tenant, colocated with effects. ON DELETE CASCADE:
--    retention deletes a job with its history, and a previous release's retention, still draining during an
--    upgrade, names no job_actions in its statements.
CREATE TABLE job_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    tenant      text NOT NULL,
    job_id      bigint NOT NULL,
    action      text NOT NULL CHECK (action IN ('redrive', 'cancel', 'resolve', 'replay')),
    acted_by    text NOT NULL,
    reason      text,
    -- What the action saw: {"force": true, "replays": [{"step", "code", "message"}]}, {"delivery", "from"}, …
    detail      jsonb,
    acted_at    timestamptz NOT NULL,
    PRIMARY KEY (id, tenant),
    FOREIGN KEY (job_id, tenant) REFERENCES jobs (id, tenant) ON DELETE CASCADE
);
CREATE INDEX job_actions_job_idx ON job_actions (job_id, acted_at);

-- Resolutions made before this file have their record on the job row; they join the log, so the timeline reads
-- one place.
INSERT INTO job_actions (tenant, job_id, action, acted_by, reason, detail, acted_at)
SELECT tenant, id, 'resolve', resolved_by, resolved_reason, jsonb_build_object('from', resolved_from::text), resolved_at
FROM jobs WHERE resolved_at IS NOT NULL;

-- 2. kind_actions: pause and resume act on a handler kind, not on a job. One row per action (not one per job of the
--    kind: a pause with a million pending jobs writes one row); a job's timeline reads its kind's rows within the
--    job's lifetime (kind_actions_for_kind_between). paused_kinds says what is paused now; this says what was.
--    Kinds are code, not tenant data: a reference table on Citus, as paused_kinds.
CREATE TABLE kind_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL,
    action      text NOT NULL CHECK (action IN ('pause', 'resume')),
    acted_by    text NOT NULL,
    reason      text,
    acted_at    timestamptz NOT NULL
);
CREATE INDEX kind_actions_kind_idx ON kind_actions (kind, acted_at);

-- 3a. A step whose outcome came from find= (an earlier attempt's call that reached the API, found by its key) says
--     so: it was found, not called. false for every other step, and for the previous release's inserts.
ALTER TABLE steps ADD COLUMN found boolean NOT NULL DEFAULT false;

-- 3b. An attempt keeps what the provider said beside the error's type and message: the HTTP status, the
--     provider's request id (Stripe's Request-Id, PayPal's debug_id), the decline code and the error code —
--     {"code", "http_status", "request_id", "decline_code"}, each only when known; NULL when none is.
ALTER TABLE job_attempts ADD COLUMN error_facts jsonb;
