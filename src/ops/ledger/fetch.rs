//! Paging through the provider's list ([`read_provider`]), each request through the
//! consumer's [`Destination`] (its rate limit and breaker), and the spill file the objects go
//! to (the [`super::spill::Spill`]): providers list in creation order, the merge needs key
//! order, so the compact objects are written to a temporary SQLite file and read back sorted
//! by key, a page at a time.

use super::LedgerError;
use super::describe::{ObjectReader, Skipped, first_url, next_url};
use super::spill::Spill;
use crate::engine::destination::{Destination, HeldBy, Verdict};
use chrono::{DateTime, Utc};
use reqwest::Client;
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;

/// How often a page is asked again after a failure that decides nothing (`5xx`, no answer).
const PAGE_TRIES: u32 = 5;
/// How long a run waits, in all, for the destination's breaker or pace to let a page go.
const MAX_HELD: Duration = Duration::from_secs(600);
/// How many `429`s in a row one page may get before the run gives up.
const MAX_RATE_LIMITED: u32 = 100;
/// Progress is logged every this many pages.
const PROGRESS_EVERY: u64 = 20;

/// What reading the provider's list came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fetched {
    /// Pages read.
    pub pages: u64,
    /// Objects kept (with a key, in the window).
    pub kept: u64,
    /// Objects without a claim key (not made by claimd).
    pub without_key: u64,
}

/// Reads every page of the provider's list for `[from, to)` into `spill`.
pub async fn read_provider(
    consumer: &str,
    client: &Client,
    destination: &Destination,
    reader: &ObjectReader<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    spill: &Spill,
) -> Result<Fetched, LedgerError> {
    let first = first_url(reader.ledger, from, to);
    let mut url = first.clone();
    let mut fetched = Fetched::default();
    let mut held_for = Duration::ZERO;
    let started = Instant::now();
    loop {
        if fetched.pages >= u64::from(reader.ledger.max_pages) {
            return Err(LedgerError::TooManyPages(reader.ledger.max_pages));
        }
        let page = get_page(client, destination, &url, &mut held_for).await?;
        fetched.pages += 1;
        let mut kept = Vec::new();
        for object in reader.items(&page) {
            match reader.read(object, from.timestamp(), to.timestamp()) {
                Ok(o) => kept.push(o),
                Err(Skipped::WithoutKey) => fetched.without_key += 1,
                Err(Skipped::OutsideWindow) => {}
            }
        }
        fetched.kept += kept.len() as u64;
        spill.insert(&kept).await?;
        if fetched.pages % PROGRESS_EVERY == 0 {
            tracing::info!(
                consumer,
                pages = fetched.pages,
                objects = fetched.kept,
                elapsed_s = started.elapsed().as_secs(),
                "ledger: reading the provider's list"
            );
        }
        match next_url(reader.ledger, &first, &page) {
            Some(next) => url = next,
            None => return Ok(fetched),
        }
    }
}

/// One page: through the destination, asked again after an answer that decides nothing.
async fn get_page(
    client: &Client,
    destination: &Destination,
    url: &str,
    held_for: &mut Duration,
) -> Result<Value, LedgerError> {
    let mut failures = 0;
    let mut limited = 0;
    loop {
        let pass = match destination
            .admit(Instant::now() + Duration::from_secs(30))
            .await
        {
            Ok(p) => p,
            Err(held) => {
                let wait = held.until.saturating_duration_since(Instant::now());
                *held_for += wait;
                if *held_for > MAX_HELD {
                    return Err(LedgerError::Held(match held.by {
                        HeldBy::Open => "its circuit breaker stays open",
                        HeldBy::Probing => "it is being probed",
                        HeldBy::Pace => "its rate limit leaves no room",
                    }));
                }
                tokio::time::sleep_until(held.until).await;
                continue;
            }
        };
        let answer = client.get(url).send().await;
        let (verdict, result) = match answer {
            Err(e) => (
                Verdict::Failed { retry_after: None },
                Err(format!("no answer: {e}")),
            ),
            Ok(r) => {
                let status = r.status().as_u16();
                let retry_after = crate::provider::effect::parse_retry_after(
                    r.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                );
                let body = r.bytes().await.unwrap_or_default();
                match status {
                    200..=299 => match serde_json::from_slice::<Value>(&body) {
                        Ok(page) => (Verdict::Answered, Ok(page)),
                        Err(e) => {
                            destination.record(pass, Verdict::Answered);
                            return Err(LedgerError::BadPage(format!("not JSON: {e}")));
                        }
                    },
                    429 => (
                        Verdict::RateLimited { retry_after },
                        Err("429 Too Many Requests".into()),
                    ),
                    500..=599 => (
                        Verdict::Failed { retry_after },
                        Err(format!("answered {status}")),
                    ),
                    _ => {
                        destination.record(pass, Verdict::Answered);
                        let text = String::from_utf8_lossy(&body);
                        return Err(LedgerError::Refused(
                            status,
                            crate::store::truncate(&text, 300),
                        ));
                    }
                }
            }
        };
        destination.record(pass, verdict);
        match result {
            Ok(page) => return Ok(page),
            // A 429 is the provider's pace, not a failure: the destination waits it out.
            Err(e) if matches!(verdict, Verdict::RateLimited { .. }) => {
                limited += 1;
                if limited >= MAX_RATE_LIMITED {
                    return Err(LedgerError::Unavailable(e));
                }
            }
            Err(e) => {
                failures += 1;
                if failures >= PAGE_TRIES {
                    return Err(LedgerError::Unavailable(e));
                }
                tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
            }
        }
    }
}
