//! Pure: one key's claim and provider objects into findings and totals ([`Matcher`]), and the
//! merge of two key-ordered sequences into such groups ([`merge_sorted`]). The whole
//! reconciliation's logic, tested here without a provider or a store.
//!
//! Totals are built from the same groups as the findings, so that a bucket's difference is
//! exactly the sum of its findings' differences: a group that agrees adds the same amount to
//! both sides.

use crate::domain::claim::ClaimState;
use crate::ops::operator_command::{ClaimRef, Note, OperatorCommands};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

/// Most findings listed per consumer (each kind is always counted in full).
pub const MAX_FINDINGS: usize = 10_000;
/// Most keys listed per totals bucket as the items that make up its difference.
pub const MAX_ITEMS_PER_BUCKET: usize = 50;

/// What an object's status says of the money, by `[effect.outcome]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectVerdict {
    /// Completed (or no outcome table: every object counts): the money moved.
    Completed,
    /// Accepted, not final.
    Pending,
    /// Waiting for a person or the customer.
    NeedsAttention,
    /// It did not happen.
    Failed,
    /// A status the outcome table does not list.
    Unknown,
}

impl ObjectVerdict {
    /// The one-letter code kept in the spill file.
    pub fn code(self) -> &'static str {
        match self {
            ObjectVerdict::Completed => "c",
            ObjectVerdict::Pending => "p",
            ObjectVerdict::NeedsAttention => "a",
            ObjectVerdict::Failed => "f",
            ObjectVerdict::Unknown => "u",
        }
    }

    /// The verdict of a code from [`ObjectVerdict::code`].
    pub fn from_code(code: &str) -> ObjectVerdict {
        match code {
            "c" => ObjectVerdict::Completed,
            "p" => ObjectVerdict::Pending,
            "a" => ObjectVerdict::NeedsAttention,
            "f" => ObjectVerdict::Failed,
            _ => ObjectVerdict::Unknown,
        }
    }
}

/// One provider object, compact (what is kept of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerObject {
    /// The claim's key it carries.
    pub key: String,
    /// The provider's id.
    pub id: String,
    /// Amount in minor units, when readable.
    pub amount: Option<i64>,
    /// Currency, lower case, when readable.
    pub currency: Option<String>,
    /// Status as written.
    pub status: Option<String>,
    /// What the status says.
    pub verdict: ObjectVerdict,
    /// Creation time, seconds since 1970.
    pub created: i64,
    /// How much of it was refunded (minor units), when `refunded_pointer` reads it.
    pub refunded: Option<i64>,
}

impl LedgerObject {
    /// Refunded in full: it keeps none of the money it moved.
    pub fn fully_refunded(&self) -> bool {
        matches!((self.refunded, self.amount), (Some(r), Some(a)) if r >= a && r > 0)
    }
}

/// One claim, as far as reconciliation needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimSide {
    /// Key.
    pub key: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// State.
    pub state: ClaimState,
    /// When it was received.
    pub received: DateTime<Utc>,
    /// Amount from the payload, when readable.
    pub amount: Option<i64>,
    /// Currency from the payload, lower case, when readable.
    pub currency: Option<String>,
    /// The provider's id the claim recorded (from the call's answer or a lookup), if any.
    pub provider_id: Option<String>,
    /// Its payload was erased: its amount and currency are unknown, so the provider's object
    /// is taken at its word for them (the key, state and count are still compared).
    pub erased: bool,
}

/// How the two ledgers disagree about a key, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Two or more objects moved money for one claim: refund all but the one the claim
    /// recorded (without one, the oldest).
    Double,
    /// Completed here, nothing at the provider: money may not have moved.
    Missing,
    /// An object whose key no claim has.
    Orphan,
    /// The object's amount is not the message's.
    AmountMismatch,
    /// The object's currency is not the message's.
    CurrencyMismatch,
    /// The claim's state and the object's status disagree.
    StatusMismatch,
}

