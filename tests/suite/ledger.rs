//! `claimd reconcile --ledger` against a real third-party Stripe imitation: localstripe
//! (PyPI, pinned 1.15.10; `.ci/run` installs it and sets `LOCALSTRIPE`), whose
//! `GET /v1/payment_intents` pages with `limit`, `starting_after` and `has_more`.
//!
//! The store holds completed claims and localstripe the PaymentIntents of the Stripe example
//! (`config/examples/stripe.toml`), a few hundred that agree, over several pages, plus one of
//! each disagreement arranged through localstripe's own API: a double (a second PaymentIntent
//! with the same `claimd_key`), an orphan (a key no claim has), a missing one (a completed
//! claim without a PaymentIntent) and an amount mismatch. The report finds exactly those, the
//! totals' difference is their sum, the exit code is 3; with them removed it is 0.
//!
//! Under CI=true a missing localstripe or PostgreSQL is a failure; elsewhere the test says
//! why it skips.

use crate::common;

use claimd::domain::claim::{ClaimState, NewClaim};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::localstripe::*;
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const CONSUMER: &str = "stripe-payments";
/// PaymentIntents that agree with their claims.
const AGREEING: usize = 300;
/// Objects per page of the list (several pages).
const PAGE: usize = 50;

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/stripe.toml")
}

