//! Store URLs as claimd shows and accepts them: credentials redacted wherever a URL is printed
//! ([`redact_url`]), and the `[store] url` checked at configuration load ([`check_url`]).

#[cfg(not(all(feature = "postgres", feature = "sqlite")))]
use crate::domain::features::missing;

/// Query parameters whose values are shown (`sslmode=require`): settings that are never
/// secrets. Every other parameter's value is redacted: a deny-list of secret names would miss
/// the next provider's `sig=` or `X-Amz-Signature=`.
const HARMLESS_PARAMS: [&str; 27] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "mode",
    "cache",
    "immutable",
    "vfs",
    "heartbeat",
    "connection_timeout",
    "channel_max",
    "frame_max",
    "auth_mechanism",
];

/// The query parameters the PostgreSQL driver reads (sqlx's `PgConnectOptions`); it logs any
/// other one *with its value* ("ignoring unrecognized connect parameter"), so a mistyped
/// `passwd=` would put the password in the log: [`check_url`] refuses them first.
const POSTGRES_PARAMS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url` as claimd prints it (errors, logs, report, page): the password of the user part
/// (`user:***@host`) and the value of every query parameter not known to be harmless
/// (`?password=***&sig=***&sslmode=require`) replaced. A value that is only a template field
/// (`ref={message_id}`) is configuration, not a secret, and is kept.
///
/// Works on text that is not a valid URL too (a mistyped `postgres//user:pw@host/db` is shown
/// as `postgres//user:***@host/db`), and on passwords with `?`, `#`, `/` or `@` in them, typed
/// without percent-encoding: when the part after `//` has a `user:` before any `/`, `?` or
/// `#`, everything from that `:` to the last `@` is the password. (A query value holding an
/// `@` then hides more than the password, never less.)
pub fn redact_url(url: &str) -> String {
    // The authority starts after `//`; without one, everything before the last `@` is
    // treated as credentials.
    let start = url.find("//").map(|i| i + 2).unwrap_or(0);
    let (head, rest) = url.split_at(start);
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    let first_delimiter = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let colon = rest.find(':').filter(|&c| c < first_delimiter);
    let rest = match (colon, rest.rfind('@')) {
        // `user:password@`, the password possibly holding delimiters itself.
        (Some(colon), Some(at)) if colon < at => {
            out.push_str(&rest[..colon]);
            out.push_str(":***");
            &rest[at..]
        }
        _ => {
            // No password before the host: a user alone (`claimd@db`) is shown; an `@` in
            // the query or fragment is not credentials.
            let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
            match rest[..query_at].rfind('@') {
                Some(at) => {
                    let userinfo = &rest[..at];
                    match userinfo.split_once(':') {
                        Some((user, _password)) => {
                            out.push_str(user);
                            out.push_str(":***");
                        }
                        None => out.push_str(userinfo),
                    }
                    &rest[at..]
                }
                None => rest,
            }
        }
    };
    let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
    let (before_query, query) = rest.split_at(query_at);
    out.push_str(before_query);
    let Some(params) = query.strip_prefix('?') else {
        // A fragment alone: it is not sent anywhere, but it may hold anything.
        if !query.is_empty() {
            out.push_str("#***");
        }
        return out;
    };
    let (params, fragment) = params.split_at(params.find('#').unwrap_or(params.len()));
    out.push('?');
    let redacted: Vec<String> = params
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if harmless(k) || is_template_field(v) => pair.to_string(),
            Some((k, _)) => format!("{k}=***"),
            // No `=`: a typo like `password:hunter2` is all value.
            None if pair.is_empty() || harmless(pair) => pair.to_string(),
            None => "***".to_string(),
        })
        .collect();
    out.push_str(&redacted.join("&"));
    if !fragment.is_empty() {
        out.push_str("#***");
    }
    out
}

fn harmless(key: &str) -> bool {
    HARMLESS_PARAMS.contains(&key.to_ascii_lowercase().as_str())
}

/// `{message_id}`: one template field, written in the configuration.
fn is_template_field(v: &str) -> bool {
    v.len() > 2 && v.starts_with('{') && v.ends_with('}') && !v[1..v.len() - 1].contains(['{', '}'])
}

/// A parameter name for an error: quoted when it looks like a name, else not shown (a typo
/// like `password:hunter2` has no `=` and is all name).
fn shown_name(k: &str) -> String {
    if !k.is_empty()
        && k.len() <= 32
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        format!("{k:?}")
    } else {
        "(a name not shown)".into()
    }
}

/// The query parameters of a `postgres://` URL the driver does not read, by name only (their
/// values may be secrets).
fn unknown_postgres_params(url: &str) -> Vec<String> {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return Vec::new();
    };
    parsed
        .query_pairs()
        .map(|(k, _)| k.into_owned())
        .filter(|k| !POSTGRES_PARAMS.contains(&k.as_str()) && !k.starts_with("options["))
        .collect()
}

