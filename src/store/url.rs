//! Store URLs as claimd shows and accepts them: credentials redacted wherever a URL is printed
//! ([`redact_url`]), and the `[store] url` checked at configuration load ([`check_url`]).

/// Query parameters whose values are secrets (libpq's `password`, tokens in HTTP URLs).
const SECRET_PARAMS: [&str; 8] = [
    "password",
    "sslpassword",
    "pass",
    "token",
    "secret",
    "access_token",
    "api_key",
    "apikey",
];

/// `url` as claimd prints it (errors, logs, report, page): the password of the user part
/// (`user:***@host`) and the values of secret query parameters (`?password=***`) replaced.
///
/// Works on text that is not a valid URL too (a mistyped `postgres//user:pw@host/db` is shown
/// as `postgres//user:***@host/db`): whatever precedes the last `@` of the authority is
/// credentials.
pub fn redact_url(url: &str) -> String {
    // The authority starts after `//`; without one, everything before the last `@` is
    // treated as credentials.
    let start = url.find("//").map(|i| i + 2).unwrap_or(0);
    let (head, rest) = url.split_at(start);
    let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
    let (before_query, query) = rest.split_at(query_at);
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    match before_query.rfind('@') {
        Some(at) => {
            let userinfo = &before_query[..at];
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&before_query[at..]);
        }
        None => out.push_str(before_query),
    }
    let Some(params) = query.strip_prefix('?') else {
        out.push_str(query);
        return out;
    };
    let (params, fragment) = params.split_at(params.find('#').unwrap_or(params.len()));
    out.push('?');
    let redacted: Vec<String> = params
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()) => {
                format!("{k}=***")
            }
            _ => pair.to_string(),
        })
        .collect();
    out.push_str(&redacted.join("&"));
    out.push_str(fragment);
    out
}

/// Checks a `[store] url` at configuration load: `sqlite:...`, or a `postgres://` /
/// `postgresql://` URL the driver can parse. The error shows the URL redacted.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("sqlite:") {
        return std::str::FromStr::from_str(url)
            .map(|_: sqlx::sqlite::SqliteConnectOptions| ())
            .map_err(|e| format!("{}: {e}", redact_url(url)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
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
        let e = StoreError::BadUrl("mysql://u:hunter2@db/x".into()).to_string();
        assert!(!e.contains("hunter2") && e.contains("u:***@db"), "{e}");
    }
}
