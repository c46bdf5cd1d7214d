//! Verifies signed provider webhooks before anything in them is believed.
//!
//! Two schemes:
//! - **Stripe**: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...][,v0=...]`, the HMAC-SHA256 of
//!   `"<t>.<body>"` keyed with the whole `whsec_...` string. `v0` and any other scheme are ignored.
//! - **Standard Webhooks** (<https://www.standardwebhooks.com/>): `webhook-id`,
//!   `webhook-timestamp` and `webhook-signature: v1,<base64> [v1,<base64>...]`, the HMAC-SHA256
//!   of `"<id>.<timestamp>.<body>"` keyed with the base64-decoded secret (`whsec_` prefix
//!   optional). Entries of other versions are ignored. Only the `webhook-*` names are read (not
//!   Svix's `svix-*`).
//!
//! Decisions:
//! - The signature is checked before the timestamp, as Stripe's own libraries do: `Stale` and
//!   `Future` then only ever describe an authentic delivery (a replay or a skewed clock), while a
//!   forgery is a `Mismatch` whatever its timestamp.
//! - A header that carries no signature of a scheme we check (Stripe `v0` only, or Standard
//!   entries of other versions only) is a `Mismatch` (401), not `Unsigned`: the header is there
//!   and well formed, and nothing in it matched a secret. `Unsigned` names a missing header.
//! - Timestamps are canonical decimal seconds (no sign, no leading zero, no fraction): then the
//!   signed text is the header's text and the number alike, for us and for the reference
//!   libraries that sign the parsed number.
//! - A header sent twice is `Malformed`: which copy was signed is not ours to guess.
//! - A `v1` value that does not decode (hex or base64) is `Malformed`: providers never send one,
//!   so it is a broken sender or a probe, and saying so helps the operator.
//! - The work is bounded: a signature header over [`MAX_SIGNATURE_HEADER_BYTES`] or with more than
//!   [`MAX_SIGNATURE_ENTRIES`] entries (all of them, `t=` and ignored versions included) is
//!   refused before any HMAC, and the body is hashed once per secret, not once per entry.
//!
//! Comparisons are constant time (`hmac::Mac::verify_slice`). Secrets never appear in errors
//! or in `Debug`.

use super::headers::{read_standard, read_stripe};
use super::scheme::{B64, b64_decode};
pub use super::scheme::{
    MAX_SIGNATURE_ENTRIES, MAX_SIGNATURE_HEADER_BYTES, Scheme, SignatureError,
};
use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::time::Duration;

type HmacSha256 = Hmac<Sha256>;

const SECRET_PREFIX: &str = "whsec_";

/// Checks deliveries of one provider against its secrets.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    /// The HMAC keys, in the order the secrets were given.
    keys: Vec<Vec<u8>>,
    tolerance_s: i64,
}

/// What a verified delivery said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The signed Unix timestamp, in seconds.
    pub timestamp: i64,
    /// Standard Webhooks: the `webhook-id` header (the provider's id for the message, the same
    /// on each retry). Stripe: `None` (the event id is in the body).
    pub webhook_id: Option<String>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The number of secrets is enough to debug a rotation; their bytes never.
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &self.keys.len())
            .field("tolerance_s", &self.tolerance_s)
            .finish()
    }
}

