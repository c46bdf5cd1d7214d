-- The functions claimd installs run in a producer's transaction with the producer's rights, so
-- they must run only claimd's code: every name they call resolves to pg_catalog first, then to
-- claimd's tables in the schema these migrations run in, and to temporary objects last (left
-- out, pg_temp is searched first for tables). Before this, enqueue_bytes searched that schema
-- before pg_catalog: a role that may CREATE there could plant a public.sha256(bytea) that ran
-- as the producer. The other functions used the caller's search_path.
--
-- And the paths of the provider's URL a message may fill (effect.url, effect.status_url), which
-- every worker writes at start: a JSON array of segments, each {"fields": names, "parts": [..]}
-- where a part is literal text (a string), {"field": "key" | "message_id" | "tenant" |
-- "consumer"} or {"payload": [path steps]}. enqueue_bytes refuses what HTTP intake refuses
-- there (CD011): a segment the message makes '.', '..' (also percent-encoded) or empty.
ALTER TABLE claimd_consumers ADD COLUMN IF NOT EXISTS url_segments JSONB NOT NULL DEFAULT '[]';

-- SQLSTATEs as in 0014, and CD011: a value of the message would make a path segment of the
-- provider's URL '.', '..' or empty (the call would go to another path of the provider's API).
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
    doc jsonb;
    seg jsonb;
    part jsonb;
    at jsonb;
    step text;
    rendered text;
    form text;
    fault text;
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
    -- The URL's path segments as the message's values make them (PathFields::check): a
    -- segment whose payload field is missing or not text is not this check's business.
    IF jsonb_array_length(reg.url_segments) > 0 THEN
        BEGIN
            doc := convert_from(payload, 'UTF8')::jsonb;
        EXCEPTION WHEN others THEN
            doc := NULL;
        END;
        IF jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
            doc := NULL;
        END IF;
        <<segments>>
        FOR seg IN SELECT s.value FROM jsonb_array_elements(reg.url_segments) AS s LOOP
            rendered := '';
            FOR part IN SELECT p.value FROM jsonb_array_elements(seg -> 'parts') AS p LOOP
                IF jsonb_typeof(part) = 'string' THEN
                    rendered := rendered || (part #>> '{}');
                ELSIF part ? 'field' THEN
                    rendered := rendered || CASE part ->> 'field'
                        WHEN 'key' THEN key
                        WHEN 'message_id' THEN enqueue_bytes.message_id
                        WHEN 'tenant' THEN t
                        ELSE reg.name END;
                ELSE
                    CONTINUE segments WHEN doc IS NULL;
                    at := doc;
                    FOR step IN SELECT jsonb_array_elements_text(part -> 'payload') LOOP
                        IF jsonb_typeof(at) = 'object' THEN
                            at := at -> step;
                        ELSIF jsonb_typeof(at) = 'array' AND step ~ '^\+?[0-9]{1,9}$' THEN
                            at := at -> ltrim(step, '+')::integer;
                        ELSE
                            at := NULL;
                        END IF;
                        EXIT WHEN at IS NULL;
                    END LOOP;
                    CONTINUE segments WHEN at IS NULL OR jsonb_typeof(at) IN ('object', 'array');
                    rendered := rendered || CASE jsonb_typeof(at)
                        WHEN 'null' THEN '' ELSE at #>> '{}' END;
                END IF;
            END LOOP;
            -- segment_fault: empty; or '.' or '..' between '/' or '\', as it is or after
            -- percent-decoding any number of times (a proxy may decode what claimd encoded).
            -- A decoded byte that is NUL or not ASCII stands as '~': it can never make a dot
            -- segment, a separator or an escape.
            fault := CASE WHEN rendered = '' THEN 'an empty path segment (''//''), which proxies merge, sending the call to another path of the provider''s API' END;
            form := rendered;
            WHILE fault IS NULL LOOP
                IF EXISTS (SELECT 1 FROM regexp_split_to_table(form, '[/\\]') AS piece
                           WHERE piece IN ('.', '..')) THEN
                    fault := 'a dot segment (''.'' or ''..'', also percent-encoded), which would send the call to another path of the provider''s API';
                END IF;
                EXIT WHEN fault IS NOT NULL OR form !~ '%[0-9A-Fa-f]{2}';
                SELECT string_agg(CASE
                        WHEN m[1] IS NULL THEN m[2]
                        WHEN ('x' || m[1])::bit(8)::integer BETWEEN 1 AND 127
                            THEN chr(('x' || m[1])::bit(8)::integer)
                        ELSE '~' END, '' ORDER BY n)
                INTO form
                FROM regexp_matches(form, '%([0-9A-Fa-f]{2})|([^%]+|%)', 'g') WITH ORDINALITY AS r(m, n);
            END LOOP;
            IF fault IS NOT NULL THEN
                RAISE EXCEPTION 'URL field % is %: %', seg ->> 'fields',
                    quote_literal(left(rendered, 64)), fault USING ERRCODE = 'CD011';
            END IF;
        END LOOP;
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
        -- taken (0014 says why).
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

-- CREATE OR REPLACE above reset enqueue_bytes' settings: every function in schema claimd (the
-- enqueue functions, their helpers, the trigger's) gets the pinned path, naming the schema
-- claimd's tables are in.
DO $do$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'claimd' LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
            f, pg_catalog.current_schema());
    END LOOP;
END
$do$;
