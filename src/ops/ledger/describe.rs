//! Pure: the ledger description ([`LedgerConfig`]) into requests and readings: the first
//! page's URL for a window, the next page's URL from a page, a page's objects as
//! [`LedgerObject`]s, and a claim's payload as a [`ClaimSide`].

use super::matching::{ClaimSide, LedgerObject, ObjectVerdict};
use crate::config::{LedgerConfig, ValueOutcomes};
use crate::provider::effect::by_value::{self, Verdict};
use crate::store::LedgerClaim;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// A JSON pointer (RFC 6901), where an array index may also be negative: `-1` is the last
/// element (`/data/-1/id`: the last object's id, Stripe's next cursor).
pub fn pointer<'a>(value: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        return Some(value);
    }
    let mut at = value;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = match at {
            Value::Object(map) => map.get(&token)?,
            Value::Array(items) => {
                let i: i64 = token.parse().ok()?;
                let i = if i < 0 { items.len() as i64 + i } else { i };
                items.get(usize::try_from(i).ok()?)?
            }
            _ => return None,
        };
    }
    Some(at)
}

/// The value at `p` as text (strings without quotes); none when absent, null or `p` empty.
fn text(value: &Value, p: &str) -> Option<String> {
    if p.is_empty() {
        return None;
    }
    match pointer(value, p)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// An integer amount: a JSON integer, or a string holding one.
fn amount(value: &Value, p: &str) -> Option<i64> {
    match pointer(value, p)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// How much was refunded: an integer amount (or a string holding one), or a boolean that
/// says all of `amount` (`true`) or nothing (`false`).
fn refunded(value: &Value, p: &str, amount: Option<i64>) -> Option<i64> {
    if p.is_empty() {
        return None;
    }
    match pointer(value, p)? {
        Value::Bool(true) => Some(amount.unwrap_or(0)),
        Value::Bool(false) => Some(0),
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A time: seconds since 1970 (a number or a numeric string), or RFC 3339.
fn created(value: &Value, p: &str) -> Option<i64> {
    match pointer(value, p)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok().or_else(|| {
            DateTime::parse_from_rfc3339(s.trim())
                .ok()
                .map(|t| t.timestamp())
        }),
        _ => None,
    }
}

/// The first page's URL for the window `[from, to)` (margin included).
pub fn first_url(l: &LedgerConfig, from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let rfc = |t: DateTime<Utc>| {
        let s = t.to_rfc3339_opts(SecondsFormat::Secs, true);
        serde_urlencoded::to_string([("", s)])
            .map(|e| e.trim_start_matches('=').to_string())
            .unwrap_or_default()
    };
    l.url
        .replace("{from_unix}", &from.timestamp().to_string())
        .replace("{to_unix}", &to.timestamp().to_string())
        .replace("{from}", &rfc(from))
        .replace("{to}", &rfc(to))
}

/// The next page's URL after `page`, or `None` when `page` is the last (no `has_more`, no
/// objects, or no cursor).
pub fn next_url(l: &LedgerConfig, first: &str, page: &Value) -> Option<String> {
    let items = pointer(page, &l.items_pointer)
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if items == 0 {
        return None;
    }
    if !l.has_more_pointer.is_empty()
        && pointer(page, &l.has_more_pointer) != Some(&Value::Bool(true))
    {
        return None;
    }
    let cursor = text(page, &l.cursor_pointer)?;
    let mut url = reqwest::Url::parse(first).ok()?;
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| *k != l.cursor_param.as_str())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair(&l.cursor_param, &cursor);
    Some(url.into())
}

/// Why an object of a page was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// It carries no claim key: not made by claimd.
    WithoutKey,
    /// Created outside the window read.
    OutsideWindow,
}

/// How objects are read: the description, and the status table when there is one.
#[derive(Debug, Clone)]
pub struct ObjectReader<'a> {
    /// The description.
    pub ledger: &'a LedgerConfig,
    /// `[effect.outcome]` with its pointer replaced by `status_pointer` when that is set.
    outcome: Option<ValueOutcomes>,
    /// Where the status is (empty: nowhere).
    status_pointer: String,
}

