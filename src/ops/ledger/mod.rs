//! `claimd reconcile --ledger`: claimd's claims against the provider's own ledger (its list
//! of objects), key by key: doubles, orphans, missing payments, amount, currency and status
//! disagreements, and totals per tenant and currency.
//!
//! - [`describe`]: the `[consumers.effect.ledger]` description into URLs and readings (pure).
//! - [`fetch`]: paging through the provider's list, through the consumer's destination (rate
//!   limit and breaker), into a spill file sorted by key.
//! - [`matching`]: one key's claim and objects into findings and totals (pure).
//! - [`render`]: the table and CSV.
//!
//! **Memory.** Neither side is held whole. The provider lists in creation order, so its
//! objects are reduced to compact rows (key, id, amount, currency, status, created) and
//! written to a temporary SQLite file, then read back in key order [`SPILL_PAGE`] at a time;
//! the store's claims are read in key order by keyset paging, [`STORE_PAGE`] at a time. What
//! stays in memory is two pages, one key's group, the totals (one bucket per tenant and
//! currency) and at most [`matching::MAX_FINDINGS`] findings. Disk: about 100 bytes per
//! provider object in the temporary directory, deleted at the end.

pub mod describe;
pub mod fetch;
#[cfg(feature = "sqlite")]
pub mod spill;
#[cfg(not(feature = "sqlite"))]
pub mod spill_off;
#[cfg(not(feature = "sqlite"))]
pub use spill_off as spill;
pub mod matching;
pub mod render;

use crate::config::EffectConfig;
use crate::engine::consumer::Consumer;
use crate::ops::operator_command::OperatorCommands;
use crate::store::{LedgerClaim, Store, StoreError};
use chrono::{DateTime, Utc};
use describe::ObjectReader;
use matching::{ConsumerLedger, LedgerObject, Matcher};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Claims read from the store per page.
pub const STORE_PAGE: u32 = 500;
/// Provider objects read back from the spill file per page.
pub const SPILL_PAGE: u32 = 2_000;

/// Why a ledger reconciliation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The temporary file the provider's objects go to.
    #[error("the ledger's spill file: {0}")]
    Spill(String),
    /// The cursor did not end.
    #[error(
        "the provider's list ran past {0} pages (effect.ledger.max_pages): is the cursor right?"
    )]
    TooManyPages(u32),
    /// The destination did not let the requests go.
    #[error("the provider's list was not read: {0}")]
    Held(&'static str),
    /// A page was not JSON.
    #[error("a page of the provider's list is unreadable: {0}")]
    BadPage(String),
    /// A `4xx` other than `429`.
    #[error("the provider refused the list request ({0}): {1}")]
    Refused(u16, String),
    /// No deciding answer after retries.
    #[error("the provider's list could not be read: {0}")]
    Unavailable(String),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(String),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerRun {
    /// Start of the window.
    pub from: DateTime<Utc>,
    /// End of the window (exclusive).
    pub to: DateTime<Utc>,
    /// Per consumer.
    pub consumers: Vec<ConsumerLedger>,
    /// Consumers without `[effect.ledger]` (not reconcilable this way).
    pub skipped_consumers: Vec<String>,
}

impl LedgerRun {
    /// Whether anything disagrees (the command exits 3).
    pub fn disagrees(&self) -> bool {
        self.consumers.iter().any(ConsumerLedger::disagrees)
    }
}

/// What is kept of a run per consumer (for `report`, the page and `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Start of the window.
    pub from: DateTime<Utc>,
    /// End of the window.
    pub to: DateTime<Utc>,
    /// Claims in the window.
    pub claims: u64,
    /// Provider objects in the window.
    pub objects: u64,
    /// Keys that agree.
    pub agreeing: u64,
    /// Findings per kind.
    pub mismatches: BTreeMap<String, u64>,
    /// Per tenant and currency, `provider - store` where not zero.
    pub differences: Vec<Difference>,
}

/// A totals bucket that does not balance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// Tenant.
    pub tenant: String,
    /// Currency.
    pub currency: String,
    /// `provider - store`, minor units.
    pub difference: i64,
}

