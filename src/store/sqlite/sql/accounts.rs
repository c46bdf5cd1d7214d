//! The SQLite statements of operator accounts and the operator audit (times in INTEGER
//! milliseconds from SQLite's clock).

use crate::store::audit::AccountStatements;

/// Operator accounts and the audit.
pub(crate) const ACCOUNT_STATEMENTS: AccountStatements = AccountStatements {
    insert_operator: concat!(
        "INSERT INTO operators (name, role, credential_hash, created_utc) VALUES (?1, ?2, ?3, ",
        now_ms!(),
        ") ON CONFLICT (name) DO NOTHING"
    ),
    get_operator: "SELECT name, role, credential_hash, created_utc, disabled_utc \
        FROM operators WHERE name = ?1",
    list_operators: "SELECT name, role, credential_hash, created_utc, disabled_utc \
        FROM operators ORDER BY name",
    disable_operator: concat!(
        "UPDATE operators SET disabled_utc = ",
        now_ms!(),
        " WHERE name = ?1 AND disabled_utc IS NULL"
    ),
    set_operator_role: "UPDATE operators SET role = ?2 WHERE name = ?1",
    insert_audit: concat!(
        "INSERT INTO operator_audit \
         (at_utc, actor, source, action, target, origin, result, detail) VALUES (",
        now_ms!(),
        ", ?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    ),
    list_audit: "SELECT id, at_utc, actor, source, action, target, origin, result, detail \
        FROM operator_audit \
        WHERE (?1 IS NULL OR at_utc >= ?1) AND (?2 IS NULL OR actor = ?2) \
          AND (?3 IS NULL OR id < ?3) \
        ORDER BY id DESC LIMIT ?4",
};
