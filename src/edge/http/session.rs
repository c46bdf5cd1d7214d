//! Browser sign-in for the operator page: a person enters their account's name and
//! credential once on `/signin` (or, break-glass, the admin token) and gets a session cookie,
//! so they can use the page (browsers never prompt for a bearer token). Scripts send
//! `Authorization: Bearer <name>:<credential>` (or the admin token) instead.
//!
//! The cookie is stateless: `v2.<expiry>.<nonce>.<source>.<role>.<name>.<mac>` (`source`
//! `account` or `admin_token`; for an account its name, for the admin token the name the
//! person gave, kept in claims' histories), the MAC an HMAC-SHA256 keyed with
//! [`HttpConfig::session_key`](crate::config::HttpConfig::session_key): the admin token when
//! one is set, else `[http] session_secret`, never an operator's credential. Every instance
//! sharing the key accepts it (no session store behind a load balancer), changing the key signs
//! everyone out, and nothing on the server has to be cleaned up. An account's session is
//! checked against the account on every request: disabling the account ends it at once, and a
//! changed role applies at once. It is `HttpOnly` (scripts on the page cannot read it),
//! `SameSite=Strict` (another site cannot make the browser send it), expires after
//! [`SESSION_TTL`], and is `Secure` when the request arrived over HTTPS at a proxy
//! (`X-Forwarded-Proto: https`).
//!
//! A request authenticated by the cookie that changes something must also carry the session's
//! CSRF token (a second MAC over the nonce): the `X-CSRF-Token` header for the JSON routes, a
//! `csrf` form field for the page's forms. Signing out clears the cookie in that browser; a
//! copy of the cookie taken before stays valid until it expires (or the account is disabled).

use crate::domain::operator_role::{IdentitySource, Role};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

/// How long a sign-in lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// The cookie's name.
pub const COOKIE: &str = "claimd_session";

/// The header that carries the CSRF token on JSON routes.
pub const CSRF_HEADER: &str = "x-csrf-token";

fn mac(secret: &str, parts: &[&str]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    for p in parts {
        m.update(p.as_bytes());
        m.update(b"|");
    }
    hex::encode(m.finalize().into_bytes())
}

/// A valid session read from its cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Random per sign-in; the CSRF token is derived from it.
    pub nonce: String,
    /// The account's name; for the admin token, the name the person gave (their own word).
    pub name: String,
    /// How the person signed in: [`IdentitySource::Account`] or
    /// [`IdentitySource::AdminToken`].
    pub source: IdentitySource,
    /// The role at sign-in (an account's current role is read again on every request).
    pub role: Role,
    /// Unix seconds after which the cookie is refused.
    pub expires_unix: i64,
}

/// Who a new session is for.
#[derive(Debug, Clone, Copy)]
pub struct SessionOf<'a> {
    /// The name ([`valid_name`]).
    pub name: &'a str,
    /// How they signed in.
    pub source: IdentitySource,
    /// Their role.
    pub role: Role,
}

/// Whether `name` may name a person in a session: 1-64 of letters, digits and `._@-` (it
/// travels in the cookie and lands in the history).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

impl Session {
    /// The cookie value for a new session of `who` signed with `secret`, valid until
    /// `now_unix + ttl`.
    pub fn issue(
        secret: &str,
        now_unix: i64,
        ttl: Duration,
        nonce: &str,
        who: SessionOf<'_>,
    ) -> String {
        let expires = now_unix + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
        let e = expires.to_string();
        let (source, role, name) = (who.source.as_str(), who.role.as_str(), who.name);
        let m = mac(secret, &["session", "v2", &e, nonce, source, role, name]);
        format!("v2.{e}.{nonce}.{source}.{role}.{name}.{m}")
    }

