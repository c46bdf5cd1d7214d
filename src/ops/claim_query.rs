//! Finding claims: the filters `claims list`, `GET /v1/claims` and the page's search share, as
//! text (query parameters, form fields, command-line options), checked and turned into a
//! [`ClaimFilter`] in one place. Pure but for [`ClaimQuery::page`], the one read the three
//! share: the database's "now" comes in as an argument.

use crate::domain::claim::{Claim, ClaimState};
use crate::domain::duration::Dur;
use crate::ops::params::{self, ParamError};
use crate::store::{ClaimCursor, ClaimFilter, ClaimStore, StoreError};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::Deserialize;

/// The most claims one page or call lists.
pub const MAX_LIMIT: u32 = 1000;

/// The longest search text (longer ids are not ids claimd accepts).
pub const MAX_SEARCH_CHARS: usize = 512;

/// A filter as typed. Every field is optional; an empty one (a form's blank field) is unset.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimQuery {
    /// Search text: a message id, idempotency key or provider id (exact or its beginning),
    /// or a tenant (exact).
    pub q: Option<String>,
    /// Only this consumer.
    pub consumer: Option<String>,
    /// Only this state (`started`, `pending`, `completed`, `failed`, `needs_attention`), or
    /// `stuck` (started, lease expired).
    pub state: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only started claims whose lease expired.
    pub stuck: Option<bool>,
    /// Received at or after: a duration back from now (`1h`, `7d`) or a time (see
    /// [`time_bound`]).
    pub since: Option<String>,
    /// Received before: as `since`.
    pub until: Option<String>,
    /// Where the page starts: the `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// At most this many (at most [`MAX_LIMIT`]).
    pub limit: Option<u32>,
}

/// A filter that cannot be used, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// An unknown state.
    #[error(
        "state {0:?} is not one of started, pending, completed, failed, needs_attention, stuck"
    )]
    State(String),
    /// `since` or `until` is neither a duration nor a time.
    #[error(
        "{field} {value:?} is neither a duration back from now (like 1h or 7d) nor a time (like 2026-05-01T12:00:00Z or 2026-05-01 12:00, UTC)"
    )]
    Time {
        /// `since` or `until`.
        field: &'static str,
        /// What was given.
        value: String,
    },
    /// A cursor no listing gave.
    #[error("{0}")]
    Cursor(String),
    /// A limit of 0 or over [`MAX_LIMIT`].
    #[error("limit {0} must be between 1 and {MAX_LIMIT}")]
    Limit(u32),
    /// A search text too long to be an id.
    #[error("search text of {0} characters: at most {MAX_SEARCH_CHARS}")]
    Search(usize),
    /// Text or a time the store cannot be asked with (a NUL, a time outside years 1-9999, a
    /// window over 100 years).
    #[error(transparent)]
    Param(#[from] ParamError),
}

/// One page of claims and where the next starts.
#[derive(Debug)]
pub struct ClaimPage {
    /// The database's time the page was read at (what "stuck" and relative times mean).
    pub now: DateTime<Utc>,
    /// The claims, newest first.
    pub claims: Vec<Claim>,
    /// Where the next page starts, when this one is full.
    pub next: Option<ClaimCursor>,
}

