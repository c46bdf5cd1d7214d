//! `[http] tenant_tokens`: intake tokens that each speak for one tenant. A request with a
//! tenant's token may submit and read only that tenant's messages (`http::auth` checks the
//! tenant header); `[http] intake_token` speaks for every tenant.

use super::HttpConfig;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Tenant name → its intake token (`acme = "${ACME_INTAKE_TOKEN}"`). Its `Debug` shows the
/// tenant names only: the tokens are secrets.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct TenantTokens(pub BTreeMap<String, String>);

impl std::fmt::Debug for TenantTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl TenantTokens {
    /// Whether no tenant token is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tenant whose token `token` is. Every configured token is compared, in constant
    /// time, whichever matches: the time taken says nothing about which tenant (or none).
    pub fn tenant_of(&self, token: &[u8]) -> Option<&str> {
        let mut found = None;
        for (tenant, expected) in &self.0 {
            if crate::domain::constant_time::constant_time_eq(token, expected.as_bytes()) {
                found = Some(tenant.as_str());
            }
        }
        found
    }
}

impl HttpConfig {
    /// The key that signs the operator page's session cookies: the admin token when set,
    /// else `session_secret`. Empty: nobody signs in, and the operations routes answer
    /// loopback requests only (see `http::guard`), as the open local identity.
    pub fn session_key(&self) -> &str {
        if self.admin_token.is_empty() {
            &self.session_secret
        } else {
            &self.admin_token
        }
    }

    /// Whether intake takes requests without any token: neither `intake_token` nor a tenant
    /// token is set (then only requests naming this machine get through, see `http::guard`).
    pub fn intake_is_open(&self) -> bool {
        self.intake_token.is_empty() && self.tenant_tokens.is_empty()
    }
}

/// Checks `[http] tenant_tokens`: each tenant a valid tenant id (1-255 visible ASCII), each
/// token at least [`super::MIN_TOKEN_CHARS`] long and unlike every other token
/// (admin, all-tenant intake, other tenants'): a shared token would speak for both. Messages
/// name the tenant, never a token.
pub(super) fn check(http: &HttpConfig) -> Result<(), (String, String)> {
    let min = super::MIN_TOKEN_CHARS;
    for (tenant, token) in &http.tenant_tokens.0 {
        let key = format!("http.tenant_tokens.{tenant}");
        if tenant.is_empty() {
            return Err((
                "http.tenant_tokens".into(),
                "has an empty tenant name: a tenant token speaks for a named tenant (requests without a tenant need the all-tenant intake_token)".into(),
            ));
        }
        crate::domain::claim::validate_tenant(tenant.as_bytes())
            .map_err(|e| (key.clone(), format!("the tenant name is refused: {e}")))?;
        let n = token.chars().count();
        if n < min {
            return Err((
                key,
                format!(
                    "is {n} characters; a tenant token must have at least {min} (e.g. `openssl rand -hex 24`; an unset ${{VAR}} gives an empty one); the value is not shown"
                ),
            ));
        }
        let same_as = if *token == http.admin_token {
            Some("http.admin_token".to_string())
        } else if *token == http.intake_token {
            Some("http.intake_token".to_string())
        } else {
            http.tenant_tokens
                .0
                .iter()
                .find(|(other, t)| *other != tenant && *t == token)
                .map(|(other, _)| format!("the token of tenant {other:?}"))
        };
        if let Some(other) = same_as {
            return Err((
                key,
                format!(
                    "is the same as {other}: one token would speak for both; give each its own"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(tokens: &[(&str, &str)]) -> HttpConfig {
        HttpConfig {
            admin_token: "admin-token-0123456789".into(),
            intake_token: "intake-token-0123456789".into(),
            tenant_tokens: TenantTokens(
                tokens
                    .iter()
                    .map(|(t, k)| (t.to_string(), k.to_string()))
                    .collect(),
            ),
            ..HttpConfig::default()
        }
    }

    #[test]
    fn a_token_names_its_tenant_and_only_its_own() {
        let h = http(&[
            ("acme", "acme-token-0123456789"),
            ("globex", "globex-token-0123456789"),
        ]);
        assert_eq!(check(&h), Ok(()));
        let t = &h.tenant_tokens;
        assert_eq!(t.tenant_of(b"acme-token-0123456789"), Some("acme"));
        assert_eq!(t.tenant_of(b"globex-token-0123456789"), Some("globex"));
        assert_eq!(t.tenant_of(b"acme-token-012345678"), None);
        assert_eq!(t.tenant_of(b"intake-token-0123456789"), None);
        assert_eq!(t.tenant_of(b""), None);
    }

    #[test]
    fn debug_shows_tenants_never_tokens() {
        let h = http(&[("acme", "acme-token-0123456789")]);
        let shown = format!("{:?}", h.tenant_tokens);
        assert_eq!(shown, r#"{"acme"}"#);
        assert!(!format!("{h:?}").contains("acme-token"));
    }

    #[test]
    fn intake_is_open_only_without_any_intake_token() {
        let mut h = http(&[]);
        h.intake_token.clear();
        assert!(h.intake_is_open());
        let mut h = http(&[("acme", "acme-token-0123456789")]);
        h.intake_token.clear();
        assert!(!h.intake_is_open());
    }

    #[test]
    fn bad_tenant_tokens_are_refused_naming_the_tenant_not_the_token() {
        // (tenant tokens, the key named, words of the message)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 6] = [
            (
                &[("acme", "short")],
                "http.tenant_tokens.acme",
                "is 5 characters",
            ),
            (
                &[("acme", "")],
                "http.tenant_tokens.acme",
                "is 0 characters",
            ),
            (
                &[("acme", "admin-token-0123456789")],
                "http.tenant_tokens.acme",
                "same as http.admin_token",
            ),
            (
                &[("acme", "intake-token-0123456789")],
                "http.tenant_tokens.acme",
                "same as http.intake_token",
            ),
            (
                &[
                    ("acme", "one-token-0123456789"),
                    ("globex", "one-token-0123456789"),
                ],
                "http.tenant_tokens.acme",
                "the token of tenant \"globex\"",
            ),
            (
                &[("ac me", "acme-token-0123456789")],
                "http.tenant_tokens.ac me",
                "not visible ASCII",
            ),
        ];
        for (tokens, key, words) in cases {
            let (k, message) = check(&http(tokens)).unwrap_err();
            assert_eq!(k, key, "{message}");
            assert!(message.contains(words), "{key}: {message}");
            for (_, token) in tokens {
                assert!(token.len() < 6 || !message.contains(token), "{message}");
            }
        }
        let (k, m) = check(&http(&[("", "acme-token-0123456789")])).unwrap_err();
        assert_eq!(k, "http.tenant_tokens");
        assert!(m.contains("empty tenant name"), "{m}");
    }
}
