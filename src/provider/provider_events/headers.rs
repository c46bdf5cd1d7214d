//! The signature headers of a delivery, read without its body: present, sent once, within the
//! size and entry bounds, and well formed ([`check_headers`]). The HTTP route runs this before
//! it reads a body, so a delivery that can never verify is refused without its body taking any
//! memory; [`Verifier::verify`](super::signature::Verifier::verify) reads the same headers the
//! same way afterwards, then checks the signatures against the body.
//!
//! Nothing here checks a signature or the timestamp's age: both need the body or come after it
//! (see the decisions in [`signature`](super::signature)).

use super::scheme::{
    MAX_SIGNATURE_ENTRIES, MAX_SIGNATURE_HEADER_BYTES, Scheme, SignatureError, b64_decode,
};
use axum::http::HeaderMap;

pub(super) const STRIPE_SIGNATURE: &str = "stripe-signature";
pub(super) const WEBHOOK_ID: &str = "webhook-id";
const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Refuses a delivery whose signature headers `scheme` needs are missing (`Unsigned`, naming
/// the header) or cannot be read (`Malformed`, saying what is wrong): such a delivery can never
/// verify, whatever its body.
pub fn check_headers(scheme: Scheme, headers: &HeaderMap) -> Result<(), SignatureError> {
    match scheme {
        Scheme::Stripe => read_stripe(headers).map(drop),
        Scheme::Standard => read_standard(headers).map(drop),
    }
}

/// `Stripe-Signature`, read.
pub(super) struct StripeHeader<'a> {
    /// The `t=` value as sent (the signed text).
    pub t: &'a str,
    /// `t` as Unix seconds.
    pub timestamp: i64,
    /// The decoded `v1=` signatures.
    pub signatures: Vec<Vec<u8>>,
}

/// Standard Webhooks' three headers, read.
pub(super) struct StandardHeaders<'a> {
    /// `webhook-id`.
    pub id: &'a str,
    /// `webhook-timestamp` as sent (the signed text).
    pub ts: &'a str,
    /// `ts` as Unix seconds.
    pub timestamp: i64,
    /// The decoded `v1,` signatures.
    pub signatures: Vec<Vec<u8>>,
}

/// Reads `Stripe-Signature: t=<unix>,v1=<hex>[,...]`; other versions are skipped.
pub(super) fn read_stripe(headers: &HeaderMap) -> Result<StripeHeader<'_>, SignatureError> {
    let value = signature_header(headers, STRIPE_SIGNATURE)?;
    let entries = bounded_entries(STRIPE_SIGNATURE, value.split(','))?;
    let mut t: Option<&str> = None;
    let mut signatures = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let Some((key, val)) = entry.trim().split_once('=') else {
            return Err(malformed(format!(
                "{STRIPE_SIGNATURE} entry {} has no '='",
                i + 1
            )));
        };
        match key {
            "t" if t.is_some() => {
                return Err(malformed(format!(
                    "{STRIPE_SIGNATURE} has more than one t="
                )));
            }
            "t" => t = Some(val),
            "v1" => signatures.push(hex::decode(val).map_err(|_| {
                malformed(format!(
                    "{STRIPE_SIGNATURE} entry {} (v1) is not hex",
                    i + 1
                ))
            })?),
            // v0 (Stripe's test-mode legacy scheme) and any later one: not ours to check.
            _ => {}
        }
    }
    let t = t.ok_or_else(|| malformed(format!("{STRIPE_SIGNATURE} has no t= timestamp")))?;
    let timestamp = parse_timestamp("stripe-signature t=", t)?;
    Ok(StripeHeader {
        t,
        timestamp,
        signatures,
    })
}

/// Reads `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64> [...]`; other
/// versions are skipped.
pub(super) fn read_standard(headers: &HeaderMap) -> Result<StandardHeaders<'_>, SignatureError> {
    let id = header(headers, WEBHOOK_ID)?;
    let ts = header(headers, WEBHOOK_TIMESTAMP)?;
    let value = signature_header(headers, WEBHOOK_SIGNATURE)?;
    let timestamp = parse_timestamp(WEBHOOK_TIMESTAMP, ts)?;
    let entries = bounded_entries(WEBHOOK_SIGNATURE, value.split_ascii_whitespace())?;
    let mut signatures = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let Some((version, sig)) = entry.split_once(',') else {
            return Err(malformed(format!(
                "{WEBHOOK_SIGNATURE} entry {} has no ','",
                i + 1
            )));
        };
        // Other versions (v1a, asymmetric signatures...) are not ours to check.
        if version == "v1" {
            signatures.push(b64_decode(sig).ok_or_else(|| {
                malformed(format!(
                    "{WEBHOOK_SIGNATURE} entry {} (v1) is not base64",
                    i + 1
                ))
            })?);
        }
    }
    Ok(StandardHeaders {
        id,
        ts,
        timestamp,
        signatures,
    })
}

fn malformed(why: String) -> SignatureError {
    SignatureError::Malformed(why)
}

/// A header's only value, as text.
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, SignatureError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(SignatureError::Unsigned(name))?;
    if values.next().is_some() {
        return Err(malformed(format!("{name} is sent more than once")));
    }
    let text = value
        .to_str()
        .map_err(|_| malformed(format!("{name} is not visible ASCII")))?;
    if text.trim().is_empty() {
        return Err(malformed(format!("{name} is empty")));
    }
    Ok(text)
}

/// A signature header, refused before parsing when it is over the size bound.
fn signature_header<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<&'a str, SignatureError> {
    if let Some(v) = headers.get(name)
        && v.len() > MAX_SIGNATURE_HEADER_BYTES
    {
        return Err(malformed(format!(
            "{name} is {} bytes, over the {MAX_SIGNATURE_HEADER_BYTES}-byte limit",
            v.len()
        )));
    }
    header(headers, name)
}

/// The entries, refused when there are more than [`MAX_SIGNATURE_ENTRIES`].
fn bounded_entries<'a>(
    name: &'static str,
    entries: impl Iterator<Item = &'a str>,
) -> Result<Vec<&'a str>, SignatureError> {
    let entries: Vec<&str> = entries.take(MAX_SIGNATURE_ENTRIES + 1).collect();
    if entries.len() > MAX_SIGNATURE_ENTRIES {
        return Err(malformed(format!(
            "{name} has more than {MAX_SIGNATURE_ENTRIES} entries"
        )));
    }
    Ok(entries)
}

/// Canonical decimal Unix seconds: digits only, no leading zero (but "0"), within i64.
fn parse_timestamp(what: &str, text: &str) -> Result<i64, SignatureError> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    let bad = || malformed(format!("{what} is not whole Unix seconds"));
    if !canonical {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}
