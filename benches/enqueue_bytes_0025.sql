-- `claimd.enqueue_bytes` as migration 0025 made it (before 0029 put the helpers' fast paths in
-- it), for measuring enqueue against it:
--   BENCH_EXTRA_SQL="$(cat benches/enqueue_bytes_0025.sql)" cargo bench --features full --bench producers
-- (run on each bench database after claimd migrated it; docs/performance.md). Back to
-- 0029's: psql -d DB -f migrations/postgres/0029_enqueue_inline_checks.sql
CREATE OR REPLACE FUNCTION claimd.enqueue_bytes(
    consumer text, message_id text, payload bytea,
    tenant text DEFAULT '', content_type text DEFAULT 'application/json',
    priority integer DEFAULT 0,
    OUT id bigint, OUT created boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    reg claimd_consumers%ROWTYPE;
    t text := COALESCE(enqueue_bytes.tenant, '');
    ct text := COALESCE(enqueue_bytes.content_type, '');
    media text;
    key text;
    fp text := pg_catalog.encode(pg_catalog.sha256(payload), 'hex');
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
            pg_catalog.quote_literal(COALESCE(enqueue_bytes.consumer, '')) USING ERRCODE = 'CD001';
    END IF;
    PERFORM claimd.check_token('Idempotency-Key', enqueue_bytes.message_id, false);
    PERFORM claimd.check_token('Tenant-Id', t, true);
    IF enqueue_bytes.priority IS NULL OR enqueue_bytes.priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'priority % is not an integer from -100 to 100',
            COALESCE(enqueue_bytes.priority::text, 'NULL') USING ERRCODE = 'CD012';
    END IF;
    IF t <> '' AND NOT reg.keys_tenant THEN
        RAISE EXCEPTION 'consumer % does not key on tenants (key template % lacks {tenant}): send no tenant, or add {tenant} to its key',
            pg_catalog.quote_literal(reg.name), pg_catalog.quote_literal(reg.key_template)
            USING ERRCODE = 'CD003';
    END IF;
    IF pg_catalog.length(pg_catalog.convert_to(ct, 'UTF8')) > 255 OR ct ~ '[^\t\x20-\x7E]' THEN
        RAISE EXCEPTION 'Content-Type must be up to 255 printable ASCII characters'
            USING ERRCODE = 'CD007';
    END IF;
    IF pg_catalog.length(payload) > reg.max_payload_bytes THEN
        RAISE EXCEPTION 'the body is over the limit of % bytes ([http] max_body_bytes)',
            reg.max_payload_bytes USING ERRCODE = 'CD005';
    END IF;
    media := pg_catalog.lower(pg_catalog.btrim(pg_catalog.split_part(ct, ';', 1)));
    IF media = 'application/json' OR media ~ '^[^/]+/.*\+json$' THEN
        BEGIN
            PERFORM pg_catalog.convert_from(payload, 'UTF8')::jsonb;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'the body is not valid JSON (% declares JSON): %', media, SQLERRM
                USING ERRCODE = 'CD006';
        END;
    END IF;
    key := pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(reg.key_template,
        '{consumer}', claimd.key_part(reg.name)),
        '{tenant}', claimd.key_part(t)),
        '{message_id}', enqueue_bytes.message_id);
    IF pg_catalog.octet_length(key) > reg.max_key_length THEN
        RAISE EXCEPTION 'the idempotency key for this message would be % characters (key template %); the provider''s limit is % (effect.max_key_length): use a shorter message id or tenant',
            pg_catalog.octet_length(key), pg_catalog.quote_literal(reg.key_template),
            reg.max_key_length USING ERRCODE = 'CD004';
    END IF;
    -- The URL's path segments as the message's values make them (PathFields::check): a
    -- segment whose payload field is missing or not text is not this check's business.
    IF pg_catalog.jsonb_array_length(reg.url_segments) > 0 THEN
        BEGIN
            doc := pg_catalog.convert_from(payload, 'UTF8')::jsonb;
        EXCEPTION WHEN others THEN
            doc := NULL;
        END;
        IF pg_catalog.jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
            doc := NULL;
        END IF;
        <<segments>>
        FOR seg IN SELECT s.value FROM pg_catalog.jsonb_array_elements(reg.url_segments) AS s LOOP
            rendered := '';
            FOR part IN SELECT p.value
                        FROM pg_catalog.jsonb_array_elements(seg -> 'parts'::text) AS p LOOP
                IF pg_catalog.jsonb_typeof(part) = 'string' THEN
                    rendered := rendered || (part #>> '{}'::text[]);
                ELSIF part ? 'field'::text THEN
                    rendered := rendered || CASE part ->> 'field'::text
                        WHEN 'key' THEN key
                        WHEN 'message_id' THEN enqueue_bytes.message_id
                        WHEN 'tenant' THEN t
                        ELSE reg.name END;
                ELSE
                    CONTINUE segments WHEN doc IS NULL;
                    at := doc;
                    FOR step IN SELECT pg_catalog.jsonb_array_elements_text(part -> 'payload'::text) LOOP
                        IF pg_catalog.jsonb_typeof(at) = 'object' THEN
                            at := at -> step;
                        ELSIF pg_catalog.jsonb_typeof(at) = 'array' AND step ~ '^\+?[0-9]{1,9}$' THEN
                            at := at -> pg_catalog.ltrim(step, '+')::integer;
                        ELSE
                            at := NULL;
                        END IF;
                        EXIT WHEN at IS NULL;
                    END LOOP;
                    CONTINUE segments
                        WHEN at IS NULL OR pg_catalog.jsonb_typeof(at) IN ('object', 'array');
                    rendered := rendered || CASE pg_catalog.jsonb_typeof(at)
                        WHEN 'null' THEN '' ELSE at #>> '{}'::text[] END;
                END IF;
            END LOOP;
            -- segment_fault: empty; or '.' or '..' between '/' or '\', as it is or after
            -- percent-decoding any number of times (a proxy may decode what claimd encoded).
            -- A decoded byte that is NUL or not ASCII stands as '~': it can never make a dot
            -- segment, a separator or an escape.
            fault := CASE WHEN rendered = '' THEN 'an empty path segment (''//''), which proxies merge, sending the call to another path of the provider''s API' END;
            form := rendered;
            -- A dot segment needs a '.' or, encoded, a '%': a segment with neither is fine
            -- (the usual case: no decoding to run).
            IF fault IS NULL AND pg_catalog.strpos(form, '.') = 0
               AND pg_catalog.strpos(form, '%') = 0 THEN
                CONTINUE segments;
            END IF;
            WHILE fault IS NULL LOOP
                IF EXISTS (SELECT 1 FROM pg_catalog.regexp_split_to_table(form, '[/\\]') AS piece
                           WHERE piece IN ('.', '..')) THEN
                    fault := 'a dot segment (''.'' or ''..'', also percent-encoded), which would send the call to another path of the provider''s API';
                END IF;
                EXIT WHEN fault IS NOT NULL OR form !~ '%[0-9A-Fa-f]{2}';
                SELECT pg_catalog.string_agg(CASE
                        WHEN m[1] IS NULL THEN m[2]
                        WHEN ('x' || m[1])::bit(8)::integer BETWEEN 1 AND 127
                            THEN pg_catalog.chr(('x' || m[1])::bit(8)::integer)
                        ELSE '~' END, '' ORDER BY n)
                INTO form
                FROM pg_catalog.regexp_matches(form, '%([0-9A-Fa-f]{2})|([^%]+|%)', 'g')
                    WITH ORDINALITY AS r(m, n);
            END LOOP;
            IF fault IS NOT NULL THEN
                RAISE EXCEPTION 'URL field % is %: %', seg ->> 'fields'::text,
                    pg_catalog.quote_literal(pg_catalog.left(rendered, 64)), fault
                    USING ERRCODE = 'CD011';
            END IF;
        END LOOP;
    END IF;
    INSERT INTO claims AS c (consumer, tenant, message_id, idem_key, fingerprint, payload,
        content_type, lease_owner, lease_until, handoff, handoff_attempt, priority)
    VALUES (reg.name, t, enqueue_bytes.message_id, key, fp, payload, ct, NULL,
        pg_catalog.now() + interval '60 seconds', 'not_called', 1, enqueue_bytes.priority)
    ON CONFLICT ON CONSTRAINT claims_identity DO NOTHING
    RETURNING c.id INTO id;
    IF id IS NOT NULL THEN
        created := true;
        -- The doorbell rings at commit (claims_enqueued_bell, below).
        RETURN;
    END IF;
    SELECT c.id, c.fingerprint INTO id, old_fp FROM claims c
    WHERE c.consumer = reg.name AND c.tenant = t AND c.message_id = enqueue_bytes.message_id;
    IF old_fp IS DISTINCT FROM fp THEN
        RAISE EXCEPTION 'consumer %, tenant %, message id %: already used with a different payload (idempotency key %)',
            pg_catalog.quote_literal(reg.name), pg_catalog.quote_literal(t),
            pg_catalog.quote_literal(enqueue_bytes.message_id), pg_catalog.quote_literal(key)
            USING ERRCODE = 'CD009';
    END IF;
    UPDATE claims c SET duplicate_count = c.duplicate_count + 1 WHERE c.id = enqueue_bytes.id;
    created := false;
END
$fn$;

DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION claimd.enqueue_bytes(text, text, bytea, text, text, integer) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END
$do$;
