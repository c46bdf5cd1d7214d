//! Masking of sensitive values wherever claimd shows a payload or text that may quote one (the
//! operator page, `claimd claims show`, logs, trace attributes, outcome events). Pure.
//!
//! What is sensitive in a JSON payload:
//! - every field named in [`DEFAULT_NAMES`], at any depth (names compared without case, `-`
//!   read as `_`: `Card-Number` is `card_number`);
//! - every field a consumer's `sensitive_fields` names by JSON pointer (`/card/number`);
//! - in any field, card numbers (13 to 19 digits passing the Luhn check) and e-mail
//!   addresses ([`mask_line`]).
//!
//! How a value is masked ([`mask_value`]): a card-like value (13 to 19 digits, spaces and
//! dashes aside) keeps its last four digits (`"••••4242"`), as receipts show them; any other
//! text or number becomes `"[redacted]"`; an object or array keeps its shape with every value
//! in it masked so; `null` stays `null`.
//!
//! Text that may quote a payload (a provider's answer, an error, a payload that is not JSON)
//! is masked by [`Redactor::text`]: the sensitive values found in the payload, card-like
//! digit runs and e-mail addresses.

use serde_json::Value;

/// Field names masked in every payload, at any depth, whatever the consumer's settings.
pub const DEFAULT_NAMES: &[&str] = &[
    "card",
    "card_number",
    "cardnumber",
    "pan",
    "cvc",
    "cvv",
    "cvv2",
    "email",
    "iban",
    "account_number",
    "password",
];

/// What replaces a masked value that is not card-like.
pub const REDACTED: &str = "[redacted]";

/// Whether a viewer sees sensitive values as they are or masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Sensitive values masked: the page, the HTTP API, logs, traces, outcome events.
    Masked,
    /// Everything as stored: `claimd claims show --reveal` (a local operator).
    Revealed,
}

/// Checks a consumer's `sensitive_fields`: each a JSON pointer (`/a/b`, RFC 6901).
pub fn check_pointers(pointers: &[String]) -> Result<(), String> {
    for p in pointers {
        if !p.starts_with('/') || p.len() < 2 {
            return Err(format!(
                "{p:?} is not a JSON pointer to a field (write it like \"/card/number\")"
            ));
        }
        let bad_escape = p
            .match_indices('~')
            .any(|(i, _)| !matches!(p.as_bytes().get(i + 1), Some(b'0' | b'1')));
        if bad_escape {
            return Err(format!(
                "{p:?}: '~' must be followed by 0 ('~') or 1 ('/') in a JSON pointer"
            ));
        }
    }
    Ok(())
}

/// The masked form of one value: last four digits of a card-like value, `"[redacted]"` for
/// any other text, number or boolean, objects and arrays masked value by value, `null` kept.
pub fn mask_value(value: &Value) -> Value {
    match value {
        Value::Null => Value::Null,
        Value::String(s) => Value::String(mask_str(s)),
        Value::Number(n) => Value::String(mask_str(&n.to_string())),
        Value::Bool(_) => Value::String(REDACTED.into()),
        Value::Array(a) => Value::Array(a.iter().map(mask_value).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), mask_value(v))).collect())
        }
    }
}

/// The masked form of a text value (see [`mask_value`]).
pub fn mask_str(s: &str) -> String {
    // Masked already (a field both a pointer and a default name cover): kept.
    let masked_card = s
        .strip_prefix("••••")
        .is_some_and(|d| d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit()));
    if masked_card || s == REDACTED {
        return s.to_string();
    }
    match card_digits(s) {
        Some(digits) => format!("••••{}", &digits[digits.len() - 4..]),
        None => REDACTED.into(),
    }
}

/// Text masked with no payload to go by (a log line, a trace attribute, an outcome event's
/// answer): card-like digit runs, e-mail addresses and, in JSON, the [`DEFAULT_NAMES`].
pub fn mask_text(text: &str) -> String {
    Redactor::default().text(text, &[], Exposure::Masked)
}

