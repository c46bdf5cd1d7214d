//! Follow-ups (`[[consumers.follow_ups]]`, docs/follow-ups.md): a charge's completion creates
//! its receipt's claim in the settle's transaction, the receipt carries the charge's id from
//! the provider's answer and is sent once; retention keeps a parent while its child is open.

use crate::common;

use claimd::domain::claim::{ClaimState, NewClaim, fingerprint};
use claimd::provider::sandbox::Sandbox;
use claimd::store::{ClaimOutcome, FollowUpClaim, NewEvent, RetentionWindows, Settlement, Store};
use common::*;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// A `charges` consumer whose completion sends a receipt through `receipts`.
fn consumers(provider: &str, charge_extra: &str) -> String {
    format!(
        "{}{}\n[[consumers.follow_ups]]\nstep = \"receipt\"\non = \"completed\"\nconsumer = \"receipts\"\npayload = '{{\"charge\": \"{{{{answer:/id}}}}\", \"email\": \"{{{{payload:/email}}}}\"}}'\n",
        consumer_toml("receipts", provider, ""),
        consumer_toml("charges", provider, charge_extra),
    )
}

/// The body the receipt of charge `i` must have been sent with, given the sandbox's id of
/// the charge.
fn receipt_body(charge_id: &str, i: usize) -> String {
    serde_json::json!({"charge": charge_id, "email": format!("u{i}@example.com")}).to_string()
}

/// Every charge `c<i>` (`i < n`) was applied once, and its receipt once, with the charge's
/// id in the body sent.
fn assert_receipts(sb: &Sandbox, n: usize) {
    let effects = sb.effects();
    let receipts = effects.iter().filter(|e| e.path == "/v1/receipts").count();
    assert_eq!(receipts, n, "one receipt per charge");
    for i in 0..n {
        let charge = effects
            .iter()
            .find(|e| e.key == format!("charges::c{i}"))
            .unwrap_or_else(|| panic!("charge c{i} not applied"));
        assert_eq!(charge.applied, 1, "charge c{i} applied once");
        let receipt = effects
            .iter()
            .find(|e| e.key == format!("receipts::c{i}:receipt"))
            .unwrap_or_else(|| panic!("no receipt for charge c{i}"));
        assert_eq!(receipt.applied, 1, "receipt of c{i} sent once");
        let id = charge.response["id"].as_str().unwrap();
        let body = receipt_body(id, i);
        assert_eq!(
            receipt.body_sha256,
            hex::encode(Sha256::digest(body.as_bytes())),
            "receipt of c{i} carries charge id {id}"
        );
    }
}

