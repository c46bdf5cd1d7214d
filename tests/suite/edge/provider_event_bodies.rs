//! `POST /v1/provider-events/{consumer}` takes anyone's bytes before a signature can be
//! checked, so its bodies are held under a budget of their own (`[http]
//! provider_event_budget_bytes`) and a per-event cap (`provider_events.max_body_bytes`), and
//! what can be refused from the headers alone is refused before the body is read. A
//! `tolerance` that would outlive the recorded event ids is refused at load.

use crate::common::*;
use claimd::provider::provider_events::signature::sign_stripe;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "whsec_edge_provider_event_bodies";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MIB: u64 = 1024 * 1024;

/// A consumer taking intake and signed provider events; `events_extra` goes into its
/// `[consumers.provider_events]`.
fn events_consumer(name: &str, provider: &str, scheme: &str, events_extra: &str) -> String {
    let secret = if scheme == "stripe" {
        SECRET
    } else {
        STANDARD_SECRET
    };
    format!(
        r#"{}
[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
failed = ["failed"]
id_pointer = "/id"

[consumers.provider_events]
scheme = "{scheme}"
secrets = ["{secret}"]
key_pointer = "/metadata/key"
{events_extra}
"#,
        consumer_toml(name, provider, "")
    )
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Stripe-shaped event about an object claimd has no claim for, padded with spaces to
/// `len` bytes when `len` is larger.
fn event(id: &str, len: usize) -> Vec<u8> {
    let mut body = format!(
        r#"{{"id":"{id}","type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_{id}","status":"succeeded"}}}}}}"#
    )
    .into_bytes();
    body.resize(len.max(body.len()), b' ');
    body
}

/// A request head for `path` with these extra header lines.
fn head(path: &str, lines: &[String]) -> Vec<u8> {
    let mut h =
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n");
    for l in lines {
        h.push_str(l);
        h.push_str("\r\n");
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// Reads one answer (its head and what came with it) within `wait`; `None` when none came.
async fn answer(s: &mut TcpStream, wait: Duration) -> Option<String> {
    let mut buf = vec![0u8; 8192];
    let mut got = 0;
    let end = tokio::time::Instant::now() + wait;
    loop {
        let n = tokio::time::timeout_at(end, s.read(&mut buf[got..]))
            .await
            .ok()?
            .ok()?;
        got += n;
        let text = String::from_utf8_lossy(&buf[..got]).into_owned();
        let whole = text
            .split_once("\r\n\r\n")
            .is_some_and(|(_, body)| body.trim_end().ends_with('}'));
        if n == 0 || whole {
            return (!text.is_empty()).then_some(text);
        }
    }
}

/// Sends only `head` (no body byte) and returns the answer that comes within 5 s.
async fn answer_to_head(addr: std::net::SocketAddr, head: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    answer(&mut s, Duration::from_secs(5)).await
}

async fn metrics(base: &str) -> String {
    client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A genuine event, signed now: taken (`200`, an object claimd has no claim for).
async fn post_signed(base: &str, consumer: &str, body: Vec<u8>) -> (u16, String) {
    let r = client()
        .post(format!("{base}/v1/provider-events/{consumer}"))
        .header("Stripe-Signature", sign_stripe(SECRET, now(), &body))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: cargo test --features full --test suite -- --ignored"]
async fn nine_hundred_held_event_bodies_stay_within_the_provider_event_budget() {
    const CONNECTIONS: usize = 900;
    const DECLARED: usize = 1_048_575;
    let budget = 4 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let port = free_port();
    let config = dir.path().join("claimd.toml");
    // The event cap raised to 1 MiB so that the budget, not the cap, is what holds.
    std::fs::write(
        &config,
        config_toml_with(
            &format!("sqlite://{}", dir.path().join("claims.db").display()),
            &format!("max_connections = 1024\nprovider_event_budget_bytes = {budget}"),
            &events_consumer("cards", &provider, "stripe", "max_body_bytes = 1048576"),
        )
        .replace("127.0.0.1:0", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let worker = Worker::spawn(&config, port, &dir.path().join("claimd.log")).await;
    let pid = worker.child.id();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (rss_before, _) = rss_kib(pid);

    // Each connection: a well-formed signature (for another secret), 1 MiB - 1 declared, all
    // but the last byte sent as fast as claimd takes it, then held.
    let forged = format!("Stripe-Signature: t={},v1={}", now(), "ab".repeat(32));
    let request_head = Arc::new(head(
        "/v1/provider-events/cards",
        &[forged, format!("Content-Length: {DECLARED}")],
    ));
    let body: Arc<[u8]> = vec![b' '; DECLARED - 1].into();
    let answers: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let peak_sampled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = peak_sampled.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid).0, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let (request_head, body, answers) = (request_head.clone(), body.clone(), answers.clone());
        clients.push(tokio::spawn(async move {
            let Ok(s) = TcpStream::connect(addr).await else {
                *answers
                    .lock()
                    .unwrap()
                    .entry("connect failed".into())
                    .or_default() += 1;
                return;
            };
            let (mut rd, mut wr) = s.into_split();
            let send = async {
                wr.write_all(&request_head).await?;
                wr.write_all(&body).await?;
                std::future::pending::<std::io::Result<()>>().await
            };
            let read = async {
                let mut buf = [0u8; 16];
                let n = rd.read(&mut buf).await.unwrap_or(0);
                String::from_utf8_lossy(&buf[..n.min(12)]).into_owned()
            };
            let outcome = tokio::select! {
                status = read => if status.is_empty() { "closed".into() } else { status },
                sent = send => format!("write failed: {:?}", sent.err().map(|e| e.kind())),
            };
            *answers.lock().unwrap().entry(outcome).or_default() += 1;
            // Held open until the test ends the load.
            std::future::pending::<()>().await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (_, hwm_loaded) = rss_kib(pid);
    let answered: usize = answers.lock().unwrap().values().sum();
    for c in &clients {
        c.abort();
    }
    for c in clients {
        let _ = c.await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sampler.abort();
    let (rss_after, hwm) = rss_kib(pid);
    let peak = hwm
        .max(hwm_loaded)
        .max(peak_sampled.load(std::sync::atomic::Ordering::Relaxed));

    // Afterwards a genuine event is taken as ever.
    let base = format!("http://{addr}");
    let (status, text) = post_signed(&base, "cards", event("evt_after_flood", 0)).await;
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    eprintln!(
        "provider-event flood against claimd (pid {pid}), {:.0} s of load",
        started.elapsed().as_secs_f64()
    );
    eprintln!("{:<44} {:>16}", "figure", "value");
    for (k, v) in [
        ("connections".to_string(), CONNECTIONS.to_string()),
        ("body bytes declared each".into(), DECLARED.to_string()),
        (
            "body bytes sent each (then held)".into(),
            (DECLARED - 1).to_string(),
        ),
        ("provider_event_budget_bytes".into(), mib(budget / 1024)),
        ("claimd RSS before".into(), mib(rss_before)),
        ("claimd peak RSS (VmHWM)".into(), mib(peak)),
        (
            "claimd RSS 3 s after the clients left".into(),
            mib(rss_after),
        ),
        (
            "connections answered during the load".into(),
            answered.to_string(),
        ),
    ] {
        eprintln!("{k:<44} {v:>16}");
    }
    for (outcome, n) in answers.lock().unwrap().iter() {
        eprintln!("{:<44} {n:>16}", format!("  answer {outcome:?}"));
    }
    let bound = (budget + 64 * MIB) / 1024;
    assert!(
        peak <= bound,
        "claimd's peak RSS {} is over the budget + 64 MiB ({})",
        mib(peak),
        mib(bound)
    );
    assert!(
        rss_after <= bound,
        "claimd's RSS after {} is over the budget + 64 MiB",
        mib(rss_after)
    );
    assert!(
        answers.lock().unwrap().keys().any(|k| k.contains("503")),
        "a spent budget answers 503: {:?}",
        answers.lock().unwrap()
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("unknown_object"), "{text}");
    let m = metrics(&base).await;
    assert!(
        m.contains(r#"claimd_provider_events_total{consumer="cards",reason="body_budget"}"#),
        "{m}"
    );
    worker.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_headers_refuse_is_refused_before_the_body_is_read() {
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let consumers = format!(
        "{}{}{}",
        events_consumer("cards", &provider, "stripe", ""),
        events_consumer("webhooks", &provider, "standard", ""),
        consumer_toml("plain", &provider, "")
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let addr = running.http_addr;
    let length = "Content-Length: 1048575".to_string();
    let sig = format!("Stripe-Signature: t={},v1={}", now(), "ab".repeat(32));

    // Nothing but the head is sent: each answer comes while the client still owes the body.
    let cases: Vec<(&str, Vec<String>, &str, &[&str])> = vec![
        (
            "/v1/provider-events/cards",
            vec![length.clone()],
            "HTTP/1.1 401",
            &["no stripe-signature header", "the body was not read"],
        ),
        (
            "/v1/provider-events/cards",
            vec![length.clone(), "Stripe-Signature: t=soon,v1=ab".into()],
            "HTTP/1.1 400",
            &["stripe-signature t= is not whole Unix seconds"],
        ),
        (
            "/v1/provider-events/cards",
            vec![length.clone(), "Stripe-Signature: t=1,v1=not-hex".into()],
            "HTTP/1.1 400",
            &["stripe-signature entry 2 (v1) is not hex"],
        ),
        (
            "/v1/provider-events/webhooks",
            vec![length.clone(), "webhook-timestamp: 1".into()],
            "HTTP/1.1 401",
            &["no webhook-id header"],
        ),
        (
            "/v1/provider-events/nobody",
            vec![length.clone(), sig.clone()],
            "HTTP/1.1 404",
            &["no consumer named \\\"nobody\\\""],
        ),
        (
            "/v1/provider-events/plain",
            vec![length.clone(), sig.clone()],
            "HTTP/1.1 404",
            &["consumer plain takes no provider events"],
        ),
        (
            "/v1/provider-events/cards",
            vec!["Content-Length: 300000".into(), sig.clone()],
            "HTTP/1.1 413",
            &["262144 bytes", "provider_events.max_body_bytes"],
        ),
    ];
    for (path, lines, status, says) in cases {
        let got = answer_to_head(addr, &head(path, &lines))
            .await
            .unwrap_or_else(|| panic!("{path} {lines:?}: no answer before the body was sent"));
        assert!(got.starts_with(status), "{path} {lines:?}: {got}");
        assert!(
            got.to_ascii_lowercase().contains("connection: close"),
            "{got}"
        );
        for s in says {
            assert!(got.contains(s), "{path} {lines:?}: {s:?} not in {got}");
        }
    }
    let m = metrics(&format!("http://{addr}")).await;
    for line in [
        r#"claimd_provider_events_total{consumer="cards",reason="unsigned"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="malformed"} 2"#,
        r#"claimd_provider_events_total{consumer="webhooks",reason="unsigned"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="too_large"} 1"#,
    ] {
        assert!(m.contains(line), "{line} not in\n{m}");
    }
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_413_a_spent_budget_503_intake_unaffected_and_signed_events_still_taken() {
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let budget = 256 * 1024;
    let running = start(&config_toml_with(
        &store.url(),
        &format!("provider_event_budget_bytes = {budget}\nintake_wait = \"300ms\""),
        &events_consumer("cards", &provider, "stripe", ""),
    ))
    .await;
    let addr = running.http_addr;
    let base = format!("http://{addr}");

    // Over the 256 KiB cap: declared, refused before reading; chunked, refused at the cap.
    let sig = format!("Stripe-Signature: t={},v1={}", now(), "ab".repeat(32));
    let got = answer_to_head(
        addr,
        &head(
            "/v1/provider-events/cards",
            &[sig.clone(), format!("Content-Length: {}", budget + 1)],
        ),
    )
    .await
    .expect("an answer before the body");
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(
        got.contains("262144 bytes") && got.contains("provider_events.max_body_bytes"),
        "{got}"
    );
    let mut chunked = TcpStream::connect(addr).await.unwrap();
    chunked
        .write_all(&head(
            "/v1/provider-events/cards",
            &[sig.clone(), "Transfer-Encoding: chunked".into()],
        ))
        .await
        .unwrap();
    // One byte over the cap in all, and no more: claimd reads every byte sent before it
    // answers, so the answer is not lost to a reset.
    for size in [65_536, 65_536, 65_536, 65_536, 1] {
        let chunk = [
            format!("{size:x}\r\n").into_bytes(),
            vec![b' '; size],
            b"\r\n".to_vec(),
        ]
        .concat();
        chunked.write_all(&chunk).await.unwrap();
    }
    let got = answer(&mut chunked, Duration::from_secs(5)).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");

    // A genuine event of exactly the budget, all but its last byte sent: it holds the budget.
    let held = event("evt_held", budget);
    let mut holder = TcpStream::connect(addr).await.unwrap();
    holder
        .write_all(&head(
            "/v1/provider-events/cards",
            &[
                format!("Stripe-Signature: {}", sign_stripe(SECRET, now(), &held)),
                format!("Content-Length: {}", held.len()),
            ],
        ))
        .await
        .unwrap();
    holder.write_all(&held[..held.len() - 1]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another event meanwhile: 503 + Retry-After before its body is read.
    let got = answer_to_head(
        addr,
        &head(
            "/v1/provider-events/cards",
            &[sig.clone(), "Content-Length: 1000".into()],
        ),
    )
    .await
    .expect("an answer before the body");
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.to_ascii_lowercase().contains("retry-after: 1"), "{got}");
    assert!(got.contains("provider_event_budget_bytes"), "{got}");

    // Intake has its own budget: a message is taken while event bodies fill theirs.
    let r = client()
        .post(format!("{base}/v1/messages/cards"))
        .header("Idempotency-Key", "during-the-hold")
        .header("Content-Type", "application/json")
        .body(format!(
            r#"{{"status":"succeeded","pad":"{}"}}"#,
            " ".repeat(600_000)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);

    // The holder finishes: its event is taken, and the budget is free again.
    holder.write_all(&held[held.len() - 1..]).await.unwrap();
    let got = answer(&mut holder, Duration::from_secs(10)).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("unknown_object"), "{got}");
    let (status, text) = post_signed(&base, "cards", event("evt_after", 100_000)).await;
    assert_eq!(status, 200, "{text}");

    let m = metrics(&base).await;
    for line in [
        r#"claimd_provider_events_total{consumer="cards",reason="body_budget"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="too_large"} 2"#,
        r#"claimd_provider_events_total{consumer="cards",reason="unknown_object"} 2"#,
    ] {
        assert!(m.contains(line), "{line} not in\n{m}");
    }
    running.shutdown(Duration::from_secs(2)).await;
}

/// `claimd run` with `toml`: its exit code and stderr, or a panic if it is still running
/// after 20 s (it started).
fn run_refused(toml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claimd.toml");
    std::fs::write(&path, toml).unwrap();
    let mut child = std::process::Command::new(claimd_bin())
        .args(["run", "--config"])
        .arg(&path)
        .env("CLAIMD_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("claimd run started with:\n{toml}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_tolerance_that_outlives_recorded_event_ids_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    let with = |http: &str, events: &str| {
        config_toml_with(
            &store,
            http,
            &events_consumer("cards", "http://127.0.0.1:9", "stripe", events),
        )
    };

    let (code, err) = run_refused(&with("", "tolerance = \"36500d\""));
    assert_eq!(code, 2, "{err}");
    for s in [
        "consumers[0].provider_events.tolerance",
        "36500d",
        "bound of 1h",
    ] {
        assert!(err.contains(s), "{s:?} not in {err}");
    }

    // Within the bound but not within half the retention (2h here): both settings named.
    let (code, err) = run_refused(&with("", "tolerance = \"1h\""));
    assert_eq!(code, 2, "{err}");
    for s in [
        "consumers[0].provider_events.tolerance",
        "retention.keep_terminal_for (2h)",
        "more than twice",
    ] {
        assert!(err.contains(s), "{s:?} not in {err}");
    }

    // A budget that could never admit the largest event.
    let (code, err) = run_refused(&with(
        "provider_event_budget_bytes = 100000",
        "max_body_bytes = 200000",
    ));
    assert_eq!(code, 2, "{err}");
    for s in [
        "http.provider_event_budget_bytes",
        "100000",
        "consumers[0].provider_events.max_body_bytes 200000",
    ] {
        assert!(err.contains(s), "{s:?} not in {err}");
    }

    // What fits is taken.
    let fits = claimd::config::Config::from_toml(
        &with("", "tolerance = \"30m\""),
        std::path::Path::new("ok.toml"),
        std::iter::empty(),
    );
    assert!(fits.is_ok(), "{:?}", fits.err());
}