/// A log line masked: card numbers and e-mail addresses (the line's format is kept as it is).
pub fn mask_line(line: &str) -> String {
    mask_emails(&mask_card_runs(line))
}

/// The digits of a card-like value: 13 to 19 digits, with only spaces or dashes between.
fn card_digits(s: &str) -> Option<String> {
    if !s
        .chars()
        .all(|c| c.is_ascii_digit() || c == ' ' || c == '-')
    {
        return None;
    }
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    (13..=19).contains(&digits.len()).then_some(digits)
}

/// A consumer's masking: the default names and its own pointers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    pointers: Vec<String>,
}

impl Redactor {
    /// The masking of a consumer whose `sensitive_fields` are `pointers`.
    pub fn new(pointers: &[String]) -> Redactor {
        Redactor {
            pointers: pointers.to_vec(),
        }
    }

    /// Masks the sensitive fields of a JSON document in place; returns the values it masked
    /// (the text of each string or number, for [`Redactor::text`]).
    pub fn mask_json(&self, doc: &mut Value) -> Vec<String> {
        let mut found = Vec::new();
        for p in &self.pointers {
            if let Some(v) = doc.pointer_mut(p) {
                collect(v, &mut found);
                *v = mask_value(v);
            }
        }
        mask_names(doc, &mut found);
        found
    }

    /// A payload as a viewer may see it: as stored when `Revealed`; masked otherwise — a JSON
    /// payload field by field (as compact JSON), any other text by [`Redactor::text`].
    pub fn payload(&self, payload: &[u8], exposure: Exposure) -> String {
        let raw = String::from_utf8_lossy(payload);
        if exposure == Exposure::Revealed {
            return raw.into_owned();
        }
        match serde_json::from_slice::<Value>(payload) {
            // Card numbers and addresses in fields of any name are masked too.
            Ok(mut doc) => {
                self.mask_json(&mut doc);
                mask_cards_and_addresses(&mut doc);
                doc.to_string()
            }
            Err(_) => self.text(&raw, &[], exposure),
        }
    }

    /// The sensitive values of a payload (what [`Redactor::text`] masks in texts that may
    /// quote it); empty for a payload that is not JSON.
    pub fn secrets(&self, payload: &[u8]) -> Vec<String> {
        match serde_json::from_slice::<Value>(payload) {
            Ok(mut doc) => self.mask_json(&mut doc),
            Err(_) => Vec::new(),
        }
    }

    /// Text that may quote a payload (a provider's answer, an error, a log line) as a viewer
    /// may see it: when masked, the `secrets` of its payload, card-like digit runs and e-mail
    /// addresses are masked; a JSON text also field by field.
    pub fn text(&self, text: &str, secrets: &[String], exposure: Exposure) -> String {
        if exposure == Exposure::Revealed {
            return text.to_string();
        }
        let mut out = match serde_json::from_str::<Value>(text) {
            Ok(mut doc) if doc.is_object() || doc.is_array() => {
                mask_names(&mut doc, &mut Vec::new());
                doc.to_string()
            }
            _ => text.to_string(),
        };
        let mut longest_first: Vec<&String> = secrets.iter().filter(|s| s.len() >= 4).collect();
        longest_first.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for s in longest_first {
            out = out.replace(s.as_str(), &mask_str(s));
        }
        mask_emails(&mask_card_runs(&out))
    }
}

/// The text of every string or number under `v`.
fn collect(v: &Value, found: &mut Vec<String>) {
    match v {
        Value::String(s) => found.push(s.clone()),
        Value::Number(n) => found.push(n.to_string()),
        Value::Array(a) => a.iter().for_each(|x| collect(x, found)),
        Value::Object(o) => o.values().for_each(|x| collect(x, found)),
        _ => {}
    }
}

