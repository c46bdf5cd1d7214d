//! `/metrics` during a run against a flaky provider: attempts by outcome, the stuck gauge
//! rising and falling back to 0 after the sweeper, and figures that match `report`.

use crate::common;

use claimd::provider::sandbox::SandboxOptions;
use common::*;
use std::time::Duration;

/// The value of a sample line `name{labels} value` whose name and labels contain `needles`.
fn sample(text: &str, needles: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_attempts_and_stuck_claims_that_match_the_report() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions {
        fail_rate: 0.2,
        ..Default::default()
    })
    .await;
    // A lease barely longer than the timeout: one 503 and the claimer hands off to the sweeper,
    // which runs every 3 seconds, so stuck claims are visible for a while.
    let consumer = consumer_toml(
        "payments",
        &provider,
        "lease = \"1100ms\"\nmax_attempts = 50",
    );
    let toml = config_toml(&store.url(), &consumer)
        .replace("schedule = \"* * * * * *\"", "schedule = \"*/3 * * * * *\"");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    for i in 0..200 {
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", format!("m{i}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let mut max_stuck = 0.0f64;
    let mut last = String::new();
    // Up to a minute: a claim that meets several 503s in a row waits a little longer each time
    // (0.5 s doubling to 10 s) and the sweeper comes every 3 s.
    for _ in 0..300 {
        last = c
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let stuck = sample(&last, &["claimd_stuck_claims", "payments"]).unwrap_or(0.0);
        max_stuck = max_stuck.max(stuck);
        let started = sample(&last, &["claimd_claims{", "state=\"started\""]).unwrap_or(1.0);
        if max_stuck > 0.0 && started == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        max_stuck > 0.0,
        "the stuck gauge should rise while 503s hand claims to the sweeper"
    );
    assert_eq!(
        sample(&last, &["claimd_stuck_claims", "payments"]),
        Some(0.0),
        "and fall back to 0:\n{last}"
    );
    assert_eq!(
        sample(&last, &["claimd_claims{", "state=\"started\""]),
        Some(0.0)
    );
    assert!(
        sample(
            &last,
            &[
                "claimd_effect_attempts_total",
                "outcome=\"not_applied\"",
                "status_class=\"5xx\""
            ]
        )
        .unwrap()
            > 0.0
    );
    let applied = sample(
        &last,
        &[
            "claimd_effect_attempts_total",
            "outcome=\"applied\"",
            "status_class=\"2xx\"",
        ],
    )
    .unwrap();
    assert!(applied >= 200.0, "{last}");
    assert!(sample(&last, &["claimd_sweeper_passes_total"]).unwrap() >= 1.0);
    assert!(sample(&last, &["claimd_effect_duration_seconds_count"]).unwrap() >= 200.0);
    assert!(!last.contains("m17"), "no message ids in labels");

    let report: serde_json::Value = get_json(&format!("{base}/v1/report")).await;
    let r = &report["consumers"][0];
    assert_eq!(
        sample(&last, &["claimd_claims_created_total", "payments"]).unwrap(),
        r["received"].as_f64().unwrap()
    );
    assert_eq!(r["completed"], 200);
    assert_eq!(r["stuck"], 0);
    let settled: f64 = sample(
        &last,
        &["claimd_claims_settled_total", "state=\"completed\""],
    )
    .unwrap();
    assert_eq!(settled, 200.0, "every completion was counted once");
    running.shutdown(Duration::from_secs(5)).await;
}
