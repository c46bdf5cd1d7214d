-- Operator accounts and the append-only operator audit (see
-- migrations/postgres/0019_operators_audit.sql). Times are INTEGER milliseconds.
CREATE TABLE IF NOT EXISTS operators (
    name            TEXT    PRIMARY KEY,
    role            TEXT    NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    credential_hash TEXT    NOT NULL,
    created_utc     INTEGER NOT NULL,
    disabled_utc    INTEGER
);

CREATE TABLE IF NOT EXISTS operator_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at_utc INTEGER NOT NULL,
    actor  TEXT    NOT NULL,
    source TEXT    NOT NULL,
    action TEXT    NOT NULL,
    target TEXT    NOT NULL DEFAULT '',
    origin TEXT    NOT NULL DEFAULT '',
    result TEXT    NOT NULL,
    detail TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS operator_audit_at ON operator_audit (at_utc);
CREATE INDEX IF NOT EXISTS operator_audit_actor ON operator_audit (actor, id);

-- Append-only: an UPDATE or DELETE of an audit row is refused.
CREATE TRIGGER IF NOT EXISTS operator_audit_no_update BEFORE UPDATE ON operator_audit
BEGIN
    SELECT RAISE(ABORT, 'operator_audit is append-only: UPDATE refused');
END;
CREATE TRIGGER IF NOT EXISTS operator_audit_no_delete BEFORE DELETE ON operator_audit
BEGIN
    SELECT RAISE(ABORT, 'operator_audit is append-only: DELETE refused');
END;
