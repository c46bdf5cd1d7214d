//! Saying when an acknowledged claim can be lost (issue 54, item 3): `claimd run` reads the
//! PostgreSQL primary's replication settings at start, warns in plain words when a failover can
//! lose acknowledged claims, shows the mode in `/metrics` and `/readyz`, and with
//! `[store] require_synchronous_standby = true` refuses to start (exit 2) without a synchronous
//! standby; while it runs, intake answers `503` + `Retry-After` and `/readyz` says why. The test
//! server (127.0.0.1:5432) has no standby; a synchronous standby is not set up here.

use crate::common;

use claimd::store::replication::{ReplicationMode, classify};
use common::*;
use std::time::Duration;

/// The test server's replication as claimd classifies it, read through a fresh store.
async fn classified(url: &str) -> claimd::store::replication::Replication {
    let store = claimd::store::open(url, 2).await.unwrap();
    let settings = store
        .replication()
        .await
        .unwrap()
        .expect("PostgreSQL has settings");
    classify(&settings)
}

fn requiring(toml: &str) -> String {
    toml.replacen(
        "max_connections = 8",
        "max_connections = 8\nrequire_synchronous_standby = true",
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_synchronous_standby_is_warned_about_at_start_and_shown() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let expected = classified(&store.url()).await;
    assert_ne!(
        expected.mode,
        ReplicationMode::Synchronous,
        "the test server has no standby: {expected:?}"
    );
    let (_sb, provider) = sandbox(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let worker = ready_worker(&toml, dir.path(), "plain").await;
    let c = client();
    let metrics = c
        .get(format!("{}/metrics", worker.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mode = expected.mode.as_str();
    assert!(
        metrics.contains(&format!("claimd_store_replication{{mode=\"{mode}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains("claimd_store_replication{mode=\"synchronous\"} 0"),
        "{metrics}"
    );
    let ready: serde_json::Value = c
        .get(format!("{}/readyz", worker.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["ready"], true, "not required: still ready: {ready}");
    assert_eq!(ready["replication"], "ok", "{ready}");
    assert_eq!(ready["replication_mode"], mode, "{ready}");
    // The operator page says it too, in the warning's words.
    let page = c
        .get(format!("{}/", worker.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("Replication: {mode}")), "{page}");
    assert!(
        page.contains("can lose claims that were already acknowledged"),
        "{page}"
    );
    // Messages are taken as before: the warning is a warning.
    let r = c
        .post(format!("{}/v1/messages/payments", worker.base))
        .header("Idempotency-Key", "m1")
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    drop(worker);
    let log = std::fs::read_to_string(dir.path().join("plain.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("replication"))
        .unwrap_or_else(|| panic!("no replication warning in the log: {log}"));
    for words in [
        "can lose claims that were already acknowledged",
        "payment requests the provider may have performed",
        "synchronous_standby_names = ''",
        "synchronous_commit = ",
        "Replication: when an acknowledged claim can be lost",
    ] {
        assert!(line.contains(words), "{words:?} not in {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiring_a_synchronous_standby_refuses_to_start_without_one() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("required.toml");
    std::fs::write(
        &cfg,
        requiring(&config_toml(
            &store.url(),
            &consumer_toml("payments", &provider, ""),
        )),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let (code, _, err) = tokio::task::spawn_blocking(move || cli(&["--config", &cfg, "run"]))
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    for words in [
        "[store] require_synchronous_standby is set",
        "can lose claims that were already acknowledged",
        "synchronous_standby_names = ''",
        "claimd does not start",
    ] {
        assert!(err.contains(words), "{words:?} not in {err}");
    }
    assert_eq!(err.lines().count(), 1, "one line: {err}");
}

/// `synchronous_commit = off` (here for the test's database only) is said: a crash of the
/// primary alone can lose the last acknowledged claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_off_says_a_crash_alone_can_lose_claims() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let name = store.url().rsplit_once('/').unwrap().1.to_string();
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&pg_admin_url()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let r = classified(&store.url()).await;
    assert_eq!(r.settings.synchronous_commit, "off");
    assert!(r.unflushed);
    assert_ne!(r.mode, ReplicationMode::Synchronous);
    assert!(
        r.describe().contains(
            "a crash of the primary alone, with no failover, can lose the last acknowledged claims"
        ),
        "{}",
        r.describe()
    );
}

/// When the requirement stops being met while the worker runs (here: the requirement set on a
/// running worker whose server has no synchronous standby), intake answers `503` with
/// `Retry-After` and commits nothing, and `/readyz` is `503` saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_without_its_required_standby_refuses_intake_and_is_unready() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let claimer = running.app().claimer.clone();
    assert!(claimer.replication().get().is_some(), "read at start");
    claimer.replication().require_synchronous(true);
    claimd::service::replication::refresh(&claimer).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "m1")
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "5");
    let body = r.text().await.unwrap();
    assert!(body.contains("require_synchronous_standby"), "{body}");
    assert!(body.contains("nothing was recorded"), "{body}");
    assert!(
        running
            .app()
            .store
            .get("payments", "", "m1")
            .await
            .unwrap()
            .is_none(),
        "nothing committed"
    );
    let r = c.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let ready: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ready["ready"], false, "{ready}");
    let why = ready["replication"].as_str().unwrap();
    assert!(why.contains("require_synchronous_standby"), "{ready}");
    // Not required any more: taken again.
    claimer.replication().require_synchronous(false);
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "m1")
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    running.shutdown(Duration::from_secs(5)).await;
}

/// SQLite is a single file: the option is refused at load, and nothing is said or shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_the_option_and_has_no_replication_series() {
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lite.toml");
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    );
    std::fs::write(&cfg, requiring(&toml)).unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let (code, _, err) = tokio::task::spawn_blocking(move || cli(&["--config", &cfg, "run"]))
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("store.require_synchronous_standby"), "{err}");
    assert!(err.contains("SQLite is a single file"), "{err}");

    let (_store, _sb, running) = payments_worker("").await;
    let base = format!("http://{}", running.http_addr);
    let metrics = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!metrics.contains("claimd_store_replication{"), "{metrics}");
    let ready = get_json(&format!("{base}/readyz")).await;
    assert!(ready["replication_mode"].is_null(), "{ready}");
    running.shutdown(Duration::from_secs(5)).await;
}

/// With a synchronous standby, a worker that requires one starts and says `synchronous`; when
/// the primary stops naming it, the next reading makes intake answer `503` (nothing committed)
/// and `/readyz` unready; named again, messages are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_lets_a_worker_that_requires_one_start_and_lose_it_later() {
    let Some(pair) =
        tokio::task::spawn_blocking(|| pg_pair::PgPair::start(pg_pair::Standby::Synchronous))
            .await
            .unwrap()
    else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    let toml = requiring(&config_toml(
        &pair.url(),
        &consumer_toml("payments", &provider, ""),
    ));
    // The standby connects within a moment of starting.
    let attached = eventually(Duration::from_secs(10), || {
        let url = pair.url();
        async move { classified(&url).await.settings.synchronous_standbys == Some(1) }
    })
    .await;
    assert!(attached, "the standby never became synchronous");
    let running = start(&toml).await;
    let claimer = running.app().claimer.clone();
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let ready = get_json(&format!("{base}/readyz")).await;
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["replication_mode"], "synchronous", "{ready}");
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("claimd_store_replication{mode=\"synchronous\"} 1"),
        "{metrics}"
    );
    let post = |id: &'static str| {
        c.post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", id)
            .json(&serde_json::json!({"amount": 1}))
            .send()
    };
    assert_eq!(post("s1").await.unwrap().status(), 202);

    // A reload reaches the server's sessions a moment later.
    pair.set_names("").await;
    let lost = eventually(Duration::from_secs(10), || {
        let claimer = claimer.clone();
        async move {
            claimd::service::replication::refresh(&claimer).await;
            claimer.replication().refusal().is_some()
        }
    })
    .await;
    assert!(lost, "the reading follows the primary's settings");
    let r = post("s2").await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "5");
    let r = c.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(
        running
            .app()
            .store
            .get("payments", "", "s2")
            .await
            .unwrap()
            .is_none(),
        "nothing committed while refused"
    );

    pair.set_names("standby1").await;
    let back = eventually(Duration::from_secs(10), || {
        let claimer = claimer.clone();
        async move {
            claimd::service::replication::refresh(&claimer).await;
            claimer.replication().refusal().is_none()
        }
    })
    .await;
    assert!(back, "synchronous again");
    assert_eq!(post("s2").await.unwrap().status(), 202);
    running.shutdown(Duration::from_secs(5)).await;
}
