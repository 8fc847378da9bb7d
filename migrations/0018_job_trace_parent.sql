-- The W3C traceparent of the delivery span that claimed a job, when tracing was on at the claim: each attempt's
-- span links to it, so a trace goes from a job to the request that created it. NULL when tracing was off (and
-- for every job claimed before this migration). Adding a nullable column without a default rewrites nothing.
ALTER TABLE jobs ADD COLUMN trace_parent text;
