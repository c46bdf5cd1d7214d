//! The HTTP effect's request shaping and status-check settings (`[consumers.effect]` with
//! `kind = "http"`, and its `[consumers.effect.status]` table): the parts of the HTTP effect's
//! configuration that say how a request is built from a message and how a status answer is
//! read. Their defaults keep the behaviour of a plain pass-through effect.

use serde::{Deserialize, Serialize};

/// How the request body is built from the message (`effect.body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyMode {
    /// The message body, verbatim, with its content type (the default).
    #[default]
    Passthrough,
    /// `effect.body_template` rendered as JSON (`application/json`).
    Json,
    /// `effect.body_template` rendered as `application/x-www-form-urlencoded`, nested tables
    /// and lists named the way Stripe reads them (`metadata[order]=7`, `items[0][price]=p`).
    Form,
}

/// Whether the status endpoint is checked when `claimd run` starts (`effect.status.probe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeMode {
    /// A probe answered with something other than the "not found" shape stops the start.
    #[default]
    Refuse,
    /// It is logged as a warning; the worker starts.
    Warn,
    /// No probe.
    Off,
}

/// How a status endpoint's answer is read (`[consumers.effect.status]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatusCheck {
    /// Statuses that mean "the provider has no record of this key" (default `[404]`). Leave
    /// it empty when the endpoint is a search that answers `200` with an empty list: then a
    /// `404` (an endpoint that does not exist) is "unknown", never "not applied".
    pub not_found_status: Vec<u16>,
    /// A JSON pointer (RFC 6901, like `/data/0`) that must be present and not null in a `2xx`
    /// answer for "found"; a `2xx` answer without it is "not found". Empty: any `2xx` is
    /// "found".
    pub found_pointer: String,
    /// A JSON pointer to the provider's own id of the effect in a "found" answer (like
    /// `/data/0/id`), written to the claim's history.
    pub id_pointer: String,
    /// The start-up probe: a lookup of a key that cannot exist must come back "not found".
    pub probe: ProbeMode,
}

impl Default for StatusCheck {
    fn default() -> Self {
        StatusCheck {
            not_found_status: vec![404],
            found_pointer: String::new(),
            id_pointer: String::new(),
            probe: ProbeMode::Refuse,
        }
    }
}

/// Checks a JSON pointer's syntax: empty, or `/`-separated tokens.
pub fn check_pointer(pointer: &str) -> Result<(), String> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{pointer:?} is not a JSON pointer: it must start with '/' (like \"/data/0\")"
        ))
    }
}

/// Which HTTP version the effect speaks to its provider (`effect.http_version`): `"1.1"` or
/// `"2"` (written as a string or a number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum HttpVersion {
    /// HTTP/1.1 (the default): one connection per call in flight, reused between calls. A
    /// broken connection fails only the call on it.
    #[default]
    #[serde(rename = "1.1")]
    Http1,
    /// HTTP/2 only: every call to a provider shares one connection, as streams. `https://`
    /// providers must offer `h2` in TLS negotiation; `http://` ones must take HTTP/2 without
    /// upgrade (prior knowledge, "h2c"). A call costs a few KiB instead of a connection's
    /// ~30 KiB, but calls beyond the provider's stream limit wait for a free stream, and a
    /// broken connection makes every call on it unknown (the sweeper settles them).
    #[serde(rename = "2")]
    Http2,
}