impl Kind {
    /// Every kind, worst first.
    pub const ALL: [Kind; 6] = [
        Kind::Double,
        Kind::Missing,
        Kind::Orphan,
        Kind::AmountMismatch,
        Kind::CurrencyMismatch,
        Kind::StatusMismatch,
    ];

    /// The name in output and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Double => "double",
            Kind::Missing => "missing",
            Kind::Orphan => "orphan",
            Kind::AmountMismatch => "amount_mismatch",
            Kind::CurrencyMismatch => "currency_mismatch",
            Kind::StatusMismatch => "status_mismatch",
        }
    }
}

/// One disagreement about one key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Kind, which orders the list.
    pub kind: Kind,
    /// The claim's key.
    pub key: String,
    /// Tenant (empty for an orphan).
    pub tenant: String,
    /// Message id (none for an orphan).
    pub message_id: Option<String>,
    /// The claim's state (none for an orphan).
    pub state: Option<String>,
    /// The provider's objects with this key, oldest first.
    pub object_ids: Vec<String>,
    /// The provider's statuses of those objects, in the same order.
    pub provider_statuses: Vec<String>,
    /// Objects to refund (a double's extra ones; an orphan's, when no one owns it).
    pub refund: Vec<String>,
    /// A double's object to keep: the one the claim recorded as its provider id, else the
    /// oldest.
    pub keep: Option<String>,
    /// What the claim's message asked for (completed claims; minor units).
    pub store_amount: Option<i64>,
    /// What the provider's money-moving objects add up to.
    pub provider_amount: Option<i64>,
    /// Currency (the claim's, else the objects'): `store_amount`'s.
    pub currency: String,
    /// The provider's objects' currency (the money-moving ones', else the first's), when
    /// readable: `provider_amount`'s.
    pub provider_currency: Option<String>,
    /// What this key adds to the totals' difference (provider minus store), per currency.
    pub difference: BTreeMap<String, i64>,
    /// What to do.
    pub action: String,
}

/// Totals of one tenant and currency.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bucket {
    /// Tenant (orphans: empty).
    pub tenant: String,
    /// Currency.
    pub currency: String,
    /// Completed claims counted.
    pub claims: u64,
    /// Their amount.
    pub store_amount: i64,
    /// Money-moving objects counted.
    pub objects: u64,
    /// Their amount.
    pub provider_amount: i64,
    /// `provider_amount - store_amount`.
    pub difference: i64,
    /// The keys whose findings make up the difference (at most [`MAX_ITEMS_PER_BUCKET`]).
    pub items: Vec<String>,
    /// Keys beyond those listed.
    pub more_items: u64,
}

/// Counts of what was read and compared.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Claims in the window.
    pub claims: u64,
    /// Provider objects in the window (with a key).
    pub objects: u64,
    /// Keys on both sides that agree.
    pub agreeing: u64,
    /// Keys read in the margin around the window, belonging to a neighbouring window.
    pub outside_window: u64,
    /// Provider objects without a claim key (not made by claimd; not compared).
    pub without_key: u64,
    /// Pages of the provider's list read.
    pub pages: u64,
    /// Objects the report would list for a refund (a double's extra one, an orphan) that are
    /// refunded in full (`refunded_pointer`): settled, not findings, not in the totals.
    pub refunded: u64,
}

/// The result for one consumer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConsumerLedger {
    /// Consumer.
    pub consumer: String,
    /// Counts.
    pub counts: Counts,
    /// Findings per kind (complete, even when the list is cut).
    pub by_kind: BTreeMap<String, u64>,
    /// Findings, worst first (at most [`MAX_FINDINGS`]).
    pub findings: Vec<Finding>,
    /// Findings left out of the list.
    pub findings_left_out: u64,
    /// Totals per tenant and currency.
    pub totals: Vec<Bucket>,
}

