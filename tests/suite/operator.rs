//! Operator tools as an operator uses them: configuration errors, `sweep --dry-run`,
//! `report` formats, `reconcile`, `claims list --stuck`, and a sweeper that keeps firing
//! while the worker is busy.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::{ClaimOutcome, NewEvent, Settlement};
use common::provider::{Script, TestProvider};
use common::*;
use std::time::Duration;

fn write_config(dir: &std::path::Path, toml: &str) -> String {
    let path = dir.join("c.toml");
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn bad_configuration_exits_2_with_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let good = config_toml(&store, &consumer_toml("payments", "http://127.0.0.1:1", ""));
    for (broken, needle) in [
        (
            good.replace("max_attempts = 5", "max_attempts = 5\nmax_atempts = 6"),
            "max_atempts",
        ),
        (
            good.replace("lease = \"3s\"", "lease = \"3 seconds\""),
            "consumers[0].lease",
        ),
        (
            good.replace("lease = \"3s\"", "lease = \"500ms\""),
            "longer than the effect timeout",
        ),
        (
            good.replace("source = \"http\"", "source = \"kafka\""),
            "consumers[0].source",
        ),
        ("[store\nurl = 1".to_string(), "not valid TOML"),
    ] {
        let cfg = write_config(dir.path(), &broken);
        let (code, out, err) = cli(&["report", "--config", &cfg]);
        assert_eq!(code, 2, "{needle}: {out}{err}");
        let line = err.trim_end();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(
            line.contains(needle) && line.contains("c.toml"),
            "{needle:?} in {line}"
        );
    }
    let (code, _, err) = cli(&["report", "--config", "/nonexistent/claimd.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read"), "{err}");
    let (code, _, err) = cli(&[
        "claims", "resolve", "p", "m", "--as", "started", "--note", "x", "--config", "/x",
    ]);
    assert_eq!(code, 2, "bad usage is exit 2: {err}");
}