impl<'de> Deserialize<'de> for HttpVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Version;
        impl serde::de::Visitor<'_> for Version {
            type Value = HttpVersion;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"1.1\" or \"2\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HttpVersion, E> {
                match v {
                    "1.1" => Ok(HttpVersion::Http1),
                    "2" => Ok(HttpVersion::Http2),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<HttpVersion, E> {
                match v {
                    2 => Ok(HttpVersion::Http2),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<HttpVersion, E> {
                match v {
                    2 => Ok(HttpVersion::Http2),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<HttpVersion, E> {
                if v == 1.1 {
                    Ok(HttpVersion::Http1)
                } else if v == 2.0 {
                    Ok(HttpVersion::Http2)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(Version)
    }
}

/// `effect.rate_limit`: requests per second, written `"N/s"` or `"N/m"` (a per-minute figure is
/// spread evenly: `"600/m"` is 10 a second).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(into = "String")]
pub struct RateLimit {
    /// Requests per second.
    pub per_second: f64,
    written: (u32, char),
}

impl RateLimit {
    /// Reads `"50/s"` or `"3000/m"`.
    pub fn parse(text: &str) -> Result<RateLimit, String> {
        let bad = || format!("{text:?} is not a rate: write it like \"50/s\" or \"3000/m\"");
        let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(format!("{text:?}: a rate must be at least 1"));
        }
        let (per_second, unit) = match unit.trim() {
            "s" => (f64::from(n), 's'),
            "m" => (f64::from(n) / 60.0, 'm'),
            _ => return Err(bad()),
        };
        Ok(RateLimit {
            per_second,
            written: (n, unit),
        })
    }
}

impl From<RateLimit> for String {
    fn from(r: RateLimit) -> String {
        format!("{}/{}", r.written.0, r.written.1)
    }
}

impl<'de> Deserialize<'de> for RateLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        RateLimit::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod rate_tests {
    use super::RateLimit;

    #[test]
    fn rates_read_per_second_and_per_minute() {
        assert_eq!(RateLimit::parse("50/s").unwrap().per_second, 50.0);
        assert_eq!(RateLimit::parse("600/m").unwrap().per_second, 10.0);
        assert!(RateLimit::parse("0/s").is_err());
        assert!(RateLimit::parse("50").unwrap_err().contains("\"50/s\""));
        assert!(RateLimit::parse("5/h").is_err());
        assert_eq!(String::from(RateLimit::parse("3000/m").unwrap()), "3000/m");
    }
}

/// How a value in the provider's answer decides an effect's outcome
/// (`[consumers.effect.outcome]`): for a payment, a `2xx` says only that the provider took the
/// request, and the object's status (`succeeded`, `processing`, `requires_action`, ...) says
/// what became of it. Read in the call's own answer, in a status lookup's "found" answer (the
/// object at `effect.status.found_pointer`, when set) and in a provider event's object.
/// A value no list names is unknown: never completed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValueOutcomes {
    /// A JSON pointer to the value, within the object (like `/status`).
    pub pointer: String,
    /// Values that mean the effect is done.
    pub completed: Vec<String>,
    /// Values that mean the provider accepted it but has not finished (`processing`,
    /// `requires_capture`): the claim is `pending` and is never sent again.
    pub pending: Vec<String>,
    /// Values that need a person or the customer to act (`requires_action`).
    pub needs_attention: Vec<String>,
    /// Values that mean it will not happen (`requires_payment_method`, `canceled`).
    pub failed: Vec<String>,
    /// A JSON pointer to the provider's own id of the object (like `/id`), kept on the claim
    /// so that its events find it.
    pub id_pointer: String,
    /// A JSON pointer to the provider's reason for a failure or a request for action (like
    /// `/last_payment_error/message`), kept with the claim's reason.
    pub reason_pointer: String,
    /// How long after a claim became `pending` the status endpoint is first asked again; the
    /// wait then grows with the claim's time in `pending` (a quarter of it), up to an hour.
    pub pending_poll: crate::domain::duration::Dur,
    /// How long a claim may stay `pending`; after that it is parked for a person with the
    /// reason "still pending after …".
    pub pending_for: crate::domain::duration::Dur,
}

impl Default for ValueOutcomes {
    fn default() -> Self {
        ValueOutcomes {
            pointer: String::new(),
            completed: Vec::new(),
            pending: Vec::new(),
            needs_attention: Vec::new(),
            failed: Vec::new(),
            id_pointer: String::new(),
            reason_pointer: String::new(),
            pending_poll: crate::domain::duration::Dur(std::time::Duration::from_secs(30)),
            pending_for: crate::domain::duration::Dur(std::time::Duration::from_secs(
                7 * 24 * 3600,
            )),
        }
    }
}

impl ValueOutcomes {
    /// The first problem with the table, as `(key, message)`: pointers that are not pointers,
    /// no values at all, one value in two lists, polling that cannot happen.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for (key, p) in [
            ("pointer", &self.pointer),
            ("id_pointer", &self.id_pointer),
            ("reason_pointer", &self.reason_pointer),
        ] {
            check_pointer(p).map_err(|e| (key, e))?;
        }
        if self.pointer.is_empty() {
            return Err((
                "pointer",
                "names no value: write the value's JSON pointer, like \"/status\"".into(),
            ));
        }
        let lists = [
            ("completed", &self.completed),
            ("pending", &self.pending),
            ("needs_attention", &self.needs_attention),
            ("failed", &self.failed),
        ];
        if self.completed.is_empty() {
            return Err((
                "completed",
                "is empty: no answer could ever complete a claim".into(),
            ));
        }
        let mut seen = std::collections::HashMap::new();
        for (list, values) in lists {
            for v in values.iter() {
                if let Some(other) = seen.insert(v.as_str(), list)
                    && other != list
                {
                    return Err((
                        list,
                        format!("{v:?} is also in {other}: a value has one meaning"),
                    ));
                }
            }
        }
        if self.pending_poll.0 < std::time::Duration::from_secs(1) {
            return Err(("pending_poll", "must be at least 1s".into()));
        }
        if self.pending_for.0 <= self.pending_poll.0 {
            return Err(("pending_for", "must be longer than pending_poll".into()));
        }
        Ok(())
    }
}
