-- Broker messages claimd refused and published to the consumer's dead-letter exchange (no or
-- bad message id, body too large, payload mismatch, a payload the effect cannot use): one row
-- per dead-lettering, for the `dead_lettered` count in `report`. The message itself, with its
-- `claimd-reason` header, is in the broker's `<queue>.dead` queue; this table holds no payload.
CREATE TABLE dead_letters (
    id         BIGSERIAL   PRIMARY KEY,
    consumer   TEXT        NOT NULL,
    -- Reason class: missing_message_id, invalid_message_id, invalid_tenant, body_too_large,
    -- payload_mismatch, unusable_payload.
    reason     TEXT        NOT NULL,
    -- As received, made printable and cut to 255 bytes; NULL when the message had none.
    message_id TEXT,
    at_utc     TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Report windows and retention.
CREATE INDEX dead_letters_at ON dead_letters (at_utc);