/// One server's `postgres://` URL: only parameters the driver reads, and parsed by it.
fn check_postgres_url(url: &str) -> Result<(), String> {
    // Before the driver parses it: the driver would log an unknown one with its value.
    let unknown = unknown_postgres_params(url);
    if !unknown.is_empty() {
        return Err(format!(
            "{}: unknown connection parameter{} {} (values not shown); the driver reads {}",
            redact_url(url),
            if unknown.len() == 1 { "" } else { "s" },
            unknown
                .iter()
                .map(|k| shown_name(k))
                .collect::<Vec<_>>()
                .join(", "),
            POSTGRES_PARAMS.join(", ")
        ));
    }
    #[cfg(not(feature = "postgres"))]
    return Err(format!("{}: {}", redact_url(url), missing("postgres")));
    #[cfg(feature = "postgres")]
    return std::str::FromStr::from_str(url)
        .map(|_: sqlx::postgres::PgConnectOptions| ())
        .map_err(|e| {
            format!(
                "{}: not a PostgreSQL URL the driver can read ({})",
                redact_url(url),
                redact_url(&e.to_string())
            )
        });
}

/// Checks a `[store] url` at configuration load: `sqlite:...`, or a `postgres://` /
/// `postgresql://` URL the driver can parse. The error shows the URL redacted.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("sqlite:") {
        #[cfg(not(feature = "sqlite"))]
        return Err(format!("{}: {}", redact_url(url), missing("sqlite")));
        #[cfg(feature = "sqlite")]
        return std::str::FromStr::from_str(url)
            .map(|_: sqlx::sqlite::SqliteConnectOptions| ())
            .map_err(|e| format!("{}: {e}", redact_url(url)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // A host list (`h1:5432,h2:5432`) and `target_session_attrs` are claimd's to read.
        let targets =
            super::hosts::split_hosts(url).map_err(|e| format!("{}: {e}", redact_url(url)))?;
        for one in &targets.urls {
            check_postgres_url(one)?;
        }
        return Ok(());
    }
    Err(format!(
        "{}: must start with sqlite: or postgres:// (postgresql://)",
        redact_url(url)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn passwords_and_secret_parameters_are_redacted_from_urls() {
        for (url, want) in [
            (
                "postgres://claimd:hunter2@db:5432/claims",
                "postgres://claimd:***@db:5432/claims",
            ),
            (
                "postgres//claimd:hunter2@db/claims",
                "postgres//claimd:***@db/claims",
            ),
            (
                "postgresql+tls://claimd:hunter2@db/claims",
                "postgresql+tls://claimd:***@db/claims",
            ),
            ("postgres://u:p@ss:w@rd@db/x", "postgres://u:***@db/x"),
            (
                "postgres://db/x?user=u&password=hunter2&sslmode=require",
                "postgres://db/x?user=u&password=***&sslmode=require",
            ),
            (
                "amqp://guest:guest@rabbit:5672/%2f",
                "amqp://guest:***@rabbit:5672/%2f",
            ),
            ("postgres://claimd@db/claims", "postgres://claimd@db/claims"),
            ("sqlite://claimd.db", "sqlite://claimd.db"),
            ("user:hunter2@db", "user:***@db"),
            // Passwords typed with URL delimiters in them.
            ("postgres://u:hunt?er2@db/x", "postgres://u:***@db/x"),
            ("postgres://u:hunt#er2@db/x", "postgres://u:***@db/x"),
            ("postgres://u:hu@nt?e#r/2@db/x", "postgres://u:***@db/x"),
            (
                "postgres://u:p?w@db/x?sslmode=require",
                "postgres://u:***@db/x?sslmode=require",
            ),
            // Every query value but known settings: no deny-list to miss `sig=`.
            (
                "https://api.example/v1/pay?sig=hunter2&X-Amz-Signature=hunter2&ref={message_id}",
                "https://api.example/v1/pay?sig=***&X-Amz-Signature=***&ref={message_id}",
            ),
            (
                "postgres://db/x?passwd=hunter2&application_name=claimd",
                "postgres://db/x?passwd=***&application_name=claimd",
            ),
            (
                "https://api.example/v1/pay#hunter2",
                "https://api.example/v1/pay#***",
            ),
            ("postgres://db/x?password:hunter2", "postgres://db/x?***"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn store_urls_are_checked_without_printing_the_password() {
        assert!(check_url("sqlite://claimd.db").is_ok());
        assert!(check_url("postgres://claimd:pw@db:5432/claims").is_ok());
        for bad in [
            "postgres//claimd:hunter2@db/claims",
            "postgresql+tls://claimd:hunter2@db/claims",
            "postgres://claimd:hunter2@db:notaport/claims",
            "mysql://claimd:hunter2@db/claims",
        ] {
            let e = check_url(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{e}");
        }
        // A mistyped parameter is refused by name before the driver (which would log its
        // value) sees it.
        let e = check_url("postgres://claimd@db/claims?passwd=hunter2").unwrap_err();
        assert!(
            e.contains("\"passwd\"") && e.contains("unknown connection parameter"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            check_url("postgres://claimd@db/claims?sslmode=require&application_name=c").is_ok()
        );
        // A host list with the attribute libpq reads, checked server by server.
        assert!(
            check_url(
                "postgres://claimd:pw@db1:5432,db2:5433/claims?target_session_attrs=read-write"
            )
            .is_ok()
        );
        let e = check_url("postgres://claimd:hunter2@db1,db2:x/claims").unwrap_err();
        assert!(!e.contains("hunter2") && e.contains("db2:x"), "{e}");
        let e = check_url("postgres://claimd@db/claims?password:hunter2").unwrap_err();
        assert!(!e.contains("hunter2") && e.contains("not shown"), "{e}");
        let e = StoreError::BadUrl("mysql://u:hunter2@db/x".into()).to_string();
        assert!(!e.contains("hunter2") && e.contains("u:***@db"), "{e}");
    }
}
