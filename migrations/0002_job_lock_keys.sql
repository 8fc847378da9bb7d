-- Lock keys: a kind may name a lock key per effect (say, the order) so that two effects on the same
-- thing never run at the same time.
--
-- A webhook gateway cannot refuse a claim because a lock key is busy: the delivery must be
-- acknowledged, and a refused claim would only make the provider send it again. So claims always
-- insert their job; what the key limits is *running*. At most one running job per (tenant, lock key),
-- enforced here by a partial unique index, not by application code: later jobs with the key wait
-- pending until the holder leaves 'running' (a fetch skips them; a racing fetch that slips past that
-- filter is refused by this index and changes nothing). A job whose worker vanished keeps the key
-- until the reconciler takes it off 'running', so an abandoned step never overlaps its successor.

ALTER TABLE jobs ADD COLUMN lock_key text;

CREATE UNIQUE INDEX jobs_lock_key_running_unique ON jobs (tenant, lock_key)
    WHERE state = 'running' AND lock_key IS NOT NULL;

-- The fetch asks "is this key held?" and a redrive asks "is another live job waiting on it?".
CREATE INDEX jobs_lock_key_live_idx ON jobs (tenant, lock_key)
    WHERE state IN ('pending', 'running') AND lock_key IS NOT NULL;