impl ConsumerLedger {
    /// Whether anything disagrees.
    pub fn disagrees(&self) -> bool {
        self.by_kind.values().any(|n| *n > 0) || self.totals.iter().any(|b| b.difference != 0)
    }
}

/// Builds a [`ConsumerLedger`] from key groups fed in any order.
#[derive(Debug)]
pub struct Matcher<'a> {
    consumer: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    commands: &'a OperatorCommands,
    out: ConsumerLedger,
    buckets: BTreeMap<(String, String), Bucket>,
}

fn currency_of(c: &Option<String>) -> String {
    c.clone().unwrap_or_else(|| "?".into())
}

impl<'a> Matcher<'a> {
    /// A matcher for `consumer` over `[from, to)`: a key belongs to the window when its
    /// claim was received in it, or, without a claim, when its first object was created in it.
    pub fn new(
        consumer: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        commands: &'a OperatorCommands,
    ) -> Self {
        Matcher {
            consumer: consumer.to_string(),
            from,
            to,
            commands,
            out: ConsumerLedger {
                consumer: consumer.to_string(),
                ..Default::default()
            },
            buckets: BTreeMap::new(),
        }
    }

    fn bucket(&mut self, tenant: &str, currency: &str) -> &mut Bucket {
        self.buckets
            .entry((tenant.to_string(), currency.to_string()))
            .or_insert_with(|| Bucket {
                tenant: tenant.to_string(),
                currency: currency.to_string(),
                ..Default::default()
            })
    }

