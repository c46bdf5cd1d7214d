-- Operator accounts: one credential per person, kept as a salted PBKDF2 hash
-- (domain::credential), with a role (viewer | operator | admin). A disabled account keeps its
-- row (its name stays in the audit) and signs in no more.
CREATE TABLE IF NOT EXISTS operators (
    name            TEXT        PRIMARY KEY,
    role            TEXT        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    credential_hash TEXT        NOT NULL,
    created_utc     TIMESTAMPTZ NOT NULL DEFAULT now(),
    disabled_utc    TIMESTAMPTZ
);

-- The operator audit: who did what to what, when, from where, and how it ended. Append-only:
-- rows are inserted and read, never changed or deleted, and retention never prunes it.
CREATE TABLE IF NOT EXISTS operator_audit (
    id     BIGSERIAL   PRIMARY KEY,
    at_utc TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor  TEXT        NOT NULL,
    source TEXT        NOT NULL,
    action TEXT        NOT NULL,
    target TEXT        NOT NULL DEFAULT '',
    origin TEXT        NOT NULL DEFAULT '',
    result TEXT        NOT NULL,
    detail TEXT        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS operator_audit_at ON operator_audit (at_utc);
CREATE INDEX IF NOT EXISTS operator_audit_actor ON operator_audit (actor, id);

-- Nobody changes or deletes an audit row, whatever their grants: the owner too would have to
-- drop these triggers first (which is itself DDL that database logs can show).
CREATE OR REPLACE FUNCTION claimd.refuse_audit_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'operator_audit is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$fn$;
-- Its path pinned like every function in schema claimd (0018).
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION claimd.refuse_audit_change() SET search_path = pg_catalog, %I, pg_temp',
        pg_catalog.current_schema());
END
$do$;
DROP TRIGGER IF EXISTS operator_audit_append_only ON operator_audit;
CREATE TRIGGER operator_audit_append_only BEFORE UPDATE OR DELETE ON operator_audit
    FOR EACH ROW EXECUTE FUNCTION claimd.refuse_audit_change();
DROP TRIGGER IF EXISTS operator_audit_no_truncate ON operator_audit;
CREATE TRIGGER operator_audit_no_truncate BEFORE TRUNCATE ON operator_audit
    FOR EACH STATEMENT EXECUTE FUNCTION claimd.refuse_audit_change();

-- Least privilege: the runtime role (granted SELECT, INSERT, UPDATE, DELETE on every new table
-- by the owner's default privileges, docs/postgresql.md) keeps only INSERT and SELECT here.
-- Every role but the table's owner loses UPDATE, DELETE and TRUNCATE.
REVOKE UPDATE, DELETE, TRUNCATE ON operator_audit FROM PUBLIC;
DO $do$
DECLARE
    grantee_name text;
BEGIN
    FOR grantee_name IN
        SELECT DISTINCT r.rolname
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) a
        JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = 'operator_audit'::regclass
          AND a.grantee <> c.relowner
          AND a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE')
    LOOP
        EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON operator_audit FROM %I', grantee_name);
    END LOOP;
END
$do$;