async fn stuck_claim(store: &claimd::store::Store, id: &str) -> i64 {
    let n = orphan_claim("payments", "", id, id);
    match store.claim(&n).await.unwrap() {
        ClaimOutcome::Created(c) => c.id,
        _ => panic!("new claim"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_dry_run_report_formats_and_stuck_listing() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_toml(&store.url(), &consumer_toml("payments", &provider, "")),
    );
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    stuck_claim(&s, "stuck-1").await;
    tokio::time::sleep(Duration::from_millis(10)).await;

    let (code, out, _) = cli(&["claims", "list", "--stuck", "--config", &cfg]);
    assert_eq!(code, 0);
    assert!(out.contains("stuck-1") && out.contains("(stuck)"), "{out}");
    let (code, out, _) = cli(&["report", "--check", "--config", &cfg]);
    assert_eq!(code, 3, "a stuck claim fails the check: {out}");
    assert!(out.contains("lease expired"), "{out}");
    let (code, out, _) = cli(&["report", "--format", "csv", "--config", &cfg]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("consumer,received,duplicates,payload_mismatches,started,stuck,"),
        "{out}"
    );
    assert!(out.contains("\npayments,1,0,0,1,1,0,0,0,"), "{out}");
    assert!(
        out.contains("\n\nconsumer,tenant,message_id,state,attempt,age_s,reason,idempotency_key\npayments,,stuck-1,started,"),
        "the claims that need a look follow the counts: {out}"
    );

    let (code, out, _) = cli(&["sweep", "--dry-run", "--config", &cfg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("stuck-1") && out.contains("reconcile") && out.contains("dry run"),
        "{out}"
    );
    assert_eq!(
        s.get("payments", "", "stuck-1")
            .await
            .unwrap()
            .unwrap()
            .attempt,
        1,
        "dry run changes nothing"
    );

    // The real pass: the sandbox never saw the key, so reconcile says 404 and it is redriven.
    let (code, out, _) = cli(&["sweep", "--config", &cfg]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("not found at provider; redriven: completed"),
        "{out}"
    );
    let c = s.get("payments", "", "stuck-1").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Completed);
    assert_eq!(c.attempt, 2);
    let (code, out, _) = cli(&["report", "--check", "--format", "json", "--config", &cfg]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["consumers"][0]["completed"], 1);
    assert_eq!(
        v["sweeper"]["healthy"], true,
        "the CLI pass counts as a sweeper run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_lists_disagreements_worst_first() {
    let store = TestStore::sqlite();
    let provider = TestProvider::start(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_toml(&store.url(), &consumer_toml("payments", &provider.url, "")),
    );
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    let settle = |state| Settlement {
        state: Some(state),
        error: Some("x".into()),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "t",
        action: "t",
        outcome: "t",
        provider_status: None,
        detail: None,
    };
    // completed here, unknown to the provider
    let a = stuck_claim(&s, "ghost").await;
    s.settle(a, 1, &settle(ClaimState::Completed), &ev)
        .await
        .unwrap();
    // failed here, but the provider has it
    let b = stuck_claim(&s, "late-success").await;
    s.settle(b, 1, &settle(ClaimState::Failed), &ev)
        .await
        .unwrap();
    provider
        .ledger
        .lock()
        .unwrap()
        .applied
        .insert("late-success".into(), 1);
    // needs_attention here, provider has it
    let c = stuck_claim(&s, "parked-but-paid").await;
    s.settle(c, 1, &settle(ClaimState::NeedsAttention), &ev)
        .await
        .unwrap();
    provider
        .ledger
        .lock()
        .unwrap()
        .applied
        .insert("parked-but-paid".into(), 1);
    // agreeing
    let d = stuck_claim(&s, "fine").await;
    s.settle(d, 1, &settle(ClaimState::Completed), &ev)
        .await
        .unwrap();
    provider
        .ledger
        .lock()
        .unwrap()
        .applied
        .insert("fine".into(), 1);

    let (code, out, _) = cli(&["reconcile", "--config", &cfg]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("checked 4 claims"), "{out}");
    let ghost = out.find("ghost").unwrap();
    let late = out.find("late-success").unwrap();
    let parked = out.find("parked-but-paid").unwrap();
    assert!(ghost < late && late < parked, "worst first:\n{out}");
    assert!(!out.contains("fine "), "{out}");
    assert!(
        out.contains("claimd claims resolve payments parked-but-paid --as completed"),
        "{out}"
    );
    let file = std::fs::canonicalize(&cfg).unwrap();
    assert!(
        out.contains(&format!("--config {}", file.display())),
        "the commands name the configuration reconcile read:\n{out}"
    );
    let (code, out, _) = cli(&["reconcile", "--format", "json", "--config", &cfg]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mismatches"][0]["kind"], "completed_unknown_to_provider");
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_keeps_firing_while_the_worker_is_busy() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(20),
        fail_rate: 0.3,
        ..Default::default()
    })
    .await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    // Load: 8 clients posting for the whole observation.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..8 {
        let base = base.clone();
        let stop = stop.clone();
        load.push(tokio::spawn(async move {
            let c = client();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = c
                    .post(format!("{base}/v1/messages/payments"))
                    .header("Idempotency-Key", format!("w{w}-{i}"))
                    .body("{}")
                    .send()
                    .await;
                i += 1;
            }
            i
        }));
    }
    let mut beats = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        if let Some(t) = s.last_sweep().await.unwrap()
            && beats.last() != Some(&t)
        {
            beats.push(t);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut sent = 0;
    for l in load {
        sent += l.await.unwrap();
    }
    assert!(sent > 100, "the worker was busy ({sent} posts)");
    assert!(
        beats.len() >= 5,
        "a 1-second schedule fired only {} times in 8s",
        beats.len()
    );
    let max_gap = beats
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds())
        .max()
        .unwrap();
    assert!(
        max_gap <= 3000,
        "no pass skipped for good: largest gap {max_gap} ms"
    );
    let r = client().get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["sweeper"], "ok");
    assert!(v["sweeper_last_run_utc"].is_string());
    let r: serde_json::Value = get_json(&format!("{base}/v1/report")).await;
    assert_eq!(r["sweeper"]["healthy"], true);
    // And everything the 503s delayed ends completed.
    assert!(
        eventually(Duration::from_secs(30), || async {
            let c = s.counts(None).await.unwrap();
            c[0].started == 0
        })
        .await,
        "no claim stays started: {:?}",
        s.list(&claimd::store::ClaimFilter {
            state: Some(claimd::domain::claim::ClaimState::Started),
            consumer: None,
            stuck: false,
            since: None,
            limit: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .iter()
        .map(|c| (
            c.message_id.clone(),
            c.attempt,
            c.waits,
            c.lease_until,
            c.last_error.clone()
        ))
        .collect::<Vec<_>>()
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// An API action that names the version it read acts only on that version: after the
/// provider's events moved the claim away and back (same state, same attempt) it is answered
/// `409` "the claim changed since you read it", and with the version read again it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_action_on_a_version_read_before_the_claim_moved_is_refused() {
    let (_store, _sandbox, running) = payments_worker("admin_token = \"secret-admin-token\"").await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(&s, "payments", "api-aba", "outcome unknown (timeout)").await;
    let read = s.get("payments", "", "api-aba").await.unwrap().unwrap();
    let shown: serde_json::Value = serde_json::to_value(&read).unwrap();
    let seen = shown["version"]
        .as_i64()
        .expect("claims show their version");

    let events = claimd::engine::settle::Settler::new(
        s.clone(),
        "event".into(),
        std::sync::Arc::new(claimd::engine::metrics::Metrics::new()),
    );
    for (from, to) in [
        (ClaimState::NeedsAttention, ClaimState::Pending),
        (ClaimState::Pending, ClaimState::NeedsAttention),
    ] {
        let now = s.get("payments", "", "api-aba").await.unwrap().unwrap();
        let moved = Settlement {
            state: Some(to),
            error: Some("requires_action".into()),
            ..Default::default()
        };
        assert!(
            events
                .settle_from(&now, from, moved, "event", to.as_str())
                .await
                .unwrap()
        );
    }
    let resolve = |version: i64| {
        client()
            .post(format!("{base}/v1/claims/payments/api-aba/resolve"))
            .bearer_auth("secret-admin-token")
            .json(&serde_json::json!({
                "to": "completed", "note": "paid", "actor": "ops", "version": version
            }))
            .send()
    };
    let r = resolve(seen).await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!(
            "the claim changed since you read it (version {seen}, now "
        )) && body.contains("reload"),
        "{body}"
    );
    let now = s.get("payments", "", "api-aba").await.unwrap().unwrap();
    assert_eq!(now.state, ClaimState::NeedsAttention);
    let again = serde_json::to_value(&now).unwrap()["version"]
        .as_i64()
        .unwrap();
    let r = resolve(again).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let done = s.get("payments", "", "api-aba").await.unwrap().unwrap();
    assert_eq!(done.state, ClaimState::Completed);
    running.shutdown(Duration::from_secs(2)).await;
}