async fn post_charge(base: &str, i: usize) {
    let r = client()
        .post(format!("{base}/v1/messages/charges"))
        .header("Idempotency-Key", format!("c{i}"))
        .header("Content-Type", "application/json")
        .body(format!("{{\"email\":\"u{i}@example.com\",\"amount\":100}}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

async fn receipts_follow_charges(store: TestStore) {
    let (sb, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(&store.url(), &consumers(&provider, ""))).await;
    let base = format!("http://{}", running.http_addr);
    const N: usize = 20;
    for i in 0..N {
        post_charge(&base, i).await;
    }
    let s = running.app().store.clone();
    let done = eventually(Duration::from_secs(30), || async {
        claims_in(&s, "receipts", Some(ClaimState::Completed))
            .await
            .len()
            == N
    })
    .await;
    assert!(done, "every charge's receipt completed");
    assert_receipts(&sb, N);
    // The claim shows its chain both ways.
    let charge = s.get("charges", "", "c0").await.unwrap().unwrap();
    let receipt = s.get("receipts", "", "c0:receipt").await.unwrap().unwrap();
    let family = s.family(receipt.id).await.unwrap();
    assert_eq!(family.parent.as_ref().map(|p| p.id), Some(charge.id));
    let family = s.family(charge.id).await.unwrap();
    assert_eq!(
        family.children.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![receipt.id]
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn receipts_follow_charges_on_sqlite() {
    receipts_follow_charges(TestStore::sqlite()).await;
}

#[tokio::test]
async fn receipts_follow_charges_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        assert!(!require_pg(), "CLAIMD_TEST_PG is required");
        return;
    };
    receipts_follow_charges(store).await;
}

fn parent(id: &str) -> NewClaim {
    let mut c = orphan_claim("charges", "", id, id);
    c.worker = "w1".into();
    c.lease = Duration::from_secs(60);
    c
}

fn child(id: &str) -> FollowUpClaim {
    FollowUpClaim {
        consumer: "receipts".into(),
        tenant: String::new(),
        message_id: format!("{id}:receipt"),
        idem_key: format!("{id}:receipt"),
        fingerprint: fingerprint(b"{}"),
        payload: b"{}".to_vec(),
        content_type: "application/json".into(),
        parked: None,
    }
}

fn ev() -> NewEvent<'static> {
    NewEvent {
        actor: "test",
        action: "perform",
        outcome: "applied",
        provider_status: Some(200),
        detail: None,
    }
}

/// Retention deletes no parent whose child is open; once the child is finished, both go.
/// A settle retried creates its child once.
async fn retention_keeps_open_parents(store: TestStore) {
    let s: Store = claimd::store::open(&store.url(), 4).await.unwrap();
    s.migrate().await.unwrap();
    s.set_outcome_destinations(vec![("receipts".into(), "hook".into())]);
    let ClaimOutcome::Created(p) = s.claim(&parent("p1")).await.unwrap() else {
        panic!("not created")
    };
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        follow_ups: vec![child("p1")],
        ..Default::default()
    };
    assert!(s.settle(p.id, p.attempt, &done, &ev()).await.unwrap());
    // Retried (its reply lost): the fence refuses it, nothing more is created.
    assert!(!s.settle(p.id, p.attempt, &done, &ev()).await.unwrap());
    let kids = claims_in(&s, "receipts", None).await;
    assert_eq!(kids.len(), 1);
    let kid = &kids[0];
    assert_eq!(kid.state, ClaimState::Started);
    assert_eq!(kid.lease_owner, None, "waits for the receipts pickup");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let kept = s
        .prune(&RetentionWindows::uniform(Duration::ZERO), 100, false)
        .await
        .unwrap();
    assert_eq!(kept.deleted, 0, "the parent of an open child stays");
    assert!(s.get("charges", "", "p1").await.unwrap().is_some());
    // The child finishes: both may go.
    let taken = s
        .take_enqueued("receipts", 10, "w1", Duration::from_secs(60), None, 0)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let finished = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    assert!(s.settle(kid.id, 1, &finished, &ev()).await.unwrap());
    // The child's outcome event names its parent.
    let events = s.due_outcomes("receipts", "hook", 10).await.unwrap();
    let parent = events[0]
        .parent
        .clone()
        .expect("the event carries its parent");
    assert_eq!(
        (parent.consumer.as_str(), parent.message_id.as_str()),
        ("charges", "p1")
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pruned = s
        .prune(&RetentionWindows::uniform(Duration::ZERO), 100, false)
        .await
        .unwrap();
    assert_eq!(pruned.deleted, 2);
}

#[tokio::test]
async fn retention_keeps_open_parents_on_sqlite() {
    retention_keeps_open_parents(TestStore::sqlite()).await;
}

#[tokio::test]
async fn retention_keeps_open_parents_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        assert!(!require_pg(), "CLAIMD_TEST_PG is required");
        return;
    };
    retention_keeps_open_parents(store).await;
}

#[test]
fn a_follow_up_naming_a_missing_consumer_is_refused() {
    let toml = config_toml(
        "sqlite://x.db",
        &consumers("http://127.0.0.1:1", "")
            .replace("consumer = \"receipts\"", "consumer = \"mail\""),
    );
    let loaded =
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars());
    let err = match loaded {
        Ok(_) => panic!("a follow-up naming a missing consumer was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("\"receipt\"") && err.contains("\"mail\"") && err.contains("not configured"),
        "{err}"
    );
}

/// Open follow-ups whose parent is gone: retention deleted a parent with an open child.
async fn orphaned_children(pg: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM claims k WHERE k.parent_id IS NOT NULL \
         AND k.state NOT IN ('completed', 'failed') \
         AND NOT EXISTS (SELECT 1 FROM claims p WHERE p.id = k.parent_id)",
    )
    .fetch_one(pg)
    .await
    .unwrap()
}