    /// One key: its claim (if any) and its objects (any order).
    pub fn add(&mut self, claim: Option<ClaimSide>, mut objects: Vec<LedgerObject>) {
        objects.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        let anchor = match (&claim, objects.first()) {
            (Some(c), _) => c.received,
            (None, Some(o)) => DateTime::from_timestamp(o.created, 0).unwrap_or_default(),
            (None, None) => return,
        };
        if anchor < self.from || anchor >= self.to {
            self.out.counts.outside_window += 1;
            return;
        }
        if claim.is_some() {
            self.out.counts.claims += 1;
        }
        self.out.counts.objects += objects.len() as u64;
        let tenant = claim.as_ref().map(|c| c.tenant.clone()).unwrap_or_default();
        let mut moved: Vec<&LedgerObject> = objects
            .iter()
            .filter(|o| o.verdict == ObjectVerdict::Completed)
            .collect();
        // The object that carries the claim's money goes first: the one the claim recorded as
        // its provider id, whatever the creation times; without one, the oldest.
        if let Some(i) = claim
            .as_ref()
            .and_then(|c| c.provider_id.as_deref())
            .and_then(|id| moved.iter().position(|o| o.id == id))
        {
            let kept = moved.remove(i);
            moved.insert(0, kept);
        }
        // Objects to refund that are refunded in full moved no money that stayed: settled.
        let first_to_refund = usize::from(claim.is_some());
        let mut settled: Vec<&str> = Vec::new();
        let mut i = first_to_refund;
        while i < moved.len() {
            if moved[i].fully_refunded() {
                settled.push(&moved.remove(i).id);
            } else {
                i += 1;
            }
        }
        self.out.counts.refunded += settled.len() as u64;
        // The totals, from this key alone.
        let mut difference: BTreeMap<String, i64> = BTreeMap::new();
        if let Some(c) = claim.as_ref().filter(|c| c.state == ClaimState::Completed) {
            let (currency, amount) = match (c.erased, moved.first()) {
                (true, Some(o)) => (currency_of(&o.currency), o.amount.unwrap_or(0)),
                _ => (currency_of(&c.currency), c.amount.unwrap_or(0)),
            };
            let b = self.bucket(&tenant, &currency);
            b.claims += 1;
            b.store_amount += amount;
            *difference.entry(currency).or_default() -= amount;
        }
        for o in &moved {
            let currency = currency_of(&o.currency);
            let amount = o.amount.unwrap_or(0);
            let b = self.bucket(&tenant, &currency);
            b.objects += 1;
            b.provider_amount += amount;
            *difference.entry(currency).or_default() += amount;
        }
        difference.retain(|_, d| *d != 0);
        let kind = self.judge(claim.as_ref(), &objects, &moved, &settled);
        let Some(kind) = kind else {
            self.out.counts.agreeing += 1;
            return;
        };
        let key = claim
            .as_ref()
            .map(|c| c.key.clone())
            .or_else(|| objects.first().map(|o| o.key.clone()))
            .unwrap_or_default();
        for currency in difference.keys() {
            let b = self.bucket(&tenant, currency);
            if b.items.len() < MAX_ITEMS_PER_BUCKET {
                b.items.push(key.clone());
            } else {
                b.more_items += 1;
            }
        }
        *self
            .out
            .by_kind
            .entry(kind.as_str().to_string())
            .or_default() += 1;
        if self.out.findings.len() >= MAX_FINDINGS {
            self.out.findings_left_out += 1;
            return;
        }
        let refund: Vec<String> = match (kind, &claim) {
            (Kind::Double, _) => moved.iter().skip(1).map(|o| o.id.clone()).collect(),
            (Kind::Orphan, _) => moved.iter().map(|o| o.id.clone()).collect(),
            _ => Vec::new(),
        };
        let finding = Finding {
            kind,
            tenant: tenant.clone(),
            message_id: claim.as_ref().map(|c| c.message_id.clone()),
            state: claim.as_ref().map(|c| c.state.as_str().to_string()),
            object_ids: objects.iter().map(|o| o.id.clone()).collect(),
            provider_statuses: objects
                .iter()
                .map(|o| o.status.clone().unwrap_or_default())
                .collect(),
            store_amount: claim
                .as_ref()
                .filter(|c| c.state == ClaimState::Completed)
                .and_then(|c| c.amount),
            provider_amount: (!moved.is_empty())
                .then(|| moved.iter().map(|o| o.amount.unwrap_or(0)).sum()),
            currency: claim
                .as_ref()
                .and_then(|c| c.currency.clone())
                .or_else(|| objects.first().and_then(|o| o.currency.clone()))
                .unwrap_or_else(|| "?".into()),
            provider_currency: moved
                .first()
                .copied()
                .or(objects.first())
                .and_then(|o| o.currency.clone()),
            keep: (kind == Kind::Double).then(|| moved[0].id.clone()),
            action: self.action(kind, claim.as_ref(), &moved, &refund),
            refund,
            difference,
            key,
        };
        self.out.findings.push(finding);
    }

    /// The kind of disagreement, if any (the worst, when there are several).
    fn judge(
        &self,
        claim: Option<&ClaimSide>,
        objects: &[LedgerObject],
        moved: &[&LedgerObject],
        settled: &[&str],
    ) -> Option<Kind> {
        let Some(c) = claim else {
            // Objects that all failed, or were refunded in full, keep no money: nothing to
            // refund, nothing to report.
            return objects
                .iter()
                .any(|o| o.verdict != ObjectVerdict::Failed && !settled.contains(&o.id.as_str()))
                .then_some(Kind::Orphan);
        };
        if moved.len() >= 2 {
            return Some(Kind::Double);
        }
        let completed = c.state == ClaimState::Completed;
        match (completed, moved.first()) {
            (true, None) if objects.is_empty() => Some(Kind::Missing),
            (true, None) | (false, Some(_)) => Some(Kind::StatusMismatch),
            // An erased claim's amount and currency are gone: nothing to compare them with.
            (true, Some(_)) if c.erased => None,
            (true, Some(o)) => {
                if o.currency != c.currency {
                    Some(Kind::CurrencyMismatch)
                } else if o.amount != c.amount {
                    Some(Kind::AmountMismatch)
                } else {
                    None
                }
            }
            (false, None) => None,
        }
    }

