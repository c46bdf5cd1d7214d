//! Erasure and redaction as an operator and a producer see them, on SQLite and PostgreSQL:
//! `claimd claims erase` of one message blanks its payload, answer and error in the row while
//! a redelivery is still a duplicate, a changed payload still a `422` and a redrive is
//! refused; `--tenant` erases only that tenant's finished claims and lists its open ones;
//! payload retention erases after its window; the page and `claims show` mask sensitive
//! values unless `--reveal`.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::*;
use std::time::Duration;

const CARD: &str = "4242424242424242";
const EMAIL: &str = "ann@example.test";
const NAME: &str = "Ann Example";

fn payload() -> String {
    format!(
        r#"{{"amount":1250,"currency":"eur","card":{{"number":"{CARD}"}},"customer":{{"name":"{NAME}","email":"{EMAIL}"}}}}"#
    )
}

fn write_config(dir: &std::path::Path, toml: &str) -> String {
    let path = dir.join("c.toml");
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

/// The row as the database holds it: payload, provider response, last error, erased.
async fn row(ts: &TestStore, message_id: &str) -> (Vec<u8>, Option<String>, Option<String>, bool) {
    const SQL: &str = "SELECT payload, provider_response, last_error, \
        erased_utc IS NOT NULL AS erased FROM claims WHERE message_id = ";
    match ts {
        TestStore::Sqlite(_) => {
            let pool = sqlx::SqlitePool::connect(&ts.url()).await.unwrap();
            let r = sqlx::query_as(sqlx::AssertSqlSafe(format!("{SQL}?1")))
                .bind(message_id)
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            r
        }
        TestStore::Pg(db) => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            let r = sqlx::query_as(sqlx::AssertSqlSafe(format!("{SQL}$1")))
                .bind(message_id)
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            r
        }
    }
}

async fn post(base: &str, key: &str, tenant: &str, body: &str) -> u16 {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Tenant-Id", tenant)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A claim of `payments` for `tenant`, settled as `to` (left `started`, held for ten
/// minutes, for `Started`) with `error` as its reason and `answer` as the provider's answer.
async fn settled_claim(
    store: &Store,
    tenant: &str,
    id: &str,
    to: ClaimState,
    answer: Option<&str>,
    error: Option<&str>,
) -> i64 {
    let mut n = orphan_claim("payments", tenant, id, &format!("payments:{tenant}:{id}"));
    n.payload = payload().into_bytes().into();
    n.fingerprint = claimd::domain::claim::fingerprint(&n.payload);
    n.lease = Duration::from_secs(600);
    let ClaimOutcome::Created(c) = store.claim(&n).await.unwrap() else {
        panic!("new claim {id}")
    };
    if to != ClaimState::Started {
        let s = Settlement {
            state: Some(to),
            provider_status: answer.map(|_| 402),
            provider_response: answer.map(str::to_string),
            error: error.map(str::to_string),
            ..Default::default()
        };
        let ev = NewEvent {
            actor: "test",
            action: "perform",
            outcome: to.as_str(),
            provider_status: None,
            detail: error,
        };
        assert!(store.settle(c.id, 1, &s, &ev).await.unwrap());
    }
    c.id
}

fn leaks(text: &str) -> Vec<&'static str> {
    [CARD, EMAIL, NAME]
        .into_iter()
        .filter(|s| text.contains(s))
        .collect()
}