/// The Stripe example pointed at localstripe and the test's store. localstripe's list takes
/// no `created` filter (Stripe's does): claimd skips objects outside the window itself.
pub(crate) fn env(store_url: &str, api: &str) -> Vec<(String, String)> {
    [
        ("STRIPE_API", api.to_string()),
        ("STRIPE_SECRET_KEY", SECRET.to_string()),
        (
            "STRIPE_WEBHOOK_SECRET",
            "whsec_claimd_ledger_test".to_string(),
        ),
        ("CLAIMD_STORE_URL", store_url.to_string()),
        (
            "CLAIMD__CONSUMERS__0__EFFECT__LEDGER__URL",
            format!("{api}/v1/payment_intents?limit={PAGE}"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(crate) fn claimd(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let example = example_path();
    let mut full = vec!["--config", example.to_str().unwrap()];
    full.extend_from_slice(args);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cli_with_env(&full, &env)
}

/// The key the example's template gives a message without a tenant.
pub(crate) fn key(message_id: &str) -> String {
    format!("{CONSUMER}::{message_id}")
}

/// A claim that completed, for a message asking `amount` cents in EUR.
pub(crate) async fn completed_claim(store: &Store, message_id: &str, amount: i64) {
    completed_claim_with(store, message_id, amount, None).await
}

/// [`completed_claim`], its provider id recorded as `provider_id`.
async fn completed_claim_with(
    store: &Store,
    message_id: &str,
    amount: i64,
    provider_id: Option<&str>,
) {
    let payload = json!({"amount": amount, "currency": "eur", "order": message_id,
                         "payment_method": "pm_card_visa"})
    .to_string();
    let new = NewClaim {
        consumer: CONSUMER.into(),
        tenant: String::new(),
        message_id: message_id.into(),
        idem_key: key(message_id),
        fingerprint: claimd::domain::claim::fingerprint(payload.as_bytes()),
        payload: bytes::Bytes::from(payload),
        content_type: "application/json".into(),
        worker: "test".into(),
        lease: Duration::from_secs(60),
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    };
    let ClaimOutcome::Created(c) = store.claim(&new).await.unwrap() else {
        panic!("new claim {message_id}")
    };
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        provider_id: provider_id.map(str::to_string),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "test",
        action: "call",
        outcome: "applied",
        provider_status: Some(200),
        detail: None,
    };
    assert!(store.settle(c.id, 1, &done, &ev).await.unwrap());
}

/// A confirmed PaymentIntent with `claimd_key` = `key` in its metadata; returns its id.
pub(crate) async fn payment_intent(ls: &LocalStripe, pm: &str, key: &str, amount: i64) -> String {
    payment_intent_in(ls, pm, key, amount, "eur").await
}

/// [`payment_intent`] in `currency`.
async fn payment_intent_in(
    ls: &LocalStripe,
    pm: &str,
    key: &str,
    amount: i64,
    currency: &str,
) -> String {
    let form = [
        ("amount", amount.to_string()),
        ("currency", currency.into()),
        ("payment_method", pm.into()),
        ("confirm", "true".into()),
        ("metadata[claimd_key]", key.into()),
    ];
    let pi: Value = client()
        .post(format!("{}/v1/payment_intents", ls.url))
        .bearer_auth(SECRET)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(pi["status"], "succeeded", "{pi}");
    pi["id"].as_str().unwrap().to_string()
}

async fn delete_payment_intent(ls: &LocalStripe, id: &str) {
    let r = client()
        .delete(format!("{}/v1/payment_intents/{id}", ls.url))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "delete {id}: {}", r.status());
}

/// The findings of the JSON output as (kind, key).
fn findings(run: &Value) -> BTreeSet<(String, String)> {
    run["consumers"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn totals_difference(run: &Value) -> i64 {
    run["consumers"][0]["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["difference"].as_i64().unwrap())
        .sum()
}

async fn reconciles_against_localstripe(store_kind: TestStore) {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let url = store_kind.url();
    let env = env(&url, &ls.url);
    let (code, _, err) = claimd(&["migrate"], &env);
    assert_eq!(code, 0, "migrate: {err}");
    let store = claimd::store::open(&url, 4).await.unwrap();
    let pm = ls.payment_method(CARD_OK).await;

    for i in 0..AGREEING {
        let id = format!("order-{i}");
        completed_claim(&store, &id, 1000 + i as i64).await;
        payment_intent(&ls, &pm, &key(&id), 1000 + i as i64).await;
    }
    // A double: two PaymentIntents for one claim.
    completed_claim(&store, "double", 5000).await;
    let double_first = payment_intent(&ls, &pm, &key("double"), 5000).await;
    let double_second = payment_intent(&ls, &pm, &key("double"), 5000).await;
    // An orphan: a PaymentIntent whose key no claim has.
    let orphan = payment_intent(&ls, &pm, &key("ghost"), 777).await;
    // Missing: a completed claim whose PaymentIntent was never created.
    completed_claim(&store, "missing", 1234).await;
    // An amount mismatch: the message asked 2000, the PaymentIntent took 2500.
    completed_claim(&store, "amount", 2000).await;
    let wrong_amount = payment_intent(&ls, &pm, &key("amount"), 2500).await;

    let (code, out, err) = claimd(
        &["reconcile", "--ledger", "--since", "1h", "--format", "json"],
        &env,
    );
    assert_eq!(code, 3, "the ledgers disagree: {err}\n{out}");
    let run: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let expected: BTreeSet<(String, String)> = [
        ("double", key("double")),
        ("missing", key("missing")),
        ("orphan", key("ghost")),
        ("amount_mismatch", key("amount")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(findings(&run), expected, "{out}");
    let consumer = &run["consumers"][0];
    assert_eq!(consumer["counts"]["agreeing"], AGREEING as u64);
    assert!(
        consumer["counts"]["pages"].as_u64().unwrap() >= (AGREEING / PAGE) as u64,
        "read over several pages: {}",
        consumer["counts"]
    );
    let double = consumer["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "double")
        .unwrap();
    // One of the two to refund (the younger; created in the same second, ties go by id),
    // the other kept.
    let ids: BTreeSet<&str> = double["object_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        BTreeSet::from([double_first.as_str(), double_second.as_str()])
    );
    let refund = double["refund"].as_array().unwrap();
    assert_eq!(refund.len(), 1, "{double}");
    let refund = refund[0].as_str().unwrap().to_string();
    assert!(ids.contains(refund.as_str()));
    assert!(double["action"].as_str().unwrap().contains(&refund));
    // Worst first.
    assert_eq!(consumer["findings"][0]["kind"], "double");
    // The totals' difference is exactly the arranged items' sum.
    let arranged = 5000 + 777 - 1234 + (2500 - 2000);
    assert_eq!(totals_difference(&run), arranged, "{}", consumer["totals"]);
    let by_findings: i64 = consumer["findings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["difference"].as_object().unwrap().values())
        .map(|d| d.as_i64().unwrap())
        .sum();
    assert_eq!(by_findings, arranged);
    let made_up_of: BTreeSet<String> = consumer["totals"][0]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        made_up_of,
        expected.iter().map(|(_, k)| k.clone()).collect(),
        "the items that make up the difference"
    );

    // The table says the same, and the last run is in the report.
    let (code, table, _) = claimd(&["reconcile", "--ledger", "--since", "1h"], &env);
    assert_eq!(code, 3);
    assert!(table.contains("the ledgers disagree"), "{table}");
    assert!(table.contains(&format!("refund {refund}")), "{table}");
    let (code, report, err) = claimd(&["report", "--format", "json"], &env);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&report).unwrap();
    let ledger = &report["ledger"][0];
    assert_eq!(ledger["consumer"], CONSUMER);
    for kind in ["double", "missing", "orphan", "amount_mismatch"] {
        assert_eq!(ledger["mismatches"][kind], 1, "{kind}: {ledger}");
    }
    assert_eq!(ledger["mismatches"]["status_mismatch"], 0);
    assert_eq!(ledger["differences"][0]["difference"], arranged);

    // The arranged differences removed (the double's as the report says), the ledgers match.
    delete_payment_intent(&ls, &refund).await;
    delete_payment_intent(&ls, &orphan).await;
    payment_intent(&ls, &pm, &key("missing"), 1234).await;
    delete_payment_intent(&ls, &wrong_amount).await;
    payment_intent(&ls, &pm, &key("amount"), 2000).await;
    let (code, out, err) = claimd(
        &["reconcile", "--ledger", "--since", "1h", "--format", "json"],
        &env,
    );
    assert_eq!(code, 0, "the ledgers match: {err}\n{out}");
    let run: Value = serde_json::from_str(&out).unwrap();
    assert!(findings(&run).is_empty(), "{out}");
    assert_eq!(totals_difference(&run), 0);
    assert_eq!(
        run["consumers"][0]["counts"]["agreeing"],
        AGREEING as u64 + 3
    );
    let (_, report, _) = claimd(&["report", "--format", "json"], &env);
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["ledger"][0]["mismatches"]["double"], 0);
    let (_, table, _) = claimd(&["report"], &env);
    assert!(
        table.contains("ledger (last `claimd reconcile --ledger`)"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_report_finds_exactly_the_arranged_differences_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    reconciles_against_localstripe(db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_report_finds_exactly_the_arranged_differences_on_sqlite() {
    reconciles_against_localstripe(TestStore::sqlite()).await;
}

#[test]
fn a_consumer_without_a_ledger_description_or_a_bad_one_is_refused_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let env: Vec<(String, String)> = env(&store, "http://127.0.0.1:9")
        .into_iter()
        .map(|(k, v)| {
            if k.ends_with("LEDGER__URL") {
                (k, "ftp://nowhere".into())
            } else {
                (k, v)
            }
        })
        .collect();
    let (code, _, err) = claimd(&["reconcile", "--ledger"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("effect.ledger.url"), "{err}");
    let (code, _, err) = claimd(
        &[
            "reconcile",
            "--ledger",
            "--from",
            "2026-01-02T00:00:00Z",
            "--to",
            "2026-01-01T00:00:00Z",
        ],
        &self::env(&store, "http://127.0.0.1:9"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from must be before --to"), "{err}");
}

/// Refunds a PaymentIntent in full through localstripe's own API.
async fn refund(ls: &LocalStripe, id: &str) {
    let r = client()
        .post(format!("{}/v1/refunds", ls.url))
        .bearer_auth(SECRET)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string([("payment_intent", id)]).unwrap())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "refund {id}: {}", r.status());
}

/// The findings say what is true: a currency mismatch names the object's currency; of a
/// double, the object the claim recorded is kept whatever the creation times; a double whose
/// extra object was refunded in full is settled; the CSV carries the totals.
async fn findings_tell_the_truth(store_kind: TestStore) {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let url = store_kind.url();
    let env = env(&url, &ls.url);
    let (code, _, err) = claimd(&["migrate"], &env);
    assert_eq!(code, 0, "migrate: {err}");
    let store = claimd::store::open(&url, 4).await.unwrap();
    let pm = ls.payment_method(CARD_OK).await;

    completed_claim(&store, "paid", 1000).await;
    payment_intent(&ls, &pm, &key("paid"), 1000).await;
    // The message asked 146 EUR; the PaymentIntent took 146 USD.
    completed_claim(&store, "currency", 146).await;
    payment_intent_in(&ls, &pm, &key("currency"), 146, "usd").await;
    // A double whose claim recorded the younger PaymentIntent (or, created in the same
    // second, the one that sorts last by id): that one is the claim's, the other is refunded.
    let first = payment_intent(&ls, &pm, &key("double"), 300).await;
    let second = payment_intent(&ls, &pm, &key("double"), 300).await;
    let created = |pi: Value| (pi["created"].as_i64().unwrap(), pi["id"].to_string());
    let (recorded, extra) =
        if created(ls.payment_intent(&first).await) > created(ls.payment_intent(&second).await) {
            (first, second)
        } else {
            (second, first)
        };
    completed_claim_with(&store, "double", 300, Some(&recorded)).await;
    // A double already refunded: settled.
    let kept = payment_intent(&ls, &pm, &key("refunded"), 400).await;
    let refunded = payment_intent(&ls, &pm, &key("refunded"), 400).await;
    completed_claim_with(&store, "refunded", 400, Some(&kept)).await;
    refund(&ls, &refunded).await;

    let (code, out, err) = claimd(
        &["reconcile", "--ledger", "--since", "1h", "--format", "json"],
        &env,
    );
    assert_eq!(code, 3, "the ledgers disagree: {err}\n{out}");
    let run: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let expected: BTreeSet<(String, String)> = [
        ("currency_mismatch".to_string(), key("currency")),
        ("double".to_string(), key("double")),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        findings(&run),
        expected,
        "the refunded double is settled: {out}"
    );
    let consumer = &run["consumers"][0];
    assert_eq!(consumer["counts"]["refunded"], 1, "{}", consumer["counts"]);
    assert_eq!(consumer["counts"]["agreeing"], 2, "paid and refunded agree");
    let finding = |kind: &str| {
        consumer["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == kind)
            .unwrap()
            .clone()
    };
    let double = finding("double");
    assert_eq!(double["keep"], json!(recorded), "{double}");
    assert_eq!(double["refund"], json!([extra]), "{double}");
    let currency = finding("currency_mismatch");
    assert_eq!(currency["currency"], "eur", "{currency}");
    assert_eq!(currency["provider_currency"], "usd", "{currency}");

    let (code, table, _) = claimd(&["reconcile", "--ledger", "--since", "1h"], &env);
    assert_eq!(code, 3);
    let row = table
        .lines()
        .find(|l| l.contains("currency_mismatch") && l.contains(&key("currency")))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("146 eur") && row.contains("146 usd"),
        "each side in its own currency: {row}"
    );
    assert!(
        table.contains(&format!("refund {extra} "))
            && !table.contains(&format!("refund {recorded}")),
        "{table}"
    );

    // The CSV: the findings, then the totals per consumer, tenant and currency.
    let (code, csv, _) = claimd(
        &["reconcile", "--ledger", "--since", "1h", "--format", "csv"],
        &env,
    );
    assert_eq!(code, 3);
    let (findings_csv, totals_csv) = csv
        .split_once("\n\n")
        .unwrap_or_else(|| panic!("two tables: {csv}"));
    assert!(findings_csv.starts_with("consumer,kind,key,"), "{csv}");
    let mut totals = totals_csv.lines();
    assert_eq!(
        totals.next(),
        Some(
            "consumer,tenant,currency,claims,store_amount,objects,provider_amount,difference,made_up_of"
        ),
        "{csv}"
    );
    let usd = totals
        .find(|l| l.contains(",usd,"))
        .unwrap_or_else(|| panic!("a usd bucket: {csv}"));
    assert!(
        usd.starts_with(&format!("{CONSUMER},,usd,0,0,1,146,146,")),
        "{usd}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ledger_findings_tell_the_truth_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    findings_tell_the_truth(db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ledger_findings_tell_the_truth_on_sqlite() {
    findings_tell_the_truth(TestStore::sqlite()).await;
}