    /// The session a cookie value holds, when its MAC is right and it has not expired.
    pub fn verify(secret: &str, value: &str, now_unix: i64) -> Option<Session> {
        // The name may hold dots: the MAC is the last field, the name what lies between.
        let (head, got) = value.rsplit_once('.')?;
        let mut parts = head.splitn(6, '.');
        let (Some("v2"), Some(e), Some(nonce), Some(source), Some(role), Some(name)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let want = mac(secret, &["session", "v2", e, nonce, source, role, name]);
        if !crate::domain::constant_time::constant_time_eq(got.as_bytes(), want.as_bytes()) {
            return None;
        }
        let expires_unix: i64 = e.parse().ok()?;
        let source = IdentitySource::parse(source)
            .filter(|s| matches!(s, IdentitySource::Account | IdentitySource::AdminToken))?;
        let role: Role = role.parse().ok()?;
        (now_unix < expires_unix && valid_name(name)).then(|| Session {
            nonce: nonce.to_string(),
            name: name.to_string(),
            source,
            role,
            expires_unix,
        })
    }

    /// The CSRF token forms and scripts of this session send back.
    pub fn csrf(&self, secret: &str) -> String {
        mac(secret, &["csrf", &self.nonce])
    }

    /// Whether `token` is this session's CSRF token.
    pub fn csrf_ok(&self, secret: &str, token: &str) -> bool {
        crate::domain::constant_time::constant_time_eq(
            token.as_bytes(),
            self.csrf(secret).as_bytes(),
        )
    }
}

/// A new random nonce (128 bits, hex).
pub fn new_nonce() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The `Set-Cookie` value that signs a browser in (`secure`: the page is served over HTTPS).
pub fn set_cookie(value: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that signs a browser out.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000;

    fn of(name: &str) -> SessionOf<'_> {
        SessionOf {
            name,
            source: IdentitySource::Account,
            role: Role::Operator,
        }
    }

    #[test]
    fn a_session_verifies_until_it_expires_and_only_with_its_secret() {
        let v = Session::issue("tok", T, Duration::from_secs(60), "abc", of("ann.lee"));
        let s = Session::verify("tok", &v, T + 59).expect("valid");
        assert_eq!(s.expires_unix, T + 60);
        assert_eq!(s.name, "ann.lee");
        assert_eq!(s.role, Role::Operator);
        assert_eq!(s.source, IdentitySource::Account);
        assert!(Session::verify("tok", &v, T + 60).is_none(), "expired");
        assert!(Session::verify("other", &v, T).is_none(), "another token");
    }

    #[test]
    fn a_tampered_cookie_is_refused() {
        let v = Session::issue("tok", T, Duration::from_secs(60), "abc", of("ann"));
        // A later expiry, another name, another role or source, with the old MAC.
        let longer = v.replacen(&(T + 60).to_string(), &(T + 6000).to_string(), 1);
        assert!(Session::verify("tok", &longer, T).is_none());
        assert!(Session::verify("tok", &v.replacen(".ann.", ".bob.", 1), T).is_none());
        let admin = v.replacen(".operator.", ".admin.", 1);
        assert!(Session::verify("tok", &admin, T).is_none());
        let token = v.replacen(".account.", ".admin_token.", 1);
        assert!(Session::verify("tok", &token, T).is_none());
        for bad in ["", "v1", "v1.1.2", "v2.1.2.3.4", &format!("{v}.x")] {
            assert!(Session::verify("tok", bad, T).is_none(), "{bad}");
        }
        // A cookie of the earlier format (no source or role) signs nobody in.
        let old = format!("v1.{}.abc.ann.{}", T + 60, mac("tok", &["x"]));
        assert!(Session::verify("tok", &old, T).is_none());
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let a = Session::verify(
            "tok",
            &Session::issue("tok", T, SESSION_TTL, "a", of("x")),
            T,
        )
        .unwrap();
        let b = Session::verify(
            "tok",
            &Session::issue("tok", T, SESSION_TTL, "b", of("x")),
            T,
        )
        .unwrap();
        assert!(a.csrf_ok("tok", &a.csrf("tok")));
        assert!(!a.csrf_ok("tok", &b.csrf("tok")));
        assert!(!a.csrf_ok("tok", ""));
    }

    #[test]
    fn names_are_plain_words() {
        assert!(valid_name("ann.lee@ops"));
        for bad in ["", "ann lee", "a;b", "é", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = "a=1; claimd_session=v1.2.3.4;b=2";
        assert_eq!(cookie_value(h, COOKIE), Some("v1.2.3.4"));
        assert_eq!(cookie_value(h, "c"), None);
        assert!(set_cookie("x", false).contains("HttpOnly; SameSite=Strict; Max-Age=28800"));
        assert!(set_cookie("x", true).ends_with("; Secure"));
    }
}