async fn erasing_one_message(ts: TestStore) {
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let consumer = consumer_toml(
        "payments",
        &provider,
        "sensitive_fields = [\"/customer/name\"]",
    );
    let toml = config_toml(&ts.url(), &consumer);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &toml);
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let store = running.app().store.clone();

    assert_eq!(post(&base, "pay-1", "acme", &payload()).await, 202);
    assert!(
        eventually(Duration::from_secs(20), || async {
            store
                .get("payments", "acme", "pay-1")
                .await
                .unwrap()
                .unwrap()
                .state
                == ClaimState::Completed
        })
        .await,
        "the payment completes"
    );

    // Masked on the page and in `claims show`, shown with --reveal.
    let page = get_text(&format!("{base}/claims/payments/pay-1?tenant=acme")).await;
    assert!(page.contains("••••4242"), "{page}");
    assert!(leaks(&page).is_empty(), "the page shows {:?}", leaks(&page));
    let show = [
        "claims", "show", "payments", "pay-1", "--tenant", "acme", "--config", &cfg,
    ];
    let (code, out, err) = cli(&show);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("••••4242") && out.contains("[redacted]"),
        "{out}"
    );
    assert!(
        leaks(&out).is_empty(),
        "claims show shows {:?}",
        leaks(&out)
    );
    let (code, out, _) = cli(&[&show[..], &["--reveal"]].concat());
    assert_eq!(code, 0);
    assert_eq!(
        leaks(&out).len(),
        3,
        "--reveal shows the payload as stored: {out}"
    );
    let api = get_json(&format!("{base}/v1/claims/payments/pay-1?tenant=acme")).await;
    assert!(leaks(&api.to_string()).is_empty(), "{api}");

    // A dry run lists it and changes nothing.
    let erase = [
        "claims",
        "erase",
        "--consumer",
        "payments",
        "--message",
        "pay-1",
        "--tenant",
        "acme",
        "--note",
        "request DSR-7",
        "--config",
        &cfg,
    ];
    let (code, out, err) = cli(&[&erase[..], &["--dry-run"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("pay-1") && out.contains("would erase"),
        "{out}"
    );
    assert_eq!(row(&ts, "pay-1").await.0, payload().into_bytes());

    let (code, out, err) = cli(&erase);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("erased") && out.contains("by operator:test"),
        "{out}"
    );
    let (bytes, answer, error, erased) = row(&ts, "pay-1").await;
    assert!(bytes.is_empty(), "the payload is gone from the row");
    assert_eq!((answer, error, erased), (None, None, true));
    let claim = store
        .get("payments", "acme", "pay-1")
        .await
        .unwrap()
        .unwrap();
    let history = store.events(claim.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (
            last.action.as_str(),
            last.actor.as_str(),
            last.detail.as_deref()
        ),
        ("erase", "operator:test", Some("request DSR-7")),
        "{:?}",
        lines(&history)
    );
    let (code, out, _) = cli(&erase);
    assert_eq!(code, 0);
    assert!(
        out.contains("already erased"),
        "erasing again changes nothing: {out}"
    );

    // Still a duplicate; still a mismatch for another payload: never paid twice.
    assert_eq!(post(&base, "pay-1", "acme", &payload()).await, 200);
    let other = payload().replace("1250", "9999");
    assert_eq!(post(&base, "pay-1", "acme", &other).await, 422);
    let (code, out, _) = cli(&show);
    assert_eq!(code, 0);
    assert!(out.contains("(erased "), "{out}");

    // An erased failed claim is never sent again: redrive refused, by the CLI and over HTTP.
    settled_claim(
        &store,
        "acme",
        "pay-2",
        ClaimState::Failed,
        None,
        Some("declined"),
    )
    .await;
    let erase2 = [
        "claims",
        "erase",
        "--consumer",
        "payments",
        "--message",
        "pay-2",
        "--tenant",
        "acme",
        "--config",
        &cfg,
    ];
    assert_eq!(cli(&erase2).0, 0);
    let (code, _, err) = cli(&[
        "claims", "redrive", "payments", "pay-2", "--tenant", "acme", "--config", &cfg,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("erased") && err.contains("never be sent again"),
        "{err}"
    );
    let r = client()
        .post(format!("{base}/v1/claims/payments/pay-2/redrive"))
        .json(&serde_json::json!({"tenant": "acme", "actor": "ops"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let c = store
        .get("payments", "acme", "pay-2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.state, ClaimState::Failed, "left as it was");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_one_message_keeps_it_a_duplicate_sqlite() {
    erasing_one_message(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_one_message_keeps_it_a_duplicate_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    erasing_one_message(ts).await;
}

async fn erasing_a_tenant(ts: TestStore) {
    let toml = config_toml(
        &ts.url(),
        &consumer_toml("payments", "http://127.0.0.1:1", ""),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &toml);
    let store = claimd::store::open(&ts.url(), 2).await.unwrap();
    store.migrate().await.unwrap();
    let answer = format!("card {CARD} declined");
    settled_claim(
        &store,
        "acme",
        "done-1",
        ClaimState::Completed,
        Some("{}"),
        None,
    )
    .await;
    settled_claim(
        &store,
        "acme",
        "failed-1",
        ClaimState::Failed,
        Some(&answer),
        Some("402"),
    )
    .await;
    settled_claim(&store, "acme", "open-1", ClaimState::Started, None, None).await;
    let parked = ClaimState::NeedsAttention;
    settled_claim(
        &store,
        "acme",
        "parked-1",
        parked,
        None,
        Some("unknown outcome"),
    )
    .await;
    settled_claim(
        &store,
        "globex",
        "done-2",
        ClaimState::Completed,
        Some("{}"),
        None,
    )
    .await;

    let (code, out, err) = cli(&[
        "claims",
        "erase",
        "--tenant",
        "acme",
        "--dry-run",
        "--config",
        &cfg,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would be erased"), "{out}");
    assert!(!row(&ts, "done-1").await.3, "a dry run erases nothing");

    let (code, out, err) = cli(&[
        "claims", "erase", "--tenant", "acme", "--format", "json", "--config", &cfg,
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let verdicts: Vec<(String, String)> = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["message_id"].as_str().unwrap().to_string(),
                l["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut verdicts = verdicts;
    verdicts.sort();
    assert_eq!(
        verdicts,
        [
            ("done-1".to_string(), "erased".to_string()),
            ("failed-1".into(), "erased".into()),
            ("open-1".into(), "open".into()),
            ("parked-1".into(), "open".into()),
        ],
        "{out}"
    );
    let parked_why = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["message_id"] == "parked-1")
        .unwrap()["why"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(parked_why.contains("resolve it"), "{parked_why}");
    for id in ["done-1", "failed-1"] {
        let (bytes, answer, error, erased) = row(&ts, id).await;
        assert!(
            bytes.is_empty() && answer.is_none() && error.is_none() && erased,
            "{id}"
        );
    }
    for id in ["open-1", "parked-1", "done-2"] {
        let (bytes, _, _, erased) = row(&ts, id).await;
        assert_eq!(
            (bytes, erased),
            (payload().into_bytes(), false),
            "{id} kept"
        );
    }
    // The table form says what to do about the open ones.
    let (code, out, _) = cli(&["claims", "erase", "--tenant", "acme", "--config", &cfg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("not erased") && out.contains("2 open"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_a_tenant_erases_only_its_finished_claims_sqlite() {
    erasing_a_tenant(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_a_tenant_erases_only_its_finished_claims_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    erasing_a_tenant(ts).await;
}

async fn payload_retention(ts: TestStore) {
    let consumer = consumer_toml(
        "payments",
        "http://127.0.0.1:1",
        "payload_retention = \"1s\"",
    );
    let toml = config_toml(&ts.url(), &consumer);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &toml);
    let store = claimd::store::open(&ts.url(), 2).await.unwrap();
    store.migrate().await.unwrap();
    let done = settled_claim(&store, "", "old-1", ClaimState::Completed, Some("{}"), None).await;
    settled_claim(&store, "", "open-1", ClaimState::Started, None, None).await;
    let parked = ClaimState::NeedsAttention;
    settled_claim(
        &store,
        "",
        "parked-1",
        parked,
        None,
        Some("unknown outcome"),
    )
    .await;
    // Past the window (the database's clock decides).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, out, err) = cli(&["prune", "--dry-run", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("would erase the payloads of 1 finished claims"),
        "{out}"
    );
    assert!(!row(&ts, "old-1").await.3, "a dry run erases nothing");
    let (code, out, err) = cli(&["prune", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("erased the payloads of 1 finished claims"),
        "{out}"
    );
    assert!(
        out.contains("deleted 0 completed claims older than 2h and 0 failed claims older than 2h"),
        "each terminal state's window: {out}"
    );
    let (bytes, answer, _, erased) = row(&ts, "old-1").await;
    assert!(bytes.is_empty() && answer.is_none() && erased);
    for id in ["open-1", "parked-1"] {
        assert!(!row(&ts, id).await.3, "{id}: open claims are never erased");
    }
    let history = store.events(done).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.action.as_str(), last.actor.as_str()),
        ("erase", "retention")
    );
    // The row stays and still answers its key.
    let mut again = orphan_claim("payments", "", "old-1", "payments::old-1");
    again.payload = payload().into_bytes().into();
    again.fingerprint = claimd::domain::claim::fingerprint(&again.payload);
    assert!(matches!(
        store.claim(&again).await.unwrap(),
        ClaimOutcome::Duplicate(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_retention_erases_after_its_window_sqlite() {
    payload_retention(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_retention_erases_after_its_window_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    payload_retention(ts).await;
}