/// Claims not finished yet.
async fn open_claims(pg: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM claims WHERE state NOT IN ('completed', 'failed')")
        .fetch_one(pg)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: 1,000 charges and receipts through a worker killed with SIGKILL, retention every second"]
async fn a_thousand_receipts_through_sigkills_and_retention() {
    use sqlx::Connection;
    let Some(store) = TestStore::pg().await else {
        assert!(!require_pg(), "CLAIMD_TEST_PG is required");
        return;
    };
    // Keys ignored: a receipt or charge sent twice is applied twice and seen.
    let (sb, provider) = sandbox(claimd::provider::sandbox::SandboxOptions {
        ignore_keys: true,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = config_toml(&store.url(), &consumers(&provider, ""))
        .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
        .replace(
            "keep_terminal_for = \"2h\"",
            "keep_terminal_for = \"5s\"\nschedule = \"* * * * * *\"",
        )
        // Retention may not keep claims for less than the redelivery horizon.
        .replace("redrive_within = \"1h\"", "redrive_within = \"4s\"");
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("worker.log");
    let mut worker = Worker::spawn(&config, port, &log).await;
    assert!(worker.ready_within(Duration::from_secs(15)).await);
    const N: usize = 1000;
    let mut pg = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    let mut posted = 0;
    let mut kills = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        // Post in rounds, killing the worker between rounds and once all are in.
        let round = (posted + 150).min(N);
        while posted < round {
            post_charge(&worker.base, posted).await;
            posted += 1;
        }
        tokio::time::sleep(Duration::from_millis(300 + fastrand::u64(0..700))).await;
        assert_eq!(
            orphaned_children(&mut pg).await,
            0,
            "a parent of an open child was deleted"
        );
        let receipts = sb
            .effects()
            .iter()
            .filter(|e| e.path == "/v1/receipts")
            .count();
        if posted == N && receipts == N && open_claims(&mut pg).await == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not finished: {receipts} receipts"
        );
        if kills < 12 {
            worker.kill();
            kills += 1;
            worker = Worker::spawn(&config, port, &log).await;
            assert!(worker.ready_within(Duration::from_secs(15)).await);
        }
    }
    assert!(kills >= 6, "killed {kills} times");
    eprintln!("{N} receipts, each once, through {kills} SIGKILLs");
    assert_receipts(&sb, N);
    worker.terminate();
}

/// A value the template points at is missing: the child is created parked, naming the step
/// and the pointer, and nothing is sent for it.
#[tokio::test]
async fn a_missing_value_parks_the_child() {
    let store = TestStore::sqlite();
    let (sb, provider) = sandbox(Default::default()).await;
    let toml = consumers(&provider, "").replace("{{answer:/id}}", "{{answer:/receipt_email}}");
    let running = start(&config_toml(&store.url(), &toml)).await;
    let base = format!("http://{}", running.http_addr);
    post_charge(&base, 0).await;
    let s = running.app().store.clone();
    let parked = eventually(Duration::from_secs(10), || async {
        claims_in(&s, "receipts", Some(ClaimState::NeedsAttention))
            .await
            .len()
            == 1
    })
    .await;
    assert!(parked, "the receipt is parked");
    let kid = s.get("receipts", "", "c0:receipt").await.unwrap().unwrap();
    let reason = kid.last_error.unwrap_or_default();
    assert!(
        reason.contains("\"receipt\"") && reason.contains("/receipt_email"),
        "{reason}"
    );
    assert!(
        sb.effects().iter().all(|e| e.path != "/v1/receipts"),
        "nothing sent"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// The configuration refuses follow-ups that could not be performed once: into a consumer with
/// order keys, into one keyed without the tenant the parent's messages carry, and a chain that
/// comes back to its start.
#[test]
fn follow_ups_that_could_not_be_performed_once_are_refused() {
    let p = "http://127.0.0.1:1";
    let step = |from: &str, to: &str| {
        format!(
            "\n[[consumers.follow_ups]]\nstep = \"next\"\non = \"completed\"\nconsumer = \"{to}\"\npayload = '{{\"of\": \"{{{{message_id}}}}\"}}'\n# from {from}\n"
        )
    };
    let refusal = |consumers: String| {
        let toml = config_toml("sqlite://x.db", &consumers);
        match claimd::config::Config::from_toml(
            &toml,
            std::path::Path::new("t.toml"),
            std::env::vars(),
        ) {
            Ok(_) => panic!("accepted:\n{consumers}"),
            Err(e) => e.to_string(),
        }
    };
    let ordered = refusal(
        consumer_toml("receipts", p, "order_key = \"{email}\"")
            + &consumer_toml("charges", p, "")
            + &step("charges", "receipts"),
    );
    assert!(ordered.contains("order_key"), "{ordered}");
    let untenanted = refusal(
        consumer_toml("receipts", p, "key = \"{consumer}:{message_id}\"")
            + &consumer_toml("charges", p, "key = \"{tenant}:{message_id}\"")
            + &step("charges", "receipts"),
    );
    assert!(untenanted.contains("lacks {tenant}"), "{untenanted}");
    let cycle = refusal(
        consumer_toml("receipts", p, "")
            + &step("receipts", "charges")
            + &consumer_toml("charges", p, "")
            + &step("charges", "receipts"),
    );
    assert!(cycle.contains("back to it"), "{cycle}");
}
