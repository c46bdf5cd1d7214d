//! `/readyz` means "send me traffic" (issue 12): ready as soon as the port opens (the first
//! sweeper pass is not due yet), ready through a long sweeper pass against a failing provider
//! (the pass is reported as running, in the body and in `/metrics`), unready when the store is
//! down; the body carries the stuck count and the oldest started age (I8).

use crate::common;

use common::provider::{Script, TestProvider};
use common::proxy::Proxy;
use common::*;
use std::time::{Duration, Instant};

async fn readyz(c: &reqwest::Client, base: &str) -> (u16, serde_json::Value) {
    let r = c.get(format!("{base}/readyz")).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_within_a_second_of_the_port_opening_with_an_hourly_sweeper() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(Default::default()).await;
    // The first pass is an hour away: readiness must not wait for it.
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""))
        .replace("schedule = \"* * * * * *\"", "schedule = \"0 0 * * * *\"");
    let running = start(&toml).await;
    let opened = Instant::now();
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let mut last = (0, serde_json::Value::Null);
    while opened.elapsed() < Duration::from_secs(1) {
        last = readyz(&c, &base).await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = last;
    assert_eq!(status, 200, "ready within 1 s of the port opening: {body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["sweeper_health"]["status"], "starting", "{body}");
    assert_eq!(body["sweeper_health"]["healthy"], true, "{body}");
    assert_eq!(body["stuck"], 0, "{body}");
    assert!(body["oldest_started_age_s"].is_null(), "{body}");
    eprintln!("ready {:?} after the port opened", opened.elapsed());
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stays_ready_through_a_long_sweeper_pass_against_a_slow_provider() {
    let store = TestStore::sqlite();
    // A provider that takes 7 s to apply: a pass that takes claims over waits for them up to
    // one effect timeout (8 s), far past three schedule periods. (A provider that only fails
    // no longer makes long passes: its breaker opens and the sweeper leaves its claims alone.)
    let provider = TestProvider::start(Script {
        delay_before_apply_ms: 7_000,
        ..Default::default()
    })
    .await;
    // 1-second schedule, 20-second lease, 8-second effect timeout.
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml(
            "payments",
            &provider.url,
            "lease = \"20s\"\nmax_attempts = 50\nconcurrency = 4",
        )
        .replace("timeout = \"1s\"", "timeout = \"8s\""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    // Claims whose worker died: the sweeper takes them and calls the slow provider.
    let s = running.app().store.clone();
    for i in 0..4 {
        let id = format!("slow-{i}");
        s.claim(&orphan_claim("payments", "", &id, &id))
            .await
            .unwrap();
    }
    let observe = Instant::now();
    let mut longest_pass = 0.0f64;
    let mut probes = 0;
    let mut saw_metric = false;
    while observe.elapsed() < Duration::from_secs(45) {
        let (status, body) = readyz(&c, &base).await;
        probes += 1;
        assert_eq!(
            status, 200,
            "ready while the sweeper is busy against a slow provider: {body}"
        );
        if let Some(s) = body["sweeper_health"]["running_for_s"].as_f64() {
            longest_pass = longest_pass.max(s);
            assert_eq!(body["sweeper_health"]["healthy"], true, "{body}");
        }
        if longest_pass > 6.0 && !saw_metric {
            let m = c
                .get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            saw_metric = m.contains("claimd_sweeper_running 1");
            assert!(m.contains("claimd_sweeper_pass_running_seconds"), "{m}");
        }
        if longest_pass > 6.0 && saw_metric {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        longest_pass > 6.0,
        "the scenario needs a pass longer than 3 schedule periods (3 s); longest seen {longest_pass:.1}s"
    );
    assert!(saw_metric, "/metrics shows the running pass");
    let report: serde_json::Value = get_json(&format!("{base}/v1/report")).await;
    assert_eq!(report["sweeper"]["healthy"], true, "{report}");
    eprintln!("{probes} probes, all 200, through a sweeper pass of at least {longest_pass:.1}s");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_when_the_store_is_down_and_the_body_says_why() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let url = store
        .url()
        .replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let (_sb, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(
        &url,
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    assert_eq!(readyz(&c, &base).await.0, 200);
    proxy.down();
    let t = Instant::now();
    let mut body = serde_json::Value::Null;
    let mut red = false;
    while t.elapsed() < Duration::from_secs(10) {
        let (s, b) = readyz(&c, &base).await;
        body = b;
        if s == 503 {
            red = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(red, "unready within 10 s of the store going away: {body}");
    assert_eq!(body["ready"], false);
    assert_ne!(body["store"], "ok", "{body}");
    eprintln!("unready {:?} after the store went away", t.elapsed());
    proxy.up();
    assert!(
        eventually(Duration::from_secs(15), || {
            let c = c.clone();
            let base = base.clone();
            async move { readyz(&c, &base).await.0 == 200 }
        })
        .await,
        "ready again when the store is back"
    );
    running.shutdown(Duration::from_secs(2)).await;
}
