//! `/metrics` as Prometheus reads it (issue 15): `promtool check metrics` accepts the default
//! answer, OpenMetrics is served only when asked for and with its own content type, every
//! consumer's labelled series exists at zero from start, and the shipped alerting rules
//! (docs/alerts.yml) and Grafana dashboard (docs/grafana-dashboard.json) name only metrics that
//! exist. promtool comes from the distribution's `prometheus` package (`.ci/run` installs it);
//! without it these tests fail under `CI=true` and skip with a reason elsewhere.

use crate::common;

use common::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

fn promtool() -> Option<&'static str> {
    if Command::new("promtool").arg("--version").output().is_ok() {
        return Some("promtool");
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "promtool is required under CI=true (Debian package `prometheus`; .ci/run installs it)"
        );
    }
    eprintln!("skipping: promtool not found (apt-get install prometheus)");
    None
}

/// Runs `promtool args...` with `stdin`, returning (exit code, stdout + stderr).
fn run_promtool(tool: &str, args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The metric names (`claimd_...`) an expression text mentions.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("claimd_") {
        let start = i + at;
        let end = start
            + text[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(text.len() - start);
        // Not part of a longer identifier (e.g. a label value such as uid "claimd").
        if start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            names.insert(text[start..end].to_string());
        }
        i = end;
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_the_shipped_rules_and_dashboard_name_real_series() {
    let Some(tool) = promtool() else { return };
    let (_store, _sandbox, running) = payments_worker("").await;
    let addr = running.http_addr;

    // Before any traffic: the default format, checked by promtool.
    let r = client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    let (code, said) = run_promtool(tool, &["check", "metrics"], &text);
    assert_eq!(code, 0, "promtool check metrics: {said}\n{text}");
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE claimd_messages_received_total counter"),
        "{text}"
    );
    for series in [
        "claimd_messages_received_total{consumer=\"payments\"} 0",
        "claimd_dead_lettered_total{consumer=\"payments\",reason=\"invalid_message_id\"} 0",
        "claimd_claims_settled_total{consumer=\"payments\",state=\"needs_attention\"} 0",
        "claimd_messages_refused_total{consumer=\"payments\",reason=\"busy\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing at start:\n{text}");
    }

    // A scraper that asks for OpenMetrics gets it, labelled as such.
    let r = client()
        .get(format!("http://{addr}/metrics"))
        .header(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .unwrap();
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{:?}",
        r.headers()
    );
    let om = r.text().await.unwrap();
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    assert!(
        om.contains("# TYPE claimd_messages_received counter"),
        "{om}"
    );

    // The rules file is valid, and it and the dashboard only name series /metrics has.
    let root = env!("CARGO_MANIFEST_DIR");
    let rules_path = format!("{root}/docs/alerts.yml");
    let (code, said) = run_promtool(tool, &["check", "rules", &rules_path], "");
    assert_eq!(code, 0, "promtool check rules: {said}");
    let series_of = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
            .collect()
    };
    let mut served = series_of(&text);
    // The store's storage series are PostgreSQL's only: a worker on PostgreSQL serves them.
    if let Some(pg) = TestStore::pg().await {
        let (_sb, provider) = sandbox(Default::default()).await;
        let on_pg = start(&config_toml(
            &pg.url(),
            &consumer_toml("payments", &provider, ""),
        ))
        .await;
        let pg_text = client()
            .get(format!("http://{}/metrics", on_pg.http_addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        served.extend(series_of(&pg_text));
        on_pg.shutdown(std::time::Duration::from_secs(2)).await;
    }
    for doc in ["docs/alerts.yml", "docs/grafana-dashboard.json"] {
        let body = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        let named = names_in(&body);
        assert!(!named.is_empty(), "{doc} names no claimd metric");
        let missing: Vec<_> = named.difference(&served).collect();
        assert!(
            missing.is_empty(),
            "{doc} names series /metrics does not serve: {missing:?}"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/docs/grafana-dashboard.json")).unwrap(),
    )
    .expect("the Grafana dashboard is JSON");
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 8));
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
