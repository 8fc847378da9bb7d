-- The attempt's outcome, written once (issue 52). A worker ends an attempt in one of three statements of
-- ledger/sql/jobs.sql (finish, retry, hand-back), and each closes the attempt's row with the job's new state
-- read off as an outcome. Only a job that went back to 'pending' is read differently by each: the statement
-- names it (a retry is 'retry', a hand-back 'handed_back'); every other state is its own name, which also
-- covers a cancel that won inside any of the three.
--
-- The enum spelled out, not `state::text`: the enum's cast to text is STABLE, and Citus refuses a STABLE function
-- over a column in an UPDATE; a comparison of two job_state values is IMMUTABLE. LANGUAGE sql, IMMUTABLE, one
-- SELECT: the planner inlines it, so a call costs what the CASE it replaces cost (as the release rule of 0006).
-- Versioned from the start (docs/adr/0017-versioned-sql-functions.md): a change is a _v2 beside it.
-- 'running' has no outcome (NULL): no statement closes an attempt on a job that still runs.
CREATE FUNCTION job_attempt_outcome_v1(state job_state, requeued text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE
    WHEN state = 'succeeded' THEN 'succeeded'
    WHEN state = 'failed' THEN 'failed'
    WHEN state = 'parked' THEN 'parked'
    WHEN state = 'cancelled' THEN 'cancelled'
    WHEN state = 'pending' THEN requeued
END $$;