impl<'a> ObjectReader<'a> {
    /// A reader for `ledger`, objects' statuses mapped by `outcome` when there is one.
    pub fn new(ledger: &'a LedgerConfig, outcome: Option<&ValueOutcomes>) -> Self {
        let status_pointer = match (&ledger.status_pointer, outcome) {
            (p, _) if !p.is_empty() => p.clone(),
            (_, Some(o)) => o.pointer.clone(),
            _ => String::new(),
        };
        ObjectReader {
            ledger,
            outcome: outcome.map(|o| ValueOutcomes {
                pointer: status_pointer.clone(),
                ..o.clone()
            }),
            status_pointer,
        }
    }

    /// A page's objects (at `items_pointer`).
    pub fn items<'v>(&self, page: &'v Value) -> &'v [Value] {
        pointer(page, &self.ledger.items_pointer)
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// One object, kept when it has a key and was created in `[from, to)`.
    pub fn read(&self, object: &Value, from: i64, to: i64) -> Result<LedgerObject, Skipped> {
        let l = self.ledger;
        let key = text(object, &l.key_pointer).ok_or(Skipped::WithoutKey)?;
        let created = created(object, &l.created_pointer).unwrap_or(from);
        if created < from || created >= to {
            return Err(Skipped::OutsideWindow);
        }
        let verdict = match &self.outcome {
            None => ObjectVerdict::Completed,
            Some(map) => match by_value::read(map, object).verdict {
                Some(Verdict::Completed) => ObjectVerdict::Completed,
                Some(Verdict::Pending) => ObjectVerdict::Pending,
                Some(Verdict::NeedsAttention) => ObjectVerdict::NeedsAttention,
                Some(Verdict::Failed) => ObjectVerdict::Failed,
                None => ObjectVerdict::Unknown,
            },
        };
        let amount = amount(object, &l.amount_pointer);
        Ok(LedgerObject {
            key,
            id: text(object, &l.id_pointer).unwrap_or_default(),
            refunded: refunded(object, &l.refunded_pointer, amount),
            amount,
            currency: text(object, &l.currency_pointer).map(|c| c.to_lowercase()),
            status: text(object, &self.status_pointer),
            verdict,
            created,
        })
    }

    /// A stored claim, its amount and currency read from its payload.
    pub fn claim(&self, c: LedgerClaim) -> ClaimSide {
        let payload: Option<Value> = serde_json::from_slice(&c.payload).ok();
        let (amount_v, currency_v) = match &payload {
            Some(p) => (
                amount(p, &self.ledger.payload_amount_pointer),
                text(p, &self.ledger.payload_currency_pointer).map(|c| c.to_lowercase()),
            ),
            None => (None, None),
        };
        ClaimSide {
            key: c.idem_key,
            tenant: c.tenant,
            message_id: c.message_id,
            state: c.state,
            received: c.received_utc,
            amount: amount_v,
            currency: currency_v,
            provider_id: c.provider_id,
            // An erased payload is empty (intake takes no empty message for a ledger's JSON).
            erased: c.payload.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stripe() -> LedgerConfig {
        LedgerConfig {
            url: "https://api.stripe.com/v1/payment_intents?limit=100&created[gte]={from_unix}&created[lt]={to_unix}".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_pointer_may_count_from_the_end() {
        let v = json!({"data": [{"id": "a"}, {"id": "b"}], "a/b": 1});
        assert_eq!(pointer(&v, "/data/-1/id"), Some(&json!("b")));
        assert_eq!(pointer(&v, "/data/0/id"), Some(&json!("a")));
        assert_eq!(pointer(&v, "/data/-3/id"), None);
        assert_eq!(pointer(&v, "/a~1b"), Some(&json!(1)));
        assert_eq!(pointer(&v, "data"), None);
    }

    #[test]
    fn pages_follow_the_cursor_until_has_more_is_false() {
        let l = stripe();
        let first = first_url(
            &l,
            DateTime::from_timestamp(10, 0).unwrap(),
            DateTime::from_timestamp(20, 0).unwrap(),
        );
        assert_eq!(
            first,
            "https://api.stripe.com/v1/payment_intents?limit=100&created[gte]=10&created[lt]=20"
        );
        let page = json!({"data": [{"id": "pi_1"}, {"id": "pi_2"}], "has_more": true});
        let next = next_url(&l, &first, &page).unwrap();
        assert!(next.ends_with("&starting_after=pi_2"), "{next}");
        assert!(next.contains("limit=100"), "{next}");
        let again = next_url(
            &l,
            &next,
            &json!({"data": [{"id": "pi_3"}], "has_more": true}),
        )
        .unwrap();
        assert_eq!(again.matches("starting_after").count(), 1, "{again}");
        assert!(
            next_url(
                &l,
                &first,
                &json!({"data": [{"id": "x"}], "has_more": false})
            )
            .is_none()
        );
        assert!(next_url(&l, &first, &json!({"data": [], "has_more": true})).is_none());
    }

    #[test]
    fn objects_are_read_by_the_outcome_table_and_skipped_without_a_key() {
        let l = stripe();
        let outcome = ValueOutcomes {
            pointer: "/status".into(),
            completed: vec!["succeeded".into()],
            failed: vec!["canceled".into()],
            ..Default::default()
        };
        let r = ObjectReader::new(&l, Some(&outcome));
        let o = json!({"id": "pi_1", "amount": 1999, "currency": "EUR", "created": 15,
                       "status": "succeeded", "metadata": {"claimd_key": "k1"}});
        let read = r.read(&o, 10, 20).unwrap();
        assert_eq!(read.key, "k1");
        assert_eq!(read.amount, Some(1999));
        assert_eq!(read.currency.as_deref(), Some("eur"));
        assert_eq!(read.verdict, ObjectVerdict::Completed);
        assert_eq!(read.status.as_deref(), Some("succeeded"));
        let canceled = json!({"id": "pi_2", "created": 15, "status": "canceled", "metadata": {"claimd_key": "k"}});
        assert_eq!(
            r.read(&canceled, 10, 20).unwrap().verdict,
            ObjectVerdict::Failed
        );
        let odd = json!({"id": "pi_3", "created": 15, "status": "weird", "metadata": {"claimd_key": "k"}});
        assert_eq!(
            r.read(&odd, 10, 20).unwrap().verdict,
            ObjectVerdict::Unknown
        );
        assert_eq!(
            r.read(&json!({"id": "pi_4", "created": 15}), 10, 20),
            Err(Skipped::WithoutKey)
        );
        assert_eq!(r.read(&o, 16, 20), Err(Skipped::OutsideWindow));
        assert_eq!(
            read.refunded, None,
            "refunds are not read without refunded_pointer"
        );
        let rfc =
            json!({"id": "x", "created": "1970-01-01T00:00:12Z", "metadata": {"claimd_key": "k"}});
        assert_eq!(r.read(&rfc, 10, 20).unwrap().created, 12);
    }

    #[test]
    fn a_refund_is_read_as_an_amount_or_as_all_of_it() {
        let l = LedgerConfig {
            refunded_pointer: "/latest_charge/amount_refunded".into(),
            ..stripe()
        };
        let r = ObjectReader::new(&l, None);
        let pi = |charge: Value| {
            json!({"id": "pi_1", "amount": 500, "created": 15, "latest_charge": charge,
                   "metadata": {"claimd_key": "k"}})
        };
        let read = |o: Value| r.read(&o, 10, 20).unwrap().refunded;
        assert_eq!(read(pi(json!({"amount_refunded": 500}))), Some(500));
        assert_eq!(read(pi(json!({"amount_refunded": 0}))), Some(0));
        assert_eq!(read(pi(Value::Null)), None);
        let l = LedgerConfig {
            refunded_pointer: "/refunded".into(),
            ..stripe()
        };
        let r = ObjectReader::new(&l, None);
        let o = json!({"id": "ch_1", "amount": 500, "created": 15, "refunded": true,
                       "metadata": {"claimd_key": "k"}});
        assert_eq!(r.read(&o, 10, 20).unwrap().refunded, Some(500));
    }
}
