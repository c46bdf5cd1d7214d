//! The PostgreSQL statements of operator accounts and the operator audit.

use crate::store::audit::AccountStatements;

/// Operator accounts and the audit.
pub(crate) const ACCOUNT_STATEMENTS: AccountStatements = AccountStatements {
    insert_operator: "INSERT INTO operators (name, role, credential_hash) VALUES ($1, $2, $3) \
        ON CONFLICT (name) DO NOTHING",
    get_operator: "SELECT name, role, credential_hash, created_utc, disabled_utc \
        FROM operators WHERE name = $1",
    list_operators: "SELECT name, role, credential_hash, created_utc, disabled_utc \
        FROM operators ORDER BY name",
    disable_operator: "UPDATE operators SET disabled_utc = now() \
        WHERE name = $1 AND disabled_utc IS NULL",
    set_operator_role: "UPDATE operators SET role = $2 WHERE name = $1",
    insert_audit: "INSERT INTO operator_audit \
        (actor, source, action, target, origin, result, detail) \
        VALUES ($1, $2, $3, $4, $5, $6, $7)",
    list_audit: "SELECT id, at_utc, actor, source, action, target, origin, result, detail \
        FROM operator_audit \
        WHERE ($1::timestamptz IS NULL OR at_utc >= $1) AND ($2::text IS NULL OR actor = $2) \
          AND ($3::bigint IS NULL OR id < $3) \
        ORDER BY id DESC LIMIT $4",
};