/// Masks card numbers and e-mail addresses in every value under `v` ([`mask_line`]; a
/// number that is a card number becomes its masked text).
fn mask_cards_and_addresses(v: &mut Value) {
    match v {
        Value::String(s) => *s = mask_line(s),
        Value::Number(n) => {
            let digits = n.to_string();
            let card = digits.bytes().all(|b| b.is_ascii_digit())
                && (13..=19).contains(&digits.len())
                && luhn(&digits);
            if card {
                *v = Value::String(mask_str(&digits));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask_cards_and_addresses),
        Value::Object(o) => o.values_mut().for_each(mask_cards_and_addresses),
        _ => {}
    }
}

/// Masks every field named in [`DEFAULT_NAMES`], at any depth.
fn mask_names(v: &mut Value, found: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                let name = k.to_ascii_lowercase().replace('-', "_");
                if DEFAULT_NAMES.contains(&name.as_str()) {
                    collect(x, found);
                    *x = mask_value(x);
                } else {
                    mask_names(x, found);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| mask_names(x, found)),
        _ => {}
    }
}

/// Whether a digit string passes the Luhn check every card number passes.
fn luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            if i % 2 == 1 {
                if d * 2 > 9 { d * 2 - 9 } else { d * 2 }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Masks card numbers written in text — runs of 13 to 19 digits that pass the Luhn check —
/// to their last four (other long numbers, such as timestamps, are left alone).
pub fn mask_card_runs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if (13..=19).contains(&run.len()) && luhn(run) {
            out.push_str("••••");
            out.push_str(&run[run.len() - 4..]);
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Masks e-mail addresses (`local@domain.tld`) written in text.
pub fn mask_emails(text: &str) -> String {
    let is_part = |c: char| c.is_ascii_alphanumeric() || "._%+-".contains(c);
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < chars.len() {
        if chars[i] == '@' {
            let mut start = i;
            while start > copied && is_part(chars[start - 1]) {
                start -= 1;
            }
            let mut end = i + 1;
            while end < chars.len() && is_part(chars[end]) {
                end += 1;
            }
            let domain: String = chars[i + 1..end].iter().collect();
            let domain = domain.trim_end_matches('.');
            if start < i && domain.contains('.') && !domain.starts_with('.') {
                out.extend(&chars[copied..start]);
                out.push_str(REDACTED);
                let end = i + 1 + domain.chars().count();
                copied = end;
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out.extend(&chars[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn show(pointers: &[&str], payload: Value) -> Value {
        let r = Redactor::new(&pointers.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        serde_json::from_str(&r.payload(payload.to_string().as_bytes(), Exposure::Masked)).unwrap()
    }

    #[test]
    fn card_numbers_keep_their_last_four_digits() {
        assert_eq!(mask_str("4242424242424242"), "••••4242");
        assert_eq!(mask_str("4242 4242 4242 4242"), "••••4242");
        assert_eq!(mask_str("4000-0566-5566-5556"), "••••5556");
        assert_eq!(mask_value(&json!(4242424242424242u64)), json!("••••4242"));
    }

    #[test]
    fn other_values_are_redacted_whole() {
        assert_eq!(mask_str("someone@example.test"), REDACTED);
        assert_eq!(mask_str("123"), REDACTED, "too short to be a card");
        assert_eq!(
            mask_value(&json!({"a": 1, "b": {"c": "4242424242424242"}})),
            json!({"a": REDACTED, "b": {"c": "••••4242"}}),
            "an object keeps its shape"
        );
        assert_eq!(mask_value(&json!(["x", true])), json!([REDACTED, REDACTED]));
        assert_eq!(mask_value(&Value::Null), Value::Null);
    }

    #[test]
    fn default_names_are_masked_at_any_depth_whatever_their_case() {
        let shown = show(
            &[],
            json!({"amount": 10, "customer": {"Email": "a@b.test", "name": "Ann"},
                   "items": [{"card-number": "4242424242424242", "cvc": "123"}]}),
        );
        assert_eq!(
            shown,
            json!({"amount": 10, "customer": {"Email": REDACTED, "name": "Ann"},
                   "items": [{"card-number": "••••4242", "cvc": REDACTED}]})
        );
    }

    #[test]
    fn pointers_mask_the_fields_they_name() {
        let shown = show(
            &["/card/number", "/address", "/missing/field"],
            json!({"card": {"number": "5555555555554444", "brand": "mc"},
                   "address": {"street": "1 Main St"}, "amount": 5}),
        );
        assert_eq!(
            shown,
            json!({"card": {"number": "••••4444", "brand": REDACTED},
                   "address": {"street": REDACTED}, "amount": 5})
        );
    }

    #[test]
    fn card_numbers_and_addresses_are_masked_in_fields_of_any_name() {
        let shown = show(
            &[],
            json!({"card": {"number": "4242424242424242"}, "notify": "ann@example.test",
                   "order": "1733500000001"}),
        );
        assert_eq!(
            shown,
            json!({"card": {"number": "••••4242"}, "notify": REDACTED, "order": "1733500000001"}),
        );
        let shown = show(
            &[],
            json!({"pan": 1, "n": 4242424242424242u64, "id": 1733500000001u64}),
        );
        assert_eq!(
            shown,
            json!({"pan": REDACTED, "n": "••••4242", "id": 1733500000001u64})
        );
    }

    #[test]
    fn revealed_shows_the_payload_as_stored() {
        let r = Redactor::new(&[]);
        let raw = br#"{"email":"a@b.test"}"#;
        assert_eq!(
            r.payload(raw, Exposure::Revealed),
            r#"{"email":"a@b.test"}"#
        );
    }

    #[test]
    fn texts_lose_the_payloads_secrets_cards_and_addresses() {
        let r = Redactor::new(&["/customer/name".into()]);
        let payload = br#"{"customer": {"name": "Ann Example"}, "email": "ann@example.test"}"#;
        let secrets = r.secrets(payload);
        let text = "declined for Ann Example <ann@example.test>, card 4242424242424242, id 12";
        let masked = r.text(text, &secrets, Exposure::Masked);
        assert_eq!(
            masked,
            "declined for [redacted] <[redacted]>, card ••••4242, id 12"
        );
        assert_eq!(r.text(text, &secrets, Exposure::Revealed), text);
    }

    #[test]
    fn a_json_answer_is_masked_field_by_field() {
        let r = Redactor::new(&[]);
        let masked = r.text(r#"{"id":"ch_1","email":"x@y.test"}"#, &[], Exposure::Masked);
        let masked: Value = serde_json::from_str(&masked).unwrap();
        assert_eq!(masked, json!({"id": "ch_1", "email": REDACTED}));
    }

    #[test]
    fn text_that_is_no_address_is_left_alone() {
        assert_eq!(mask_emails("a @ b, x@y, @z.test"), "a @ b, x@y, @z.test");
        assert_eq!(mask_emails("to: a.b+c@ex.co."), "to: [redacted].");
        assert_eq!(mask_card_runs("order 123456789012"), "order 123456789012");
        assert_eq!(
            mask_card_runs("at 1733500000001, card 5555555555554444"),
            "at 1733500000001, card ••••4444",
            "a number that fails the Luhn check is no card"
        );
    }

    #[test]
    fn a_payload_that_is_not_json_is_masked_as_text() {
        let r = Redactor::new(&[]);
        assert_eq!(
            r.payload(
                b"to=ann@example.test&card=4242424242424242",
                Exposure::Masked
            ),
            "to=[redacted]&card=••••4242"
        );
    }

    #[test]
    fn pointers_are_checked() {
        assert!(check_pointers(&["/card/number".into(), "/a~1b".into()]).is_ok());
        for bad in ["card/number", "", "/", "/a~2"] {
            assert!(check_pointers(&[bad.into()]).is_err(), "{bad:?}");
        }
    }
}
