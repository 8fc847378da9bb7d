-- Resolved by hand: an operator closes a failed or parked job without running it, saying who, why and when
-- (docs/adr/0016-resolved-by-hand.md). Until now such a job stayed failed or parked for the whole history
-- window, and the "waiting for a human" alert with it. 'resolved' is a state of its own, so everything that
-- asks "which jobs wait for a human" (the metrics gauge, the failed/parked reports, bulk filters) stops
-- counting it without a second condition to forget.
ALTER TYPE job_state ADD VALUE IF NOT EXISTS 'resolved';

-- The resolution, beside the terminal_reason/terminal_by of how the job ended: the failure stays readable.
-- resolved_from keeps which state was closed (failed or parked).
ALTER TABLE jobs ADD COLUMN resolved_at     timestamptz;
ALTER TABLE jobs ADD COLUMN resolved_by     text;
ALTER TABLE jobs ADD COLUMN resolved_reason text;
ALTER TABLE jobs ADD COLUMN resolved_from   job_state;
ALTER TABLE jobs ADD CONSTRAINT jobs_resolution_check CHECK (
    (resolved_at IS NULL) = (resolved_by IS NULL)
    AND (resolved_at IS NULL) = (resolved_reason IS NULL)
    AND (resolved_at IS NULL) = (resolved_from IS NULL)
    -- Compared as text: a value added to an enum cannot be used in the transaction that added it, and
    -- the migration runner applies this file in one.
    AND (resolved_at IS NULL) = (state::text <> 'resolved')
    AND (resolved_from IS NULL OR resolved_from::text IN ('failed', 'parked'))
);

-- Finished means: neither pending nor running. 0001 listed the terminal states, which 'resolved' is too.
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_finished_check
    CHECK ((state::text NOT IN ('pending', 'running')) = (finished_at IS NOT NULL));
