//! Running claimd as operators do: readiness when PostgreSQL goes away and comes back, the
//! admin token on every admin route, secrets kept out of logs, and graceful shutdown.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use common::proxy::Proxy;
use common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database_and_intake_answers_503_while_it_is_gone() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let url = store
        .url()
        .replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &url,
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let ready = |c: reqwest::Client, base: String| async move {
        c.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert!(
        eventually(Duration::from_secs(5), || ready(c.clone(), base.clone())
            .then_is(200))
        .await
    );

    proxy.down();
    let t = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || ready(c.clone(), base.clone())
            .then_is(503))
        .await,
        "/readyz must turn red when the database goes away"
    );
    let red_after = t.elapsed();
    let body: serde_json::Value = get_json(&format!("{base}/readyz")).await;
    assert_eq!(body["ready"], false);
    assert_ne!(
        body["store"], "ok",
        "the body says which check failed: {body}"
    );
    // Intake refuses without committing anything, and says when to retry.
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "during-outage")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");

    proxy.up();
    assert!(
        eventually(Duration::from_secs(15), || ready(c.clone(), base.clone())
            .then_is(200))
        .await,
        "/readyz must turn green again"
    );
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "after-outage")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        202,
        "the worker recovers without a restart"
    );
    let s = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            s.get("payments", "", "after-outage")
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.state == ClaimState::Completed)
        })
        .await
    );
    assert!(
        s.get("payments", "", "during-outage")
            .await
            .unwrap()
            .is_none(),
        "nothing committed during the outage"
    );
    assert_eq!(sandbox.effects().len(), 1);
    eprintln!("readyz turned red {red_after:?} after the database went away");
    running.shutdown(Duration::from_secs(5)).await;
}

trait ThenIs {
    async fn then_is(self, want: u16) -> bool;
}
impl<F: std::future::Future<Output = u16>> ThenIs for F {
    async fn then_is(self, want: u16) -> bool {
        self.await == want
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_need_the_token_and_secrets_never_reach_the_logs() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions {
        fail_rate: 0.3,
        ambiguous_rate: 0.2,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = config_toml_with(
        &store.url(),
        "admin_token = \"${TEST_ADMIN_TOKEN}\"",
        &consumer_toml("payments", &provider, ""),
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    )
    .replace(
        "Bearer provider-secret-token",
        "Bearer ${TEST_PROVIDER_TOKEN}",
    );
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toml).unwrap();
    let log = dir.path().join("worker.log");
    // SAFETY of the test: the variables are read by the child process only.
    let admin = "adm-7f3c9e1d5b2a4c";
    let secret = "prov-a81d44c0e2";
    let child = std::process::Command::new(common::claimd_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .env("TEST_ADMIN_TOKEN", admin)
        .env("TEST_PROVIDER_TOKEN", secret)
        .env("CLAIMD_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let w = Worker::attach(child, port).await;
    let c = client();
    for route in ["/v1/claims", "/v1/report", "/v1/claims?stuck=true"] {
        let none = c.get(format!("{}{route}", w.base)).send().await.unwrap();
        assert_eq!(none.status().as_u16(), 401, "{route} without a token");
        let wrong = c
            .get(format!("{}{route}", w.base))
            .bearer_auth("adm-7f3c9e1d5X")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status().as_u16(), 401, "{route} with a wrong token");
        let right = c
            .get(format!("{}{route}", w.base))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap();
        assert_eq!(right.status().as_u16(), 200, "{route} with the token");
    }
    // Intake stays open (no intake_token configured).
    for i in 0..40 {
        let r = c
            .post(format!("{}/v1/messages/payments", w.base))
            .header("Idempotency-Key", format!("s{i}"))
            .body("{\"card\":\"pan-zq81-marker\"}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let cfg_s = cfg.to_str().unwrap();
    let mut outputs = Vec::new();
    for args in [
        vec!["report", "--config", cfg_s],
        vec!["report", "--format", "json", "--config", cfg_s],
        vec!["claims", "list", "--format", "json", "--config", cfg_s],
        vec!["claims", "show", "payments", "s1", "--config", cfg_s],
        vec![
            "claims", "show", "payments", "s1", "--format", "json", "--config", cfg_s,
        ],
    ] {
        let out = std::process::Command::new(common::claimd_bin())
            .args(&args)
            .env("TEST_ADMIN_TOKEN", admin)
            .env("TEST_PROVIDER_TOKEN", secret)
            .env("CLAIMD_LOG", "debug")
            .output()
            .unwrap();
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
        outputs.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    drop(w);
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.len() > 500, "the worker logged something");
    for text in outputs.iter().chain(std::iter::once(&logs)) {
        assert!(!text.contains(admin), "admin token leaked:\n{text}");
        assert!(!text.contains(secret), "provider secret leaked:\n{text}");
        assert!(
            !text.contains("pan-zq81-marker"),
            "payload body at info/debug leaked:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_work_and_a_restart_completes_the_rest_once() {
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(50),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = format!(
        "{}\n[run]\nshutdown_grace = \"5s\"\n",
        config_toml(
            &store.url(),
            &consumer_toml("payments", &provider, "concurrency = 16")
        )
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\"")
        )
    );
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toml).unwrap();
    let log = dir.path().join("w.log");
    let w = Worker::spawn(&cfg, port, &log).await;
    // Clients keep posting; SIGTERM lands in the middle.
    let base = w.base.clone();
    let poster = tokio::spawn(async move {
        let c = client();
        let mut accepted = Vec::new();
        for i in 0..400 {
            match c
                .post(format!("{base}/v1/messages/payments"))
                .header("Idempotency-Key", format!("g{i}"))
                .body("{}")
                .send()
                .await
            {
                Ok(r) if r.status().as_u16() == 202 => accepted.push(format!("g{i}")),
                _ => {}
            }
        }
        accepted
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t = Instant::now();
    let status = w.terminate();
    let took = t.elapsed();
    assert!(status.success(), "exit 0 after SIGTERM, got {status:?}");
    assert!(
        took < Duration::from_secs(6),
        "exits within the grace period ({took:?})"
    );
    let accepted = poster.await.unwrap();
    assert!(!accepted.is_empty());
    // Restart: the sweeper finishes whatever was left started.
    let _w2 = Worker::spawn(&cfg, port, &log).await;
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    assert!(
        eventually(Duration::from_secs(30), || async {
            let counts = s.counts(None).await.unwrap();
            counts[0].started == 0
        })
        .await
    );
    for key in &accepted {
        let claim = s
            .get("payments", "", key)
            .await
            .unwrap()
            .expect("every acknowledged message has a claim");
        assert_eq!(claim.state, ClaimState::Completed, "{key}");
    }
    let effects = sandbox.effects();
    assert_eq!(effects.len(), accepted.len());
    assert!(effects.iter().all(|e| e.applied == 1), "exactly once each");
}