    fn action(
        &self,
        kind: Kind,
        claim: Option<&ClaimSide>,
        moved: &[&LedgerObject],
        refund: &[String],
    ) -> String {
        let show = claim.map(|c| {
            self.commands.show(ClaimRef {
                consumer: &self.consumer,
                tenant: &c.tenant,
                message_id: &c.message_id,
            })
        });
        let show = show.unwrap_or_default();
        match kind {
            Kind::Double => format!(
                "refund {} at the provider (keep {}, {}); then find why one key was charged twice (a changed key template, a second sender, a provider ignoring keys)",
                refund.join(", "),
                moved.first().map(|o| o.id.as_str()).unwrap_or("the first"),
                match (claim.and_then(|c| c.provider_id.as_deref()), moved.first()) {
                    (Some(id), Some(o)) if o.id == id => "the one the claim recorded",
                    _ => "the oldest",
                }
            ),
            Kind::Missing => format!(
                "money may not have moved: search the provider for this key; if it never happened, charge again by hand or correct the claim ({show})"
            ),
            Kind::Orphan => format!(
                "no claim has this key: find where it came from (a claim pruned too early, a restored backup, a test sent to live); refund {} if no one owns it",
                if refund.is_empty() {
                    "nothing (no object moved money)".to_string()
                } else {
                    refund.join(", ")
                }
            ),
            Kind::AmountMismatch | Kind::CurrencyMismatch => format!(
                "the provider's object differs from the message: refund the excess or collect the rest, and check the body template's amount and currency ({show})"
            ),
            Kind::StatusMismatch => match claim {
                Some(c) if c.state != ClaimState::Completed => self.commands.resolve(
                    ClaimRef {
                        consumer: &self.consumer,
                        tenant: &c.tenant,
                        message_id: &c.message_id,
                    },
                    ClaimState::Completed,
                    Note::Text("the provider's ledger has the payment (reconcile --ledger)"),
                ),
                _ => format!(
                    "completed here, but the provider's object did not complete: check it at the provider, then correct the claim ({show})"
                ),
            },
        }
    }

    /// The result: findings worst first (then by the size of their difference), totals by
    /// tenant and currency.
    pub fn finish(mut self) -> ConsumerLedger {
        for b in self.buckets.values_mut() {
            b.difference = b.provider_amount - b.store_amount;
        }
        self.out.totals = self.buckets.into_values().collect();
        self.out.findings.sort_by(|a, b| {
            let size = |f: &Finding| f.difference.values().map(|d| d.unsigned_abs()).sum::<u64>();
            (a.kind, std::cmp::Reverse(size(a)), &a.key).cmp(&(
                b.kind,
                std::cmp::Reverse(size(b)),
                &b.key,
            ))
        });
        self.out
    }
}

/// Merges claims and objects, each sorted by key, into key groups for `matcher`. The
/// streaming reader does the same page by page.
pub fn merge_sorted(
    matcher: &mut Matcher<'_>,
    claims: impl IntoIterator<Item = ClaimSide>,
    objects: impl IntoIterator<Item = LedgerObject>,
) {
    let mut claims = claims.into_iter().peekable();
    let mut objects = objects.into_iter().peekable();
    loop {
        let key = match (claims.peek(), objects.peek()) {
            (Some(c), Some(o)) => c.key.clone().min(o.key.clone()),
            (Some(c), None) => c.key.clone(),
            (None, Some(o)) => o.key.clone(),
            (None, None) => return,
        };
        let claim = claims.next_if(|c| c.key == key);
        // A second claim with the same key (a key template without the message id) is a
        // group of its own: its objects were all matched to the first.
        while claims.next_if(|c| c.key == key).is_some() {}
        let mut group = Vec::new();
        while let Some(o) = objects.next_if(|o| o.key == key) {
            group.push(o);
        }
        matcher.add(claim, group);
    }
}

#[cfg(test)]
mod tests;