impl Summary {
    /// The summary of one consumer's result.
    pub fn of(l: &ConsumerLedger, from: DateTime<Utc>, to: DateTime<Utc>) -> Summary {
        let mut mismatches: BTreeMap<String, u64> = matching::Kind::ALL
            .iter()
            .map(|k| (k.as_str().to_string(), 0))
            .collect();
        mismatches.extend(l.by_kind.clone());
        Summary {
            from,
            to,
            claims: l.counts.claims,
            objects: l.counts.objects,
            agreeing: l.counts.agreeing,
            mismatches,
            differences: l
                .totals
                .iter()
                .filter(|b| b.difference != 0)
                .map(|b| Difference {
                    tenant: b.tenant.clone(),
                    currency: b.currency.clone(),
                    difference: b.difference,
                })
                .collect(),
        }
    }

    /// All findings.
    pub fn total(&self) -> u64 {
        self.mismatches.values().sum()
    }
}

/// Reconciles every consumer with a ledger description (or only `only`) over `[from, to)`,
/// and keeps each consumer's summary in the store.
pub async fn run<'c>(
    store: &Store,
    consumers: impl IntoIterator<Item = &'c Arc<Consumer>>,
    commands: &OperatorCommands,
    only: Option<&str>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<LedgerRun, LedgerError> {
    run_reading(store, store, consumers, commands, only, from, to).await
}

/// [`run`], reading the claims from `claims` (a read replica, `[store] read_url`) and
/// keeping the summaries in `store` (the primary: a replica takes no writes).
pub async fn run_reading<'c>(
    store: &Store,
    claims: &Store,
    consumers: impl IntoIterator<Item = &'c Arc<Consumer>>,
    commands: &OperatorCommands,
    only: Option<&str>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<LedgerRun, LedgerError> {
    let mut run = LedgerRun {
        from,
        to,
        consumers: Vec::new(),
        skipped_consumers: Vec::new(),
    };
    let mut consumers: Vec<&Arc<Consumer>> = consumers
        .into_iter()
        .filter(|c| only.is_none_or(|o| o == c.name()))
        .collect();
    consumers.sort_by(|a, b| a.name().cmp(b.name()));
    for consumer in consumers {
        match reconcile_consumer(claims, consumer, commands, from, to).await? {
            Some(result) => {
                let summary = Summary::of(&result, from, to);
                let json = serde_json::to_string(&summary).unwrap_or_default();
                store.save_ledger_run(consumer.name(), &json).await?;
                run.consumers.push(result);
            }
            None => run.skipped_consumers.push(consumer.name().to_string()),
        }
    }
    Ok(run)
}

/// One consumer, or `None` when it has no `[effect.ledger]`.
pub async fn reconcile_consumer(
    store: &Store,
    consumer: &Consumer,
    commands: &OperatorCommands,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Option<ConsumerLedger>, LedgerError> {
    let EffectConfig::Http(http) = &consumer.config.effect else {
        return Ok(None);
    };
    let Some(ledger) = http.ledger.as_deref() else {
        return Ok(None);
    };
    let margin = chrono::Duration::from_std(ledger.margin.0).unwrap_or_default();
    let (wide_from, wide_to) = (from - margin, to + margin);
    let reader = ObjectReader::new(ledger, http.outcome.as_deref());
    let client = crate::provider::tls::http_client_builder()
        .timeout(http.timeout.0)
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(
            crate::provider::effect::http::header_map(&http.headers)
                .map_err(|e| LedgerError::Client(e.to_string()))?,
        )
        .build()
        .map_err(|e| LedgerError::Client(e.to_string()))?;
    let spill = spill::Spill::create().await?;
    let fetched = fetch::read_provider(
        consumer.name(),
        &client,
        &consumer.destination,
        &reader,
        wide_from,
        wide_to,
        &spill,
    )
    .await?;
    spill.seal().await?;
    tracing::info!(
        consumer = consumer.name(),
        pages = fetched.pages,
        objects = fetched.kept,
        "ledger: provider's list read; matching with the store"
    );
    let mut matcher = Matcher::new(consumer.name(), from, to, commands);
    let mut claims = ClaimPages {
        store,
        consumer: consumer.name(),
        from: wide_from,
        to: wide_to,
        buf: VecDeque::new(),
        after: (String::new(), 0),
        done: false,
    };
    let mut objects = ObjectPages {
        spill: &spill,
        buf: VecDeque::new(),
        last: None,
        done: false,
    };
    loop {
        claims.fill_if_empty().await?;
        objects.fill_if_empty().await?;
        let key = match (claims.buf.front(), objects.buf.front()) {
            (Some(c), Some(o)) => c.idem_key.as_str().min(o.key.as_str()).to_string(),
            (Some(c), None) => c.idem_key.clone(),
            (None, Some(o)) => o.key.clone(),
            (None, None) => break,
        };
        // A key's rows may continue on the next page: read on until they end.
        while !claims.done && claims.buf.back().is_some_and(|c| c.idem_key == key) {
            claims.fill().await?;
        }
        while !objects.done && objects.buf.back().is_some_and(|o| o.key == key) {
            objects.fill().await?;
        }
        let claim = claims
            .buf
            .front()
            .is_some_and(|c| c.idem_key == key)
            .then(|| claims.buf.pop_front())
            .flatten();
        // A second claim with the same key (a key template without the message id): its
        // objects were all matched to the first.
        while claims.buf.front().is_some_and(|c| c.idem_key == key) {
            claims.buf.pop_front();
        }
        let mut group = Vec::new();
        while objects.buf.front().is_some_and(|o| o.key == key) {
            group.extend(objects.buf.pop_front());
        }
        matcher.add(claim.map(|c| reader.claim(c)), group);
    }
    let mut result = matcher.finish();
    result.counts.without_key = fetched.without_key;
    result.counts.pages = fetched.pages;
    Ok(Some(result))
}

/// The store's claims of the window, in key order, a page at a time.
struct ClaimPages<'a> {
    store: &'a Store,
    consumer: &'a str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    buf: VecDeque<LedgerClaim>,
    after: (String, i64),
    done: bool,
}

