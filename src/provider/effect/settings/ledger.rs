//! `[consumers.effect.ledger]`: how the provider's own list of objects is read for
//! `claimd reconcile --ledger` (the list endpoint, its pagination, and where each object keeps
//! the claim's key, its id, amount, currency, creation time and status).

use super::check_pointer;
use crate::domain::duration::Dur;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The provider's list endpoint and the shape of its objects.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LedgerConfig {
    /// The first page's URL, e.g.
    /// `https://api.stripe.com/v1/payment_intents?limit=100&created[gte]={from_unix}&created[lt]={to_unix}`.
    /// May name `{from_unix}`, `{to_unix}` (seconds) and `{from}`, `{to}` (RFC 3339): the
    /// window to read, margin included. Objects outside it are skipped whatever the provider
    /// returns, so a provider without a time filter works too (it is only slower).
    pub url: String,
    /// The array of objects in a page (like `/data`).
    pub items_pointer: String,
    /// The next page's cursor in a page (like `/data/-1/id`: `-1` is the last element).
    pub cursor_pointer: String,
    /// The query parameter the cursor goes into (like `starting_after`).
    pub cursor_param: String,
    /// A boolean in a page saying whether another page follows (like `/has_more`). Empty: a
    /// page without objects is the last.
    pub has_more_pointer: String,
    /// The claim's key in an object (like `/metadata/claimd_key`). Objects without it were
    /// not made by claimd and are only counted.
    pub key_pointer: String,
    /// The object's id (like `/id`).
    pub id_pointer: String,
    /// The object's amount, an integer in minor units (like `/amount`).
    pub amount_pointer: String,
    /// The object's currency (like `/currency`); compared without regard to case.
    pub currency_pointer: String,
    /// The object's creation time: seconds since 1970 or RFC 3339 (like `/created`).
    pub created_pointer: String,
    /// The object's status. Empty: `[consumers.effect.outcome] pointer` when there is one,
    /// whose lists decide which objects moved money; without an outcome table every object
    /// counts as completed.
    pub status_pointer: String,
    /// How much of the object was refunded (like `/latest_charge/amount_refunded` with
    /// Stripe's `expand[]=data.latest_charge`): an integer in minor units, or a boolean
    /// (`true`: all of it). An object the report would have you refund (a double's extra one,
    /// an orphan) that is refunded in full is settled: counted, not a finding, not in the
    /// totals. Empty: refunds are not read.
    pub refunded_pointer: String,
    /// The amount in a claim's payload (like `/amount`).
    pub payload_amount_pointer: String,
    /// The currency in a claim's payload (like `/currency`).
    pub payload_currency_pointer: String,
    /// How far beyond the window both sides are read, for clock skew and objects created a
    /// little after their claim (default 1h).
    pub margin: Dur,
    /// Most pages read in one run (a guard against a cursor that never ends; default 100000).
    pub max_pages: u32,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            url: String::new(),
            items_pointer: "/data".into(),
            cursor_pointer: "/data/-1/id".into(),
            cursor_param: "starting_after".into(),
            has_more_pointer: "/has_more".into(),
            key_pointer: "/metadata/claimd_key".into(),
            id_pointer: "/id".into(),
            amount_pointer: "/amount".into(),
            currency_pointer: "/currency".into(),
            created_pointer: "/created".into(),
            status_pointer: String::new(),
            refunded_pointer: String::new(),
            payload_amount_pointer: "/amount".into(),
            payload_currency_pointer: "/currency".into(),
            margin: Dur(Duration::from_secs(3600)),
            max_pages: 100_000,
        }
    }
}

impl LedgerConfig {
    /// Checks the description; the error names the key under `effect.`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err((
                "ledger.url",
                format!(
                    "{:?} is not an http(s) URL: write the provider's list endpoint",
                    self.url
                ),
            ));
        }
        for (key, p) in [
            ("ledger.items_pointer", &self.items_pointer),
            ("ledger.cursor_pointer", &self.cursor_pointer),
            ("ledger.has_more_pointer", &self.has_more_pointer),
            ("ledger.key_pointer", &self.key_pointer),
            ("ledger.id_pointer", &self.id_pointer),
            ("ledger.amount_pointer", &self.amount_pointer),
            ("ledger.currency_pointer", &self.currency_pointer),
            ("ledger.created_pointer", &self.created_pointer),
            ("ledger.status_pointer", &self.status_pointer),
            ("ledger.refunded_pointer", &self.refunded_pointer),
            (
                "ledger.payload_amount_pointer",
                &self.payload_amount_pointer,
            ),
            (
                "ledger.payload_currency_pointer",
                &self.payload_currency_pointer,
            ),
        ] {
            check_pointer(p).map_err(|e| (key, e))?;
        }
        for (key, p) in [
            ("ledger.key_pointer", &self.key_pointer),
            ("ledger.id_pointer", &self.id_pointer),
            ("ledger.amount_pointer", &self.amount_pointer),
            (
                "ledger.payload_amount_pointer",
                &self.payload_amount_pointer,
            ),
        ] {
            if p.is_empty() {
                return Err((
                    key,
                    "must name a value (a JSON pointer like \"/id\")".into(),
                ));
            }
        }
        if !self.cursor_pointer.is_empty() && self.cursor_param.trim().is_empty() {
            return Err((
                "ledger.cursor_param",
                "is empty, but cursor_pointer names a cursor: write the query parameter it goes into (like \"starting_after\")".into(),
            ));
        }
        if self.max_pages == 0 {
            return Err(("ledger.max_pages", "must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_is_checked_and_the_error_names_the_key() {
        let ok = LedgerConfig {
            url: "https://api.stripe.com/v1/payment_intents?limit=100".into(),
            ..Default::default()
        };
        assert!(ok.check().is_ok());
        assert_eq!(LedgerConfig::default().check().unwrap_err().0, "ledger.url");
        let mut bad = ok.clone();
        bad.key_pointer = "metadata/claimd_key".into();
        assert_eq!(bad.check().unwrap_err().0, "ledger.key_pointer");
        let mut no_param = ok.clone();
        no_param.cursor_param = String::new();
        assert_eq!(no_param.check().unwrap_err().0, "ledger.cursor_param");
        let mut no_amount = ok;
        no_amount.amount_pointer = String::new();
        assert_eq!(no_amount.check().unwrap_err().0, "ledger.amount_pointer");
    }
}
