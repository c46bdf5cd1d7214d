//! What waits is not in flight (issue 53): a send scheduled hours ahead and a claim held in its
//! order key's line are counted as waiting (`claimd_scheduled_claims`, `claimd_waiting_in_line`),
//! not as old started claims, so the shipped paging rules (docs/alerts.yml, evaluated against
//! `/metrics`) stay quiet; `report`'s `waiting` column agrees with its line section; the time
//! to complete a scheduled send counts from its time, not from its receipt; and a redrive of a
//! failed claim is one attempt, not two.

use crate::common::*;
use claimd::domain::claim::ClaimState;
use claimd::service::{app::App, run};
use claimd::store::{ClaimOutcome, NewEvent, Settlement};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// The value of each `name{consumer="..."} value` sample, by consumer.
fn by_consumer(metrics: &str, name: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix("{consumer=\""))
        .filter_map(|rest| {
            let (consumer, rest) = rest.split_once('"')?;
            let value = rest.rsplit(' ').next()?.parse().ok()?;
            Some((consumer.to_string(), value))
        })
        .collect()
}

/// The paging rules of docs/alerts.yml whose expression is one or more
/// `max by (consumer) (metric) > n` joined by `and`, evaluated against a `/metrics` answer:
/// the (alert, consumer) pairs that would fire. `for:` is left out: a page is a condition that
/// holds, and these hold for as long as the claims wait.
fn pages(metrics: &str) -> Vec<(String, String)> {
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.yml")).unwrap();
    // (alert, expression, severity) from the YAML's few shapes (`expr: ...` or `expr: |`).
    let mut parsed: Vec<(String, String, String)> = Vec::new();
    let mut in_expr = false;
    for line in rules.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert: ") {
            parsed.push((name.to_string(), String::new(), String::new()));
            in_expr = false;
        } else if let Some(e) = t.strip_prefix("expr: ") {
            in_expr = e == "|";
            if !in_expr && let Some(r) = parsed.last_mut() {
                r.1 = e.to_string();
            }
        } else if let Some(s) = t.strip_prefix("severity: ") {
            in_expr = false;
            if let Some(r) = parsed.last_mut() {
                r.2 = s.to_string();
            }
        } else if in_expr && line.starts_with("          ") {
            if let Some(r) = parsed.last_mut() {
                r.1.push(' ');
                r.1.push_str(t);
            }
        } else {
            in_expr = false;
        }
    }
    let mut fired = Vec::new();
    for (alert, expr, severity) in parsed {
        if severity != "page" {
            continue;
        }
        // Each part: `max by (consumer) (metric) > n`, in parentheses or not.
        let parts: Option<Vec<(String, f64)>> = expr
            .split(" and ")
            .map(|p| {
                let p = p.trim().trim_start_matches('(').trim_end_matches(')');
                let rest = p.strip_prefix("max by (consumer) (")?;
                let (metric, rest) = rest.split_once(')')?;
                let n = rest.trim().strip_prefix('>')?.trim().trim_end_matches(')');
                Some((metric.to_string(), n.parse().ok()?))
            })
            .collect();
        let Some(parts) = parts else { continue };
        let consumers = by_consumer(metrics, &parts[0].0);
        for consumer in consumers.keys() {
            let holds = parts.iter().all(|(metric, n)| {
                by_consumer(metrics, metric)
                    .get(consumer)
                    .is_some_and(|v| v > n)
            });
            if holds {
                fired.push((alert.clone(), consumer.clone()));
            }
        }
    }
    fired
}

/// Moves the `started` claims' receipt back by `secs` (test data only: claimd writes the
/// database's now).
async fn received_earlier(url: &str, secs: i64) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("UPDATE claims SET received_utc = received_utc - ?1 WHERE state = 'started'")
            .bind(secs * 1000)
            .execute(&mut c)
            .await
            .unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(
            "UPDATE claims SET received_utc = received_utc - make_interval(secs => $1) \
             WHERE state = 'started'",
        )
        .bind(secs as f64)
        .execute(&mut c)
        .await
        .unwrap();
    }
}

