-- The job-release rule, written once. A job leaves 'running' without finishing in two ways: its worker hands
-- the slice back (budget spent, draining), or its lease expires and the lease rescuer takes it. Both ask
-- the same questions in the same order — a cancel that was asked wins; then a job released N times in a row
-- without committing anything is poison and parked; then (an orphan only) its kind's orphan policy — so the
-- rule lives here and both statements call it. LANGUAGE sql, IMMUTABLE, one SELECT: the planner inlines it, so a call
-- costs what the CASE it replaces cost.

-- How many releases in a row without a commit this release makes: a commit since the last release resets
-- the count (the job made progress), otherwise it grows by one.
CREATE FUNCTION job_release_count(committed_since_release boolean, releases_without_commit integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN committed_since_release THEN 0 ELSE releases_without_commit + 1 END $$;

-- What a release makes of the job: 'cancelled', 'poison', or the orphan policy ('redrive' | 'park'). A
-- hand-back passes 'redrive': a slice that hands back is re-queued at once unless cancel or poison win.
CREATE FUNCTION job_release_verdict(
    cancel_requested boolean,
    committed_since_release boolean,
    releases_without_commit integer,
    poison_threshold integer,
    orphan_policy text
)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE
    WHEN cancel_requested THEN 'cancelled'
    WHEN NOT committed_since_release AND releases_without_commit + 1 >= poison_threshold THEN 'poison'
    WHEN orphan_policy = 'redrive' THEN 'redrive'
    ELSE 'park'
END $$;

-- Paused kinds: an operator stops the leasing of one handler's jobs during a downstream outage
-- (`effectgate jobs pause --kind K`); claims still land (a webhook must be acknowledged), the jobs wait
-- pending, and resume wakes the workers. A handful of rows; the fetch reads it per call.
CREATE TABLE paused_kinds (
    kind      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by text        NOT NULL,
    reason    text
);
