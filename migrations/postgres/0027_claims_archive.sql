-- The archive of finished claims ([retention] archive_after, docs/operations.md "Retention").
--
-- A finished claim older than archive_after leaves `claims` (whose unique index is what stops a
-- second payment, so it stays as small as the redelivery horizon) for `claims_archive`, with
-- its history (`claim_events` rows, as JSON) and the moment its retention ends (`retain_until`:
-- its last change plus the window of its state). The archive is partitioned by the UTC month of
-- `retain_until`, so retention drops a whole month's partition once the month is over instead
-- of deleting rows one by one: no dead rows, no vacuum debt. Months, not days: a read of the
-- archive locks every partition and its indexes, so ten years of windows stay 120 partitions.
--
-- The columns after the first three are `claims`' own, in the same order: the move is
-- `INSERT INTO claims_archive SELECT retain_until, now(), history, claims.*`. A migration that
-- adds a column to `claims` adds it here too, in the same place (a test checks both lists).
CREATE TABLE IF NOT EXISTS claims_archive (
    retain_until TIMESTAMPTZ NOT NULL,
    archived_utc TIMESTAMPTZ NOT NULL,
    history      JSONB       NOT NULL,
    LIKE claims
) PARTITION BY RANGE (retain_until);

-- What reads archived claims (operators' reads only; the paths that claim and settle never
-- do): `claims show` and the API by message, the history by claim id, listings newest first
-- (all, by consumer, by tenant: the page, `claims list`, erasure by tenant), the ledger
-- reconciliation in key order, and payload retention (claims not erased yet).
CREATE INDEX IF NOT EXISTS claims_archive_message
    ON claims_archive (consumer, tenant, message_id, id);
CREATE INDEX IF NOT EXISTS claims_archive_id ON claims_archive (id);
CREATE INDEX IF NOT EXISTS claims_archive_received ON claims_archive (received_utc, id);
CREATE INDEX IF NOT EXISTS claims_archive_consumer_received
    ON claims_archive (consumer, received_utc, id);
CREATE INDEX IF NOT EXISTS claims_archive_tenant_received
    ON claims_archive (tenant, received_utc, id);
CREATE INDEX IF NOT EXISTS claims_archive_ledger
    ON claims_archive (consumer, idem_key COLLATE "C", id);
CREATE INDEX IF NOT EXISTS claims_archive_unerased
    ON claims_archive (consumer, updated_utc) WHERE erased_utc IS NULL;

-- The partitions, created and dropped by the runtime role through these two functions only: it
-- has no CREATE anywhere (docs/postgresql.md), and these run as the archive's owner. Neither
-- takes a name: the first creates the partitions of the months of the days it is given (at most
-- 400 at once, within a hundred years of today), the second drops the partitions whose month is
-- over, whose rows' retention has therefore ended; a caller can do nothing with them that
-- retention would not. Each waits at most 500 ms for the archive's lock (a long read of it holds
-- that lock): retention tries again at its next run rather than queue every reader behind it.
CREATE OR REPLACE FUNCTION claimd.claims_archive_months(days date[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    schema_name text;
    m date;
    part text;
    made integer := 0;
    this_month date := pg_catalog.date_trunc('month', pg_catalog.now() AT TIME ZONE 'UTC')::date;
BEGIN
    IF pg_catalog.cardinality(days) > 400 THEN
        RAISE EXCEPTION 'at most 400 days at once, not %', pg_catalog.cardinality(days)
            USING ERRCODE = 'CD013';
    END IF;
    SELECT n.nspname INTO schema_name FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'claims_archive'::regclass;
    FOR m IN SELECT DISTINCT pg_catalog.date_trunc('month', x)::date
             FROM pg_catalog.unnest(days) AS x WHERE x IS NOT NULL LOOP
        IF m < this_month - 36525 OR m > this_month + 36525 THEN
            RAISE EXCEPTION 'month % is more than a hundred years from today', m
                USING ERRCODE = 'CD013';
        END IF;
        part := 'claims_archive_p' || pg_catalog.to_char(m, 'YYYYMM');
        IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, part)) IS NULL THEN
            EXECUTE pg_catalog.format(
                'CREATE TABLE %I.%I PARTITION OF %I.claims_archive FOR VALUES FROM (%L) TO (%L)',
                schema_name, part, schema_name,
                pg_catalog.to_char(m, 'YYYY-MM-DD') || ' 00:00:00+00',
                pg_catalog.to_char((m + interval '1 month')::date, 'YYYY-MM-DD') || ' 00:00:00+00');
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END
$fn$;

CREATE OR REPLACE FUNCTION claimd.drop_claims_archive_months() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    part record;
    dropped integer := 0;
    this_month date := pg_catalog.date_trunc('month', pg_catalog.now() AT TIME ZONE 'UTC')::date;
BEGIN
    FOR part IN
        SELECT n.nspname AS schema_name, c.relname AS name
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE i.inhparent = 'claims_archive'::regclass
          AND c.relname ~ '^claims_archive_p[0-9]{6}$'
          AND pg_catalog.to_date(pg_catalog.substr(c.relname, 17) || '01', 'YYYYMMDD')
              < this_month
    LOOP
        EXECUTE pg_catalog.format('DROP TABLE %I.%I', part.schema_name, part.name);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$fn$;

-- As in 0018: every function in schema claimd runs with the pinned path.
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION claimd.claims_archive_months(date[]) SET search_path = pg_catalog, %I, pg_temp',
        pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION claimd.drop_claims_archive_months() SET search_path = pg_catalog, %I, pg_temp',
        pg_catalog.current_schema());
END
$do$;
ALTER FUNCTION claimd.claims_archive_months(date[]) SET lock_timeout = '500ms';
ALTER FUNCTION claimd.drop_claims_archive_months() SET lock_timeout = '500ms';

-- Only the roles that may delete claims (the runtime role) may run them, through the schema
-- they are in; producers may not.
REVOKE ALL ON FUNCTION claimd.claims_archive_months(date[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION claimd.drop_claims_archive_months() FROM PUBLIC;
DO $do$
DECLARE
    grantee_name text;
BEGIN
    FOR grantee_name IN
        SELECT DISTINCT r.rolname
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) a
        JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = 'claims'::regclass
          AND a.grantee <> c.relowner
          AND a.privilege_type = 'DELETE'
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA claimd TO %I', grantee_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION claimd.claims_archive_months(date[]), '
            'claimd.drop_claims_archive_months() TO %I', grantee_name);
    END LOOP;
END
$do$;