/// Why a page could not be read: the query (the caller's mistake) or the store.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The query cannot be used.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `Some(trimmed)` unless blank.
fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A time bound as typed: a duration back from `now` (`90m`, `24h`, `7d`), an RFC 3339 time,
/// a date and time without a zone, read as UTC (`2026-05-01T12:00`, what a browser's
/// date-and-time field sends, or `2026-05-01 12:00:00`), or a date (its midnight, UTC).
pub fn time_bound(s: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let s = s.trim();
    if let Ok(d) = s.parse::<Dur>() {
        return Some(d.before(now).unwrap_or(DateTime::<Utc>::MIN_UTC));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    for f in [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc());
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
}

impl ClaimQuery {
    /// The store filter, with `default_limit` when no limit is given.
    pub fn filter(
        &self,
        now: DateTime<Utc>,
        default_limit: u32,
    ) -> Result<ClaimFilter, QueryError> {
        let mut stuck = self.stuck.unwrap_or(false);
        let state = match given(&self.state).as_deref() {
            None => None,
            Some("stuck") => {
                stuck = true;
                Some(ClaimState::Started)
            }
            Some(s) => Some(
                s.parse::<ClaimState>()
                    .map_err(|_| QueryError::State(s.to_string()))?,
            ),
        };
        // Checked before anything is read from them: the same refusal on both stores.
        let typed = [
            ("q", &self.q),
            ("consumer", &self.consumer),
            ("state", &self.state),
            ("tenant", &self.tenant),
            ("since", &self.since),
            ("until", &self.until),
            ("cursor", &self.cursor),
        ];
        params::texts(typed.iter().filter_map(|(f, v)| Some((*f, v.as_deref()?))))?;
        let time = |field: &'static str, v: &Option<String>| match given(v) {
            None => Ok(None),
            Some(s) => {
                if let Ok(d) = s.parse::<Dur>() {
                    params::window(field, d)?;
                }
                match time_bound(&s, now) {
                    Some(t) => Ok(Some(params::time(field, &s, t)?)),
                    None => Err(QueryError::Time { field, value: s }),
                }
            }
        };
        let limit = self.limit.unwrap_or(default_limit);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(QueryError::Limit(limit));
        }
        let search = given(&self.q);
        if let Some(n) = search.as_deref().map(|q| q.chars().count())
            && n > MAX_SEARCH_CHARS
        {
            return Err(QueryError::Search(n));
        }
        Ok(ClaimFilter {
            state,
            consumer: given(&self.consumer),
            stuck,
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            tenant: given(&self.tenant),
            search,
            after: given(&self.cursor)
                .map(|c| {
                    let at = c.parse::<ClaimCursor>().map_err(QueryError::Cursor)?;
                    params::time("cursor", &c, at.received_utc)?;
                    Ok::<_, QueryError>(at)
                })
                .transpose()?,
            limit,
        })
    }

    /// Reads the page this query asks for (`default_limit` claims without a limit): the store's
    /// now, the filter, the listing and its next cursor, as `claims list`, `GET /v1/claims` and
    /// the page's search all need.
    pub async fn page(
        &self,
        store: &dyn ClaimStore,
        default_limit: u32,
    ) -> Result<ClaimPage, PageError> {
        let now = store.now().await?;
        let filter = self.filter(now, default_limit)?;
        let claims = store.list(&filter).await?;
        let next = ClaimCursor::next(&claims, filter.limit);
        Ok(ClaimPage { now, claims, next })
    }

    /// The same query at another page (`cursor`), as URL query parameters, for a "next"
    /// link.
    pub fn at(&self, cursor: Option<&ClaimCursor>) -> String {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        for (k, v) in [
            ("q", &self.q),
            ("consumer", &self.consumer),
            ("state", &self.state),
            ("tenant", &self.tenant),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = given(v) {
                pairs.push((k, v));
            }
        }
        if self.stuck == Some(true) {
            pairs.push(("stuck", "true".into()));
        }
        if let Some(l) = self.limit {
            pairs.push(("limit", l.to_string()));
        }
        if let Some(c) = cursor {
            pairs.push(("cursor", c.encode()));
        }
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", url_escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// Percent-encodes a query parameter value (everything but unreserved characters).
pub fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The address of a claim's page: `/claims/{consumer}/{message_id}`, with `?tenant=` when it
/// has one.
pub fn claim_path(claim: &Claim) -> String {
    claim_path_of(&claim.consumer, &claim.tenant, &claim.message_id)
}

/// [`claim_path`] from the claim's identity.
pub fn claim_path_of(consumer: &str, tenant: &str, message_id: &str) -> String {
    let mut p = format!(
        "/claims/{}/{}",
        url_escape(consumer),
        url_escape(message_id)
    );
    if !tenant.is_empty() {
        p.push_str("?tenant=");
        p.push_str(&url_escape(tenant));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-05-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn time_bounds_read_durations_times_and_dates() {
        let t = |s| time_bound(s, now()).map(|t| t.to_rfc3339());
        assert_eq!(t("1h").as_deref(), Some("2026-05-01T11:00:00+00:00"));
        assert_eq!(
            t("2026-04-30T10:00:00+02:00").as_deref(),
            Some("2026-04-30T08:00:00+00:00")
        );
        assert_eq!(
            t("2026-04-30T10:05").as_deref(),
            Some("2026-04-30T10:05:00+00:00")
        );
        assert_eq!(
            t("2026-04-30 10:05:07").as_deref(),
            Some("2026-04-30T10:05:07+00:00")
        );
        assert_eq!(
            t("2026-04-30").as_deref(),
            Some("2026-04-30T00:00:00+00:00")
        );
        assert_eq!(t("yesterday"), None);
    }

    #[test]
    fn a_query_becomes_a_filter_and_names_what_is_wrong() {
        let q = ClaimQuery {
            q: Some("  order-1 ".into()),
            state: Some("stuck".into()),
            tenant: Some("".into()),
            since: Some("24h".into()),
            cursor: Some("1714564800000.42".into()),
            ..Default::default()
        };
        let f = q.filter(now(), 50).unwrap();
        assert_eq!(f.search.as_deref(), Some("order-1"));
        assert!(f.stuck && f.state == Some(ClaimState::Started));
        assert_eq!(f.tenant, None, "a blank field is no filter");
        assert_eq!(f.after.unwrap().id, 42);
        assert_eq!(f.limit, 50);
        let err = |q: ClaimQuery| q.filter(now(), 50).unwrap_err().to_string();
        assert!(
            err(ClaimQuery {
                state: Some("done".into()),
                ..Default::default()
            })
            .contains("state \"done\"")
        );
        assert!(
            err(ClaimQuery {
                until: Some("soon".into()),
                ..Default::default()
            })
            .starts_with("until \"soon\"")
        );
        assert!(
            err(ClaimQuery {
                cursor: Some("x".into()),
                ..Default::default()
            })
            .contains("cursor \"x\"")
        );
        assert!(
            err(ClaimQuery {
                limit: Some(0),
                ..Default::default()
            })
            .contains("limit 0")
        );
    }

    #[test]
    fn what_no_store_can_be_asked_is_refused_by_name() {
        let err = |q: ClaimQuery| q.filter(now(), 50).unwrap_err().to_string();
        let nul = |v: &str| Some(format!("a{v}\0"));
        for (field, q) in [
            (
                "q",
                ClaimQuery {
                    q: nul(""),
                    ..Default::default()
                },
            ),
            (
                "tenant",
                ClaimQuery {
                    tenant: nul(""),
                    ..Default::default()
                },
            ),
            (
                "consumer",
                ClaimQuery {
                    consumer: nul(""),
                    ..Default::default()
                },
            ),
            (
                "cursor",
                ClaimQuery {
                    cursor: nul("1."),
                    ..Default::default()
                },
            ),
        ] {
            assert!(
                err(q).starts_with(&format!("{field} contains a NUL byte")),
                "{field}"
            );
        }
        let since = |s: &str| ClaimQuery {
            since: Some(s.into()),
            ..Default::default()
        };
        assert!(err(since("99999999d")).starts_with("since \"99999999d\" reaches further back"));
        assert!(since("36500d").filter(now(), 50).is_ok());
        assert!(err(since("0000-06-01")).starts_with("since \"0000-06-01\" is outside"));
        // A cursor before 4713 BC (PostgreSQL's first day), and one after year 9999.
        for c in ["-220000000000000000.1", "253402300800000000.1"] {
            let q = ClaimQuery {
                cursor: Some(c.into()),
                ..Default::default()
            };
            assert!(
                err(q).starts_with(&format!("cursor {c:?} is outside")),
                "{c}"
            );
        }
    }

    #[test]
    fn the_next_page_keeps_the_filters_and_escapes_them() {
        let q = ClaimQuery {
            q: Some("a&b c".into()),
            state: Some("failed".into()),
            ..Default::default()
        };
        let c = ClaimCursor {
            received_utc: now(),
            id: 7,
        };
        assert_eq!(
            q.at(Some(&c)),
            "q=a%26b%20c&state=failed&cursor=1777636800000000.7"
        );
        // A cursor keeps the microseconds PostgreSQL stores (in milliseconds the next page
        // left out claims received in the same millisecond as the last one shown).
        let fine = ClaimCursor {
            received_utc: now() + chrono::Duration::microseconds(123_456),
            id: 7,
        };
        let back: ClaimCursor = fine.encode().parse().unwrap();
        assert_eq!((back.received_utc, back.id), (fine.received_utc, 7));
        assert_eq!(
            claim_path_of("p", "t/1", "x y"),
            "/claims/p/x%20y?tenant=t%2F1"
        );
    }
}
