-- A step that declares how to find what it made (ctx.step(name, fn, find=…)) first records that it is
-- *starting*: a committed 'started' row for (effect, step), written under the lease before the downstream
-- call. A later attempt that finds the row still 'started' knows the call may have reached the API without
-- its answer being recorded, and asks find(key) before it creates again: exactly-once against an API that
-- takes no idempotency key (issue 19). The outcome later replaces the marker in place (the same primary key,
-- so "a step is never recorded twice" still holds for succeeded and failed). Steps without find never write
-- a marker, so their path is unchanged.
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_status_check;
ALTER TABLE steps ADD CONSTRAINT steps_status_check CHECK (status IN ('started', 'succeeded', 'failed'));
