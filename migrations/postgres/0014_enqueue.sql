-- Transactional enqueue (docs/producers.md): a producer inserts a claim in its own
-- transaction, through claimd.enqueue(...) or the Rust claimd::enqueue; the claim exists if and
-- only if that transaction commits, and a worker takes it after the commit.

-- What a producer's transaction needs to know of each consumer to refuse what HTTP intake
-- refuses. Every worker upserts its configured consumers at start and never deletes one:
-- instances of a rolling deploy may configure different sets.
CREATE TABLE IF NOT EXISTS claimd_consumers (
    name              TEXT        PRIMARY KEY,
    key_template      TEXT        NOT NULL,
    max_key_length    INTEGER     NOT NULL,
    keys_tenant       BOOLEAN     NOT NULL,
    max_payload_bytes BIGINT      NOT NULL,
    updated_utc       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Enqueued claims no worker has taken yet (no lease owner): the pickup's one indexed read.
CREATE INDEX IF NOT EXISTS claims_enqueued ON claims (consumer, id)
    WHERE state = 'started' AND lease_owner IS NULL;

CREATE SCHEMA IF NOT EXISTS claimd;

-- The rendering of KeyTemplate::render: a tenant or consumer keeps letters, digits, '.', '_'
-- and '-'; every other byte of its UTF-8 is written %XX.
CREATE OR REPLACE FUNCTION claimd.key_part(value text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT COALESCE(string_agg(
        CASE WHEN ch ~ '^[A-Za-z0-9._-]$' THEN ch
             ELSE upper(regexp_replace(encode(convert_to(ch, 'UTF8'), 'hex'), '(..)', '%\1', 'g'))
        END, '' ORDER BY n), '')
    FROM regexp_split_to_table(value, '') WITH ORDINALITY AS t(ch, n)
$fn$;

-- The checks of domain::claim::validate_message_id / validate_tenant: up to 255 visible ASCII
-- characters (0x21..0x7E); a message id may not be empty.
CREATE OR REPLACE FUNCTION claimd.check_token(what text, value text, empty_ok boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    bytes bytea := convert_to(COALESCE(value, ''), 'UTF8');
    pos integer;
BEGIN
    IF length(bytes) = 0 AND NOT empty_ok THEN
        RAISE EXCEPTION 'missing %', what USING ERRCODE = 'CD002';
    END IF;
    IF length(bytes) > 255 THEN
        RAISE EXCEPTION '% is % characters long; the limit is 255', what, length(bytes)
            USING ERRCODE = 'CD002';
    END IF;
    FOR pos IN 0 .. length(bytes) - 1 LOOP
        IF get_byte(bytes, pos) NOT BETWEEN 33 AND 126 THEN
            RAISE EXCEPTION '% contains a character that is not visible ASCII at position %',
                what, pos USING ERRCODE = 'CD002';
        END IF;
    END LOOP;
END
$fn$;

-- One message into a claim, in the caller's transaction. Returns the claim's id and whether
-- it was new (false: a duplicate with the same payload, counted on the claim). SQLSTATEs:
-- CD001 unknown consumer, CD002 bad message id or tenant, CD003 a tenant for a consumer whose
-- key does not mention {tenant}, CD004 key too long, CD005 payload too large, CD006 a body
-- declared JSON that does not parse, CD007 bad content type, CD009 the message id was already
-- used with another payload.
CREATE OR REPLACE FUNCTION claimd.enqueue_bytes(
    consumer text, message_id text, payload bytea,
    tenant text DEFAULT '', content_type text DEFAULT 'application/json',
    OUT id bigint, OUT created boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    reg claimd_consumers%ROWTYPE;
    t text := COALESCE(enqueue_bytes.tenant, '');
    ct text := COALESCE(enqueue_bytes.content_type, '');
    media text;
    key text;
    fp text := encode(sha256(payload), 'hex');
    old_fp text;
BEGIN
    SELECT * INTO reg FROM claimd_consumers c WHERE c.name = enqueue_bytes.consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown consumer %: no worker has registered it (start a worker configured with it first)',
            quote_literal(COALESCE(enqueue_bytes.consumer, '')) USING ERRCODE = 'CD001';
    END IF;
    PERFORM claimd.check_token('Idempotency-Key', enqueue_bytes.message_id, false);
    PERFORM claimd.check_token('Tenant-Id', t, true);
    IF t <> '' AND NOT reg.keys_tenant THEN
        RAISE EXCEPTION 'consumer % does not key on tenants (key template % lacks {tenant}): send no tenant, or add {tenant} to its key',
            quote_literal(reg.name), quote_literal(reg.key_template) USING ERRCODE = 'CD003';
    END IF;
    IF length(convert_to(ct, 'UTF8')) > 255 OR ct ~ '[^\t\x20-\x7E]' THEN
        RAISE EXCEPTION 'Content-Type must be up to 255 printable ASCII characters'
            USING ERRCODE = 'CD007';
    END IF;
    IF length(payload) > reg.max_payload_bytes THEN
        RAISE EXCEPTION 'the body is over the limit of % bytes ([http] max_body_bytes)',
            reg.max_payload_bytes USING ERRCODE = 'CD005';
    END IF;
    media := lower(trim(split_part(ct, ';', 1)));
    IF media = 'application/json' OR media ~ '^[^/]+/.*\+json$' THEN
        BEGIN
            PERFORM convert_from(payload, 'UTF8')::jsonb;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'the body is not valid JSON (% declares JSON): %', media, SQLERRM
                USING ERRCODE = 'CD006';
        END;
    END IF;
    key := replace(replace(replace(reg.key_template,
        '{consumer}', claimd.key_part(reg.name)),
        '{tenant}', claimd.key_part(t)),
        '{message_id}', enqueue_bytes.message_id);
    IF octet_length(key) > reg.max_key_length THEN
        RAISE EXCEPTION 'the idempotency key for this message would be % characters (key template %); the provider''s limit is % (effect.max_key_length): use a shorter message id or tenant',
            octet_length(key), quote_literal(reg.key_template), reg.max_key_length
            USING ERRCODE = 'CD004';
    END IF;
    INSERT INTO claims AS c (consumer, tenant, message_id, idem_key, fingerprint, payload,
        content_type, lease_owner, lease_until, handoff, handoff_attempt)
    VALUES (reg.name, t, enqueue_bytes.message_id, key, fp, payload, ct, NULL,
        now() + interval '60 seconds', 'not_called', 1)
    ON CONFLICT ON CONSTRAINT claims_identity DO NOTHING
    RETURNING c.id INTO id;
    IF id IS NOT NULL THEN
        created := true;
        -- The doorbell rings only when no earlier enqueued claim of this consumer waits to be
        -- taken: a waiting one means a worker was woken and is taking, and keeps looking
        -- for a while after (engine::enqueued). A notifying commit holds a lock every other
        -- notifying commit of the cluster waits for, so ringing on every enqueue would
        -- serialize busy producers' commits.
        IF NOT EXISTS (SELECT 1 FROM claims w
                       WHERE w.consumer = reg.name AND w.state = 'started'
                         AND w.lease_owner IS NULL AND w.id < enqueue_bytes.id) THEN
            PERFORM pg_notify('claimd_enqueued', reg.name);
        END IF;
        RETURN;
    END IF;
    SELECT c.id, c.fingerprint INTO id, old_fp FROM claims c
    WHERE c.consumer = reg.name AND c.tenant = t AND c.message_id = enqueue_bytes.message_id;
    IF old_fp IS DISTINCT FROM fp THEN
        RAISE EXCEPTION 'consumer %, tenant %, message id %: already used with a different payload (idempotency key %)',
            quote_literal(reg.name), quote_literal(t), quote_literal(enqueue_bytes.message_id),
            quote_literal(key) USING ERRCODE = 'CD009';
    END IF;
    UPDATE claims c SET duplicate_count = c.duplicate_count + 1 WHERE c.id = enqueue_bytes.id;
    created := false;
END
$fn$;

-- A JSON payload, stored as jsonb writes it (its canonical text: keys sorted, spaces fixed).
CREATE OR REPLACE FUNCTION claimd.enqueue(
    consumer text, message_id text, payload jsonb,
    tenant text DEFAULT '', content_type text DEFAULT 'application/json',
    OUT id bigint, OUT created boolean)
LANGUAGE sql AS $fn$
    SELECT * FROM claimd.enqueue_bytes(consumer, message_id, convert_to(payload::text, 'UTF8'),
        tenant, content_type)
$fn$;

-- The functions find claimd's tables in the schema these migrations ran in, whatever the
-- caller's search_path.
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION claimd.enqueue_bytes(text, text, bytea, text, text) SET search_path = %I, pg_catalog', current_schema());
END
$do$;