impl ClaimPages<'_> {
    async fn fill(&mut self) -> Result<(), LedgerError> {
        let page = self
            .store
            .ledger_claims(
                self.consumer,
                self.from,
                self.to,
                (&self.after.0, self.after.1),
                STORE_PAGE,
            )
            .await?;
        self.done = page.len() < STORE_PAGE as usize;
        if let Some(last) = page.last() {
            self.after = (last.idem_key.clone(), last.id);
        }
        self.buf.extend(page);
        Ok(())
    }

    async fn fill_if_empty(&mut self) -> Result<(), LedgerError> {
        if self.buf.is_empty() && !self.done {
            self.fill().await?;
        }
        Ok(())
    }
}

/// The provider's objects, back from the spill file in key order, a page at a time.
struct ObjectPages<'a> {
    spill: &'a spill::Spill,
    buf: VecDeque<LedgerObject>,
    last: Option<LedgerObject>,
    done: bool,
}

impl ObjectPages<'_> {
    async fn fill(&mut self) -> Result<(), LedgerError> {
        let page = self.spill.page(self.last.as_ref(), SPILL_PAGE).await?;
        self.done = page.len() < SPILL_PAGE as usize;
        if let Some(last) = page.last() {
            self.last = Some(last.clone());
        }
        self.buf.extend(page);
        Ok(())
    }

    async fn fill_if_empty(&mut self) -> Result<(), LedgerError> {
        if self.buf.is_empty() && !self.done {
            self.fill().await?;
        }
        Ok(())
    }
}

/// A consumer's last ledger run as `report`, the page and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LedgerView {
    /// Consumer.
    pub consumer: String,
    /// When it ran (database time).
    pub ran_utc: DateTime<Utc>,
    /// What it found.
    #[serde(flatten)]
    pub summary: Summary,
}

impl LedgerView {
    /// The view of a stored run, `None` when its summary is unreadable (written by another
    /// version).
    pub fn from_record(r: &crate::store::LedgerRunRecord) -> Option<LedgerView> {
        Some(LedgerView {
            consumer: r.consumer.clone(),
            ran_utc: r.at_utc,
            summary: serde_json::from_value(r.summary.clone()).ok()?,
        })
    }

    /// Every consumer's last run, or only `only`'s.
    pub async fn all(store: &Store, only: Option<&str>) -> Result<Vec<LedgerView>, StoreError> {
        Ok(store
            .ledger_runs()
            .await?
            .iter()
            .filter(|r| only.is_none_or(|o| o == r.consumer))
            .filter_map(LedgerView::from_record)
            .collect())
    }
}