/// A claim held for its time (3 hours ahead) and one held in its line behind a parked claim,
/// both received two hours ago: no page, nothing stuck, both counted as waiting.
async fn waiting_claims_page_nobody(store: TestStore) {
    // The evaluator is not vacuous: an in-flight claim an hour and more old pages.
    assert_eq!(
        pages("claimd_oldest_started_age_seconds{consumer=\"x\"} 3700\n"),
        [("ClaimdOldestStartedClaimOld".to_string(), "x".to_string())]
    );
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "order_key = \"{order_id}\""),
    );
    let app = App::open(load(&toml), true).await.unwrap();
    let s = app.store.clone();
    let mut head = orphan_claim("payments", "", "o1-charge", "payments:o1-charge");
    head.order_key = Some("o1".into());
    park_claim(&s, &head, "outcome unknown: the provider timed out", "test").await;
    let running = run::start(app).await.unwrap();
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let post = |id: &'static str, order: &'static str, not_before: Option<&'static str>| {
        let mut r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", id)
            .json(&json!({ "order_id": order, "amount_cents": 100 }));
        if let Some(t) = not_before {
            r = r.header("Not-Before", t);
        }
        r.send()
    };
    assert_eq!(post("o1-refund", "o1", None).await.unwrap().status(), 202);
    assert_eq!(
        post("o3-later", "o3", Some("3h")).await.unwrap().status(),
        202
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    received_earlier(&store.url(), 7200).await;

    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let show = |name: &str| by_consumer(&metrics, name).get("payments").copied();
    assert_eq!(
        pages(&metrics),
        [],
        "nothing is in flight or stale: oldest started {:?} s, stuck {:?}",
        show("claimd_oldest_started_age_seconds"),
        show("claimd_stuck_claims")
    );
    assert_eq!(show("claimd_stuck_claims"), Some(0.0));
    assert_eq!(show("claimd_scheduled_claims"), Some(1.0), "{metrics}");
    assert_eq!(show("claimd_waiting_in_line"), Some(1.0), "{metrics}");
    assert_eq!(show("claimd_waiting_claims"), Some(2.0), "{metrics}");

    let report = get_json(&format!("{base}/v1/report")).await;
    let r = report["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer"] == "payments")
        .unwrap();
    assert_eq!(report["in_line"]["payments"], 1, "{report}");
    assert_eq!(
        (&r["started"], &r["waiting"], &r["stuck"]),
        (&json!(2), &json!(2), &json!(0)),
        "every started claim waits (one in its line, one for its time): {r}"
    );
    assert_eq!(
        (&r["in_line"], &r["scheduled"]),
        (&json!(1), &json!(1)),
        "{r}"
    );
    assert!(r["oldest_started_age_s"].is_null(), "{r}");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claims_page_nobody_sqlite() {
    waiting_claims_page_nobody(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claims_page_nobody_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    waiting_claims_page_nobody(store).await;
}

/// A send scheduled 3 s ahead completes within a sweep period of its time: the report's
/// time to complete counts from then, not from its receipt.
async fn scheduled_sends_time_from_their_time(store: TestStore) {
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml("reminders", &provider, ""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let r = client()
        .post(format!("{base}/v1/messages/reminders"))
        .header("Idempotency-Key", "r1")
        .header("Not-Before", "3s")
        .json(&json!({ "text": "hello" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let s = running.app().store.clone();
    let done = eventually(Duration::from_secs(15), || async {
        s.get("reminders", "", "r1").await.unwrap().unwrap().state == ClaimState::Completed
    })
    .await;
    assert!(done, "the scheduled send did not complete");
    let report = get_json(&format!("{base}/v1/report")).await;
    let r = &report["consumers"][0];
    let p95 = r["p95_complete_s"].as_f64().unwrap();
    eprintln!("p95 time to complete of a send scheduled 3 s ahead: {p95} s");
    assert!(
        p95 < 2.0,
        "p95 counts from the scheduled time (the sweeper runs every second), not the 3 s wait: {p95} s"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_time_from_their_time_sqlite() {
    scheduled_sends_time_from_their_time(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_time_from_their_time_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    scheduled_sends_time_from_their_time(store).await;
}

/// A claim failed at attempt 1, redriven by an operator (`claimd claims redrive`, which says
/// which attempt the sweep performs): sent once more, at attempt 2.
async fn a_redrive_is_one_attempt(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let app = App::open(load(&toml), true).await.unwrap();
    let s = app.store.clone();
    let ClaimOutcome::Created(c) = s
        .claim(&orphan_claim("payments", "", "p1", "payments:p1"))
        .await
        .unwrap()
    else {
        panic!("new claim");
    };
    let failed = Settlement {
        state: Some(ClaimState::Failed),
        error: Some("card declined".into()),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "test",
        action: "perform",
        outcome: "failed",
        provider_status: Some(402),
        detail: None,
    };
    assert!(s.settle(c.id, 1, &failed, &ev).await.unwrap());
    let running = run::start(app).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let (code, out, err) = cli(&[
        "--config",
        &cfg.to_string_lossy(),
        "claims",
        "redrive",
        "payments",
        "p1",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("performs it as attempt 2"), "{out}");
    let done = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "p1").await.unwrap().unwrap().state == ClaimState::Completed
    })
    .await;
    assert!(done, "the redriven claim did not complete");
    let claim = s.get("payments", "", "p1").await.unwrap().unwrap();
    let history = s.events(claim.id).await.unwrap();
    assert_eq!(
        claim.attempt,
        2,
        "failed at attempt 1, redriven once: {:?}",
        history
            .iter()
            .map(|e| format!("{} {} {}", e.attempt, e.action, e.outcome))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        sandbox
            .effects()
            .iter()
            .filter(|e| e.key == "payments:p1")
            .map(|e| e.applied)
            .sum::<u64>(),
        1
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_is_one_attempt_sqlite() {
    a_redrive_is_one_attempt(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_is_one_attempt_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_redrive_is_one_attempt(store).await;
}
