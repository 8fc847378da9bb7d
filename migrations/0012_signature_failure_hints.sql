-- What the gateway found out about a bucket of failed verifications after answering them: the re-encoded-body
-- diagnosis runs sampled and off the request path, so its result lands here, beside the counts, for the
-- rejects report. NULL when nothing was diagnosed or nothing was found. Never a body, never a secret.
ALTER TABLE signature_failures ADD COLUMN hint text;