/// A provider whose search lags (its status route has no record yet of what it just applied):
/// a claim completed a moment ago is too recent to judge under `not_found_after = "30s"`, while
/// one completed an hour ago and unknown to the provider is still the worst finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_trusts_not_found_only_after_not_found_after() {
    let store = TestStore::sqlite();
    let provider = TestProvider::start(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // The appended line lands in [consumers.effect], the section consumer_toml ends with.
    let consumer = format!(
        "{}not_found_after = \"30s\"\n",
        consumer_toml("payments", &provider.url, "")
    );
    let cfg = write_config(dir.path(), &config_toml(&store.url(), &consumer));
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    let completed = Settlement {
        state: Some(ClaimState::Completed),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "t",
        action: "perform",
        outcome: "completed",
        provider_status: Some(200),
        detail: None,
    };
    for id in ["just-paid", "ghost"] {
        let c = stuck_claim(&s, id).await;
        assert!(s.settle(c, 1, &completed, &ev).await.unwrap());
    }
    // "ghost" settled an hour ago (test data: claimd writes the database's now).
    {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&store.url()).await.unwrap();
        sqlx::query(
            "UPDATE claims SET processed_utc = processed_utc - 3600000, \
             started_utc = started_utc - 3600000 WHERE message_id = 'ghost'",
        )
        .execute(&mut c)
        .await
        .unwrap();
    }
    let (code, out, err) = cli(&["reconcile", "--config", &cfg]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("checked 1 claims") && out.contains("1 too recent to judge"),
        "{out}"
    );
    assert!(out.contains("ghost"), "{out}");
    assert!(
        !out.contains("just-paid"),
        "a claim completed 2 s ago is no alarm:\n{out}"
    );
    let (_, out, _) = cli(&["reconcile", "--format", "json", "--config", &cfg]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["too_recent"], 1, "{v}");
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 1, "{v}");
}

/// The Square example has no status endpoint: `reconcile` of it audits nothing and says so
/// with exit 4, so a cron job running it turns red instead of staying green.
#[test]
fn reconcile_of_a_consumer_it_cannot_audit_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("square.db").display());
    let env = [
        ("CLAIMD_STORE_URL", store.as_str()),
        ("SQUARE_ACCESS_TOKEN", "sandbox"),
    ];
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/square.toml");
    let (code, _, err) = cli_with_env(&["--config", cfg, "migrate"], &env);
    assert_eq!(code, 0, "{err}");
    for args in [
        vec!["--config", cfg, "reconcile"],
        vec![
            "--config",
            cfg,
            "reconcile",
            "--consumer",
            "square-payments",
        ],
    ] {
        let (code, out, err) = cli_with_env(&args, &env);
        assert_eq!(code, 4, "{args:?}: {out}{err}");
        assert!(
            err.contains("audited nothing") && err.contains("square-payments"),
            "{err}"
        );
        assert!(out.contains("not auditable"), "{out}");
    }
}
