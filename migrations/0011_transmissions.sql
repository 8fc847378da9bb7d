-- Transmissions a provider signed, remembered while their signature can still be accepted (PayPal's
-- transmission ids). PayPal's signature covers the body only through a CRC32, which anyone can match with a
-- few chosen bytes; the transmission id is signed, so a captured delivery whose body was forged to the same
-- CRC still carries the captured id. Remembering which body each id came with (its SHA-256) lets the
-- gateway refuse the same id with another body, on every replica, since they all ask this one table.
--
-- A row is useful only while a delivery naming its id can pass the signed-time window: the id is signed
-- together with its transmission time, so past that time plus the tolerance no delivery with that id is
-- accepted again. expires_at is exactly that instant, and the statement that remembers an id also deletes
-- a few expired rows: the table holds about one window of transmissions, with no scheduler.
--
-- Keyed by source, read after the signature and before the tenant is known: a local (reference) table.
CREATE TABLE transmissions (
    source          text        NOT NULL,
    transmission_id text        NOT NULL,
    body_sha256     text        NOT NULL,
    expires_at      timestamptz NOT NULL,
    first_seen_at   timestamptz NOT NULL,
    last_seen_at    timestamptz NOT NULL,
    seen_count      bigint      NOT NULL DEFAULT 1,
    PRIMARY KEY (source, transmission_id)
);

-- The bounded sweep in transmission_remember_first takes the oldest expired rows.
CREATE INDEX transmissions_expires_at_idx ON transmissions (expires_at);