impl Verifier {
    /// Secrets: Stripe's are used as given (the whole `whsec_...` string is the HMAC key);
    /// Standard Webhooks' are `whsec_` + base64 (the decoded bytes are the key; also accepted
    /// without the prefix, with or without base64 padding).
    /// Several secrets: any may match (rotation). Errors (empty list, empty secret, bad base64,
    /// surrounding whitespace) say which secret by position (1-based), never its text.
    /// The tolerance is taken in whole seconds (a fraction is dropped).
    pub fn new(
        scheme: Scheme,
        secrets: &[String],
        tolerance: Duration,
    ) -> Result<Verifier, SignatureError> {
        if secrets.is_empty() {
            return Err(SignatureError::BadSecret("no secrets given".into()));
        }
        let n = secrets.len();
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                key_for(scheme, s).map_err(|why| {
                    SignatureError::BadSecret(format!("secret {} of {n} {why}", i + 1))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Verifier {
            scheme,
            keys,
            tolerance_s: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }

    /// Verifies one delivery; `now_unix` is the current Unix time in seconds.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Verified, SignatureError> {
        let (timestamp, webhook_id) = match self.scheme {
            Scheme::Stripe => (self.verify_stripe(headers, body)?, None),
            Scheme::Standard => {
                let (ts, id) = self.verify_standard(headers, body)?;
                (ts, Some(id))
            }
        };
        // After the signature: see the module doc.
        check_time(timestamp, now_unix, self.tolerance_s)?;
        Ok(Verified {
            timestamp,
            webhook_id,
        })
    }

    /// Checks `Stripe-Signature`; returns its timestamp.
    fn verify_stripe(&self, headers: &HeaderMap, body: &[u8]) -> Result<i64, SignatureError> {
        let h = read_stripe(headers)?;
        if self.any_key_signed(&[h.t.as_bytes(), body], &h.signatures) {
            Ok(h.timestamp)
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    /// Checks the three `webhook-*` headers; returns the timestamp and the webhook id.
    fn verify_standard(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(i64, String), SignatureError> {
        let h = read_standard(headers)?;
        if self.any_key_signed(&[h.id.as_bytes(), h.ts.as_bytes(), body], &h.signatures) {
            Ok((h.timestamp, h.id.to_string()))
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    /// Whether any secret's HMAC-SHA256 of `parts` joined by `.` is one of `signatures`
    /// (compared in constant time by `verify_slice`).
    fn any_key_signed(&self, parts: &[&[u8]], signatures: &[Vec<u8>]) -> bool {
        self.keys.iter().any(|key| {
            let mut mac = new_mac(key);
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    mac.update(b".");
                }
                mac.update(part);
            }
            signatures
                .iter()
                .any(|s| mac.clone().verify_slice(s).is_ok())
        })
    }
}

/// The `Stripe-Signature` header value for a delivery: `t=<ts>,v1=<hex>`.
pub fn sign_stripe(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = new_mac(secret.as_bytes());
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// The `webhook-signature` header value for a Standard Webhooks delivery: `v1,<base64>`.
/// Fails as [`SignatureError::BadSecret`] when the secret is not (`whsec_` +) base64.
pub fn sign_standard(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SignatureError> {
    let key = key_for(Scheme::Standard, secret)
        .map_err(|why| SignatureError::BadSecret(format!("the secret {why}")))?;
    let mut mac = new_mac(&key);
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!("v1,{}", b64_encode(&mac.finalize().into_bytes())))
}

/// The HMAC key of one secret, or why it has none (a phrase that follows "secret N of M").
fn key_for(scheme: Scheme, secret: &str) -> Result<Vec<u8>, &'static str> {
    if secret.is_empty() {
        return Err("is empty");
    }
    // A newline pasted from a file would make a key that silently never matches.
    if secret.trim() != secret {
        return Err("has leading or trailing whitespace");
    }
    match scheme {
        Scheme::Stripe => Ok(secret.as_bytes().to_vec()),
        Scheme::Standard => {
            let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
            if encoded.is_empty() {
                return Err("is empty after its whsec_ prefix");
            }
            match b64_decode(encoded) {
                None => Err("is not base64 (after an optional whsec_ prefix)"),
                Some(key) if key.is_empty() => Err("decodes to no bytes"),
                Some(key) => Ok(key),
            }
        }
    }
}

fn new_mac(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        // HMAC hashes long keys and pads short ones: no length is refused.
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    }
}

/// Within the tolerance in both directions; exactly the tolerance passes.
fn check_time(timestamp: i64, now_unix: i64, tolerance_s: i64) -> Result<(), SignatureError> {
    let age_s = now_unix.saturating_sub(timestamp);
    if age_s > tolerance_s {
        return Err(SignatureError::Stale { age_s, tolerance_s });
    }
    let ahead_s = timestamp.saturating_sub(now_unix);
    if ahead_s > tolerance_s {
        return Err(SignatureError::Future {
            ahead_s,
            tolerance_s,
        });
    }
    Ok(())
}

/// Padded standard base64.
fn b64_encode(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    // Vectors computed with Python (3.11 hmac/hashlib; standardwebhooks 1.1.0 for the second,
    // which is also the example in Svix's documentation):
    //   hmac.new(b"whsec_test_secret", b"1700000000." + STRIPE_BODY, sha256).hexdigest()
    //   Webhook(STD_SECRET).sign(STD_ID, datetime.fromtimestamp(STD_TS, timezone.utc), STD_BODY)
    const STRIPE_SECRET: &str = "whsec_test_secret";
    const STRIPE_TS: i64 = 1_700_000_000;
    const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
    const STRIPE_V1: &str = "22d8dc182f5c588077683bd378368e29765bfe5df2560112b4f28fef120f0e31";

    const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const STD_KEY_HEX: &str = "31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0";
    const STD_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const STD_TS: i64 = 1_614_265_330;
    const STD_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const STD_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    const TOL: Duration = Duration::from_secs(300);

    fn secrets(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn stripe() -> Verifier {
        Verifier::new(Scheme::Stripe, &secrets(&[STRIPE_SECRET]), TOL).expect("verifier")
    }

    fn standard() -> Verifier {
        Verifier::new(Scheme::Standard, &secrets(&[STD_SECRET]), TOL).expect("verifier")
    }

    fn stripe_headers(sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "Stripe-Signature",
            HeaderValue::from_str(sig).expect("value"),
        );
        h
    }

    fn std_headers(id: &str, ts: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("webhook-id", HeaderValue::from_str(id).expect("value"));
        h.insert(
            "webhook-timestamp",
            HeaderValue::from_str(ts).expect("value"),
        );
        h.insert(
            "webhook-signature",
            HeaderValue::from_str(sig).expect("value"),
        );
        h
    }

    fn std_valid() -> HeaderMap {
        std_headers(STD_ID, &STD_TS.to_string(), STD_SIG)
    }

    fn malformed_text(r: Result<Verified, SignatureError>) -> String {
        match r {
            Err(SignatureError::Malformed(why)) => why,
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn known_vectors() {
        assert_eq!(
            sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY),
            format!("t={STRIPE_TS},v1={STRIPE_V1}")
        );
        assert_eq!(
            sign_standard(STD_SECRET, STD_ID, STD_TS, STD_BODY).as_deref(),
            Ok(STD_SIG)
        );
        // Without the prefix, the same key.
        let bare = STD_SECRET.strip_prefix("whsec_").expect("prefix");
        assert_eq!(
            sign_standard(bare, STD_ID, STD_TS, STD_BODY).as_deref(),
            Ok(STD_SIG)
        );
        assert_eq!(
            key_for(Scheme::Standard, STD_SECRET).map(hex::encode),
            Ok(STD_KEY_HEX.to_string())
        );
    }

    #[test]
    fn stripe_valid_passes() {
        let h = stripe_headers(&format!("t={STRIPE_TS},v1={STRIPE_V1}"));
        assert_eq!(
            stripe().verify(&h, STRIPE_BODY, STRIPE_TS + 10),
            Ok(Verified {
                timestamp: STRIPE_TS,
                webhook_id: None
            })
        );
    }

    #[test]
    fn stripe_any_v1_entry_may_match_and_others_are_ignored() {
        let wrong = "00".repeat(32);
        let h = stripe_headers(&format!(
            "t={STRIPE_TS}, v1={wrong},v1={STRIPE_V1},v0={wrong},v9=whatever"
        ));
        assert!(stripe().verify(&h, STRIPE_BODY, STRIPE_TS).is_ok());
        // Entry order does not matter: t may come last.
        let h = stripe_headers(&format!("v1={STRIPE_V1},t={STRIPE_TS}"));
        assert!(stripe().verify(&h, STRIPE_BODY, STRIPE_TS).is_ok());
    }

    #[test]
    fn standard_valid_passes_and_returns_the_webhook_id() {
        assert_eq!(
            standard().verify(&std_valid(), STD_BODY, STD_TS),
            Ok(Verified {
                timestamp: STD_TS,
                webhook_id: Some(STD_ID.to_string())
            })
        );
        // A verifier built from the bare base64 secret agrees.
        let bare = STD_SECRET.strip_prefix("whsec_").expect("prefix");
        let v = Verifier::new(Scheme::Standard, &secrets(&[bare]), TOL).expect("verifier");
        assert!(v.verify(&std_valid(), STD_BODY, STD_TS).is_ok());
    }

    #[test]
    fn standard_any_v1_entry_may_match_and_other_versions_are_ignored() {
        let wrong = b64_encode(&[7u8; 32]);
        let sig = format!("v1a,{wrong}  v1,{wrong} {STD_SIG} v2,not-even-base64");
        let h = std_headers(STD_ID, &STD_TS.to_string(), &sig);
        assert!(standard().verify(&h, STD_BODY, STD_TS).is_ok());
    }

    #[test]
    fn rotation_second_secret_matches() {
        let v = Verifier::new(
            Scheme::Stripe,
            &secrets(&["whsec_old_one", STRIPE_SECRET]),
            TOL,
        )
        .expect("verifier");
        let h = stripe_headers(&sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY));
        assert!(v.verify(&h, STRIPE_BODY, STRIPE_TS).is_ok());

        let old = format!("whsec_{}", b64_encode(b"the previous secret key"));
        let v =
            Verifier::new(Scheme::Standard, &secrets(&[&old, STD_SECRET]), TOL).expect("verifier");
        assert!(v.verify(&std_valid(), STD_BODY, STD_TS).is_ok());
        // And the first secret alone does not.
        let v = Verifier::new(Scheme::Standard, &secrets(&[&old]), TOL).expect("verifier");
        assert_eq!(
            v.verify(&std_valid(), STD_BODY, STD_TS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn tolerance_edges() {
        let h = stripe_headers(&sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY));
        let v = stripe();
        assert!(v.verify(&h, STRIPE_BODY, STRIPE_TS + 300).is_ok());
        assert!(v.verify(&h, STRIPE_BODY, STRIPE_TS - 300).is_ok());
        assert_eq!(
            v.verify(&h, STRIPE_BODY, STRIPE_TS + 301),
            Err(SignatureError::Stale {
                age_s: 301,
                tolerance_s: 300
            })
        );
        assert_eq!(
            v.verify(&h, STRIPE_BODY, STRIPE_TS - 301),
            Err(SignatureError::Future {
                ahead_s: 301,
                tolerance_s: 300
            })
        );

        let v = standard();
        assert!(v.verify(&std_valid(), STD_BODY, STD_TS + 300).is_ok());
        assert!(v.verify(&std_valid(), STD_BODY, STD_TS - 300).is_ok());
        assert_eq!(
            v.verify(&std_valid(), STD_BODY, STD_TS + 301),
            Err(SignatureError::Stale {
                age_s: 301,
                tolerance_s: 300
            })
        );
        assert_eq!(
            v.verify(&std_valid(), STD_BODY, STD_TS - 301),
            Err(SignatureError::Future {
                ahead_s: 301,
                tolerance_s: 300
            })
        );
    }

    #[test]
    fn tolerance_drops_fractions_and_extreme_clocks_do_not_overflow() {
        let v = Verifier::new(
            Scheme::Stripe,
            &secrets(&[STRIPE_SECRET]),
            Duration::from_millis(1_999),
        )
        .expect("verifier");
        let h = stripe_headers(&sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY));
        assert!(v.verify(&h, STRIPE_BODY, STRIPE_TS + 1).is_ok());
        assert!(matches!(
            v.verify(&h, STRIPE_BODY, STRIPE_TS + 2),
            Err(SignatureError::Stale { tolerance_s: 1, .. })
        ));
        assert!(matches!(
            v.verify(&h, STRIPE_BODY, i64::MIN),
            Err(SignatureError::Future { .. })
        ));
        assert!(matches!(
            v.verify(&h, STRIPE_BODY, i64::MAX),
            Err(SignatureError::Stale { .. })
        ));
        let forever = Verifier::new(Scheme::Stripe, &secrets(&[STRIPE_SECRET]), Duration::MAX)
            .expect("verifier");
        assert!(forever.verify(&h, STRIPE_BODY, i64::MIN).is_ok());
    }

    #[test]
    fn tampered_body_is_mismatch() {
        let h = stripe_headers(&sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY));
        assert_eq!(
            stripe().verify(&h, b"{\"id\":\"evt_2\"}", STRIPE_TS),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            standard().verify(&std_valid(), br#"{"test": 2432232315}"#, STD_TS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn tampered_timestamp_or_id_is_mismatch() {
        let h = stripe_headers(&format!("t={},v1={STRIPE_V1}", STRIPE_TS + 1));
        assert_eq!(
            stripe().verify(&h, STRIPE_BODY, STRIPE_TS),
            Err(SignatureError::Mismatch)
        );
        let h = std_headers("msg_other", &STD_TS.to_string(), STD_SIG);
        assert_eq!(
            standard().verify(&h, STD_BODY, STD_TS),
            Err(SignatureError::Mismatch)
        );
        let h = std_headers(STD_ID, &(STD_TS + 1).to_string(), STD_SIG);
        assert_eq!(
            standard().verify(&h, STD_BODY, STD_TS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_forgery_is_mismatch_even_when_stale() {
        // The signature is checked first: Stale only ever describes an authentic delivery.
        let h = stripe_headers(&sign_stripe("whsec_wrong", STRIPE_TS, STRIPE_BODY));
        assert_eq!(
            stripe().verify(&h, STRIPE_BODY, STRIPE_TS + 10_000),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn no_signature_of_a_checked_scheme_is_mismatch() {
        // Decision: a well-formed header with only v0 (or only other Standard versions) is a
        // Mismatch (401), not Unsigned: the header is there, and nothing in it matched.
        let v0 = sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY).replace("v1=", "v0=");
        assert_eq!(
            stripe().verify(&stripe_headers(&v0), STRIPE_BODY, STRIPE_TS),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            stripe().verify(
                &stripe_headers(&format!("t={STRIPE_TS}")),
                STRIPE_BODY,
                STRIPE_TS
            ),
            Err(SignatureError::Mismatch)
        );
        let other = STD_SIG.replace("v1,", "v1a,");
        let h = std_headers(STD_ID, &STD_TS.to_string(), &other);
        assert_eq!(
            standard().verify(&h, STD_BODY, STD_TS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn wrong_length_signature_is_mismatch() {
        let h = stripe_headers(&format!("t={STRIPE_TS},v1={}", &STRIPE_V1[..62]));
        assert_eq!(
            stripe().verify(&h, STRIPE_BODY, STRIPE_TS),
            Err(SignatureError::Mismatch)
        );
        let h = stripe_headers(&format!("t={STRIPE_TS},v1="));
        assert_eq!(
            stripe().verify(&h, STRIPE_BODY, STRIPE_TS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn missing_headers_are_unsigned_by_name() {
        assert_eq!(
            stripe().verify(&HeaderMap::new(), STRIPE_BODY, STRIPE_TS),
            Err(SignatureError::Unsigned("stripe-signature"))
        );
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let mut h = std_valid();
            h.remove(name);
            assert_eq!(
                standard().verify(&h, STD_BODY, STD_TS),
                Err(SignatureError::Unsigned(name)),
                "{name}"
            );
        }
        // svix-* names are not read.
        let mut h = HeaderMap::new();
        for (k, v) in std_valid().iter() {
            let svix = k.as_str().replace("webhook-", "svix-");
            h.insert(
                axum::http::HeaderName::from_bytes(svix.as_bytes()).expect("name"),
                v.clone(),
            );
        }
        assert_eq!(
            standard().verify(&h, STD_BODY, STD_TS),
            Err(SignatureError::Unsigned("webhook-id"))
        );
    }

    #[test]
    fn stripe_malformed_headers() {
        let v = stripe();
        let check = |sig: &str, expect: &str| {
            let why = malformed_text(v.verify(&stripe_headers(sig), STRIPE_BODY, STRIPE_TS));
            assert!(why.contains(expect), "{sig:?}: {why}");
        };
        check(&format!("v1={STRIPE_V1}"), "no t=");
        check(&format!("t=17e8,v1={STRIPE_V1}"), "not whole Unix seconds");
        check(&format!("t=,v1={STRIPE_V1}"), "not whole Unix seconds");
        check(&format!("t=-5,v1={STRIPE_V1}"), "not whole Unix seconds");
        check(&format!("t=+5,v1={STRIPE_V1}"), "not whole Unix seconds");
        check(
            &format!("t=01700000000,v1={STRIPE_V1}"),
            "not whole Unix seconds",
        );
        check(
            &format!("t=99999999999999999999,v1={STRIPE_V1}"),
            "not whole Unix seconds",
        );
        check(
            &format!("t={STRIPE_TS},t={STRIPE_TS},v1={STRIPE_V1}"),
            "more than one t=",
        );
        check(
            &format!("t={STRIPE_TS},v1=zz{}", &STRIPE_V1[2..]),
            "not hex",
        );
        check(
            &format!("t={STRIPE_TS},v1={STRIPE_V1},"),
            "entry 3 has no '='",
        );
        check(
            &format!("t={STRIPE_TS};v1={STRIPE_V1}"),
            "not whole Unix seconds",
        );
        check(" ", "is empty");
    }

    #[test]
    fn standard_malformed_headers() {
        let v = standard();
        let check = |h: HeaderMap, expect: &str| {
            let why = malformed_text(v.verify(&h, STD_BODY, STD_TS));
            assert!(why.contains(expect), "{h:?}: {why}");
        };
        check(
            std_headers(STD_ID, "1614265330.5", STD_SIG),
            "webhook-timestamp",
        );
        check(
            std_headers(STD_ID, "soon", STD_SIG),
            "not whole Unix seconds",
        );
        check(
            std_headers(
                STD_ID,
                &STD_TS.to_string(),
                "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
            "entry 1 has no ','",
        );
        check(
            std_headers(STD_ID, &STD_TS.to_string(), "v1,not*base64"),
            "entry 1 (v1) is not base64",
        );
        check(
            std_headers(" ", &STD_TS.to_string(), STD_SIG),
            "webhook-id is empty",
        );
    }

    #[test]
    fn a_header_sent_twice_or_not_ascii_is_malformed() {
        let mut h = stripe_headers(&sign_stripe(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY));
        h.append("stripe-signature", HeaderValue::from_static("t=1,v1=00"));
        assert!(
            malformed_text(stripe().verify(&h, STRIPE_BODY, STRIPE_TS)).contains("more than once")
        );

        let mut h = std_valid();
        h.insert(
            "webhook-id",
            HeaderValue::from_bytes("msg_é".as_bytes()).expect("value"),
        );
        assert!(malformed_text(standard().verify(&h, STD_BODY, STD_TS)).contains("visible ASCII"));
    }

    #[test]
    fn size_bound() {
        // Exactly the limit, in at most 16 entries, still verifies; one byte more does not.
        let filler_len = MAX_SIGNATURE_HEADER_BYTES - STD_SIG.len() - 1 - "v9,".len();
        let sig = format!("v9,{} {STD_SIG}", "A".repeat(filler_len));
        assert_eq!(sig.len(), MAX_SIGNATURE_HEADER_BYTES);
        let h = std_headers(STD_ID, &STD_TS.to_string(), &sig);
        assert!(standard().verify(&h, STD_BODY, STD_TS).is_ok());
        let sig = format!("v9,A{}", &sig[3..]);
        let h = std_headers(STD_ID, &STD_TS.to_string(), &sig);
        let why = malformed_text(standard().verify(&h, STD_BODY, STD_TS));
        assert!(why.contains("8193 bytes"), "{why}");

        let sig = format!(
            "{},v1={STRIPE_V1}",
            "v0=".repeat(MAX_SIGNATURE_HEADER_BYTES)
        );
        let why = malformed_text(stripe().verify(&stripe_headers(&sig), STRIPE_BODY, STRIPE_TS));
        assert!(why.contains("limit"), "{why}");
    }

    #[test]
    fn entry_bound() {
        // 16 entries (t= and 15 v1=) pass; 17 are refused.
        let wrong = "00".repeat(32);
        let mut entries = vec![format!("t={STRIPE_TS}")];
        entries.extend(std::iter::repeat_n(format!("v1={wrong}"), 14));
        entries.push(format!("v1={STRIPE_V1}"));
        assert_eq!(entries.len(), MAX_SIGNATURE_ENTRIES);
        let h = stripe_headers(&entries.join(","));
        assert!(stripe().verify(&h, STRIPE_BODY, STRIPE_TS).is_ok());
        entries.insert(1, "v0=00".into());
        let h = stripe_headers(&entries.join(","));
        let why = malformed_text(stripe().verify(&h, STRIPE_BODY, STRIPE_TS));
        assert!(why.contains("more than 16 entries"), "{why}");

        let mut entries = vec!["v2,AAAA"; MAX_SIGNATURE_ENTRIES - 1];
        entries.push(STD_SIG);
        let h = std_headers(STD_ID, &STD_TS.to_string(), &entries.join(" "));
        assert!(standard().verify(&h, STD_BODY, STD_TS).is_ok());
        entries.push("v2,AAAA");
        let h = std_headers(STD_ID, &STD_TS.to_string(), &entries.join(" "));
        let why = malformed_text(standard().verify(&h, STD_BODY, STD_TS));
        assert!(why.contains("more than 16 entries"), "{why}");
    }

    #[test]
    fn bad_secrets_name_the_position_never_the_text() {
        let bad = |scheme, s: &[&str]| match Verifier::new(scheme, &secrets(s), TOL) {
            Err(SignatureError::BadSecret(why)) => why,
            other => panic!("expected BadSecret, got {other:?}"),
        };
        assert_eq!(bad(Scheme::Stripe, &[]), "no secrets given");
        assert_eq!(
            bad(Scheme::Stripe, &[STRIPE_SECRET, ""]),
            "secret 2 of 2 is empty"
        );
        assert_eq!(
            bad(Scheme::Stripe, &["whsec_abc\n"]),
            "secret 1 of 1 has leading or trailing whitespace"
        );
        let why = bad(
            Scheme::Standard,
            &[STD_SECRET, "whsec_sup3r-s3cr3t!", STD_SECRET],
        );
        assert_eq!(
            why,
            "secret 2 of 3 is not base64 (after an optional whsec_ prefix)"
        );
        assert!(!why.contains("sup3r"));
        assert_eq!(
            bad(Scheme::Standard, &["whsec_"]),
            "secret 1 of 1 is empty after its whsec_ prefix"
        );
        assert_eq!(
            bad(Scheme::Standard, &["=="]),
            "secret 1 of 1 is not base64 (after an optional whsec_ prefix)"
        );
        // Stripe secrets are taken as they are: anything non-empty is a key.
        assert!(Verifier::new(Scheme::Stripe, &secrets(&["not base64 *"]), TOL).is_ok());
        assert!(matches!(
            sign_standard("whsec_!!", STD_ID, STD_TS, STD_BODY),
            Err(SignatureError::BadSecret(why)) if !why.contains("!!")
        ));
    }

    #[test]
    fn debug_never_prints_secrets() {
        let v = Verifier::new(
            Scheme::Standard,
            &secrets(&[STD_SECRET, "whsec_c2Vjb25k"]),
            TOL,
        )
        .expect("verifier");
        let text = format!("{v:?}");
        assert_eq!(
            text,
            "Verifier { scheme: Standard, secrets: 2, tolerance_s: 300 }"
        );
        let text = format!("{:?}", stripe());
        assert!(!text.contains("test_secret"), "{text}");
    }

    #[test]
    fn status_codes() {
        let cases = [
            (SignatureError::Malformed("x".into()), 400),
            (
                SignatureError::Stale {
                    age_s: 1,
                    tolerance_s: 0,
                },
                400,
            ),
            (
                SignatureError::Future {
                    ahead_s: 1,
                    tolerance_s: 0,
                },
                400,
            ),
            (SignatureError::Unsigned("webhook-id"), 401),
            (SignatureError::Mismatch, 401),
            (SignatureError::BadSecret("x".into()), 500),
        ];
        for (e, status) in cases {
            assert_eq!(e.status(), status, "{e}");
        }
        assert_eq!(
            SignatureError::Stale {
                age_s: 301,
                tolerance_s: 300
            }
            .to_string(),
            "stale signature: signed 301 s ago, past the 300 s tolerance"
        );
        assert_eq!(
            SignatureError::Unsigned("stripe-signature").to_string(),
            "unsigned: no stripe-signature header"
        );
    }

    #[test]
    fn scheme_serde_is_lowercase() {
        assert_eq!(
            serde_json::to_string(&Scheme::Standard).expect("json"),
            "\"standard\""
        );
        assert_eq!(
            serde_json::from_str::<Scheme>("\"stripe\"").expect("json"),
            Scheme::Stripe
        );
        assert!(serde_json::from_str::<Scheme>("\"Stripe\"").is_err());
    }

    #[test]
    fn base64_reads_padded_and_bare_and_refuses_the_rest() {
        let std = base64::engine::general_purpose::STANDARD;
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD;
        let mut bytes = Vec::new();
        for n in 0..70u32 {
            let encoded = b64_encode(&bytes);
            assert_eq!(encoded, std.encode(&bytes), "{n}");
            assert_eq!(b64_decode(&encoded).as_deref(), Some(&bytes[..]), "{n}");
            let bare = unpadded.encode(&bytes);
            assert_eq!(b64_decode(&bare).as_deref(), Some(&bytes[..]), "{n}");
            bytes.push((n.wrapping_mul(151) ^ 0x5a) as u8);
        }
        for bad in [
            "A", "AAAAA", "A===", "AA=", "AA=A", "=AAA", "AA-_", "AA AA", "AAA==",
        ] {
            assert_eq!(b64_decode(bad), None, "{bad:?}");
        }
        // Unused low bits are ignored, as Python's b64decode does.
        assert_eq!(b64_decode("AB=="), Some(vec![0]));
    }
}

/// The early check of a delivery's headers ([`super::headers`]) and the verifier refuse
/// the same deliveries for the same reasons: the early check changes when a delivery is
/// refused, never whether or why.
#[cfg(test)]
mod headers_agree {
    use super::super::headers::{STRIPE_SIGNATURE, WEBHOOK_ID, check_headers};
    use super::{Scheme, SignatureError, Verifier, sign_standard, sign_stripe};
    use axum::http::HeaderMap;
    use axum::http::HeaderValue;

    const STRIPE_SECRET: &str = "whsec_test_secret";
    const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const TS: i64 = 1_700_000_000;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    fn verifier(scheme: Scheme) -> Verifier {
        let secret = match scheme {
            Scheme::Stripe => STRIPE_SECRET,
            Scheme::Standard => STD_SECRET,
        };
        Verifier::new(
            scheme,
            &[secret.to_string()],
            std::time::Duration::from_secs(300),
        )
        .expect("verifier")
    }

    /// Deliveries whose headers are missing or unreadable, per scheme.
    fn unreadable() -> Vec<(Scheme, HeaderMap, &'static str)> {
        let sig = sign_standard(STD_SECRET, "msg_1", TS, BODY).expect("sign");
        let ts = TS.to_string();
        vec![
            (Scheme::Stripe, HeaderMap::new(), "no stripe-signature"),
            (
                Scheme::Stripe,
                headers(&[("stripe-signature", "v1=00")]),
                "no t=",
            ),
            (
                Scheme::Stripe,
                headers(&[("stripe-signature", "t=1,v1=zz")]),
                "not hex",
            ),
            (
                Scheme::Stripe,
                headers(&[("stripe-signature", "t=01,v1=00")]),
                "not whole Unix seconds",
            ),
            (
                Scheme::Stripe,
                headers(&[("stripe-signature", "t=1"), ("stripe-signature", "t=1")]),
                "more than once",
            ),
            (
                Scheme::Standard,
                headers(&[
                    ("webhook-timestamp", ts.as_str()),
                    ("webhook-signature", sig.as_str()),
                ]),
                "no webhook-id",
            ),
            (
                Scheme::Standard,
                headers(&[("webhook-id", "msg_1"), ("webhook-signature", sig.as_str())]),
                "no webhook-timestamp",
            ),
            (
                Scheme::Standard,
                headers(&[("webhook-id", "msg_1"), ("webhook-timestamp", ts.as_str())]),
                "no webhook-signature",
            ),
            (
                Scheme::Standard,
                headers(&[
                    ("webhook-id", "msg_1"),
                    ("webhook-timestamp", ts.as_str()),
                    ("webhook-signature", "v1,%%%"),
                ]),
                "not base64",
            ),
        ]
    }

    #[test]
    fn unreadable_headers_are_refused_as_the_verifier_refuses_them() {
        for (scheme, h, expect) in unreadable() {
            let early = check_headers(scheme, &h).expect_err(expect);
            assert!(early.to_string().contains(expect), "{expect}: {early}");
            // The same refusal the verifier gives once the body is read: the early check
            // changes when a delivery is refused, never whether or why.
            assert_eq!(
                Err(early),
                verifier(scheme).verify(&h, BODY, TS),
                "{expect}"
            );
        }
    }

    #[test]
    fn well_formed_headers_pass_whatever_they_sign() {
        let stripe = headers(&[(
            "stripe-signature",
            sign_stripe(STRIPE_SECRET, TS, BODY).as_str(),
        )]);
        assert!(check_headers(Scheme::Stripe, &stripe).is_ok());
        // Well formed but signed with another secret, or long ago: for the verifier to refuse.
        let forged = headers(&[(
            "stripe-signature",
            sign_stripe("whsec_other", 1, BODY).as_str(),
        )]);
        assert!(check_headers(Scheme::Stripe, &forged).is_ok());
        let sig = sign_standard(STD_SECRET, "msg_1", TS, BODY).expect("sign");
        let standard = headers(&[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", TS.to_string().as_str()),
            ("webhook-signature", sig.as_str()),
        ]);
        assert!(check_headers(Scheme::Standard, &standard).is_ok());
        // Each scheme reads only its own headers.
        assert_eq!(
            check_headers(Scheme::Standard, &stripe),
            Err(SignatureError::Unsigned(WEBHOOK_ID))
        );
        assert_eq!(
            check_headers(Scheme::Stripe, &standard),
            Err(SignatureError::Unsigned(STRIPE_SIGNATURE))
        );
    }
}
