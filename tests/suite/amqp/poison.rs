//! Poison messages against a `claimd` process of its own (issue 24): headers nested up to the
//! deepest the broker's largest frame holds, ids that are not UTF-8, and dead letters the broker
//! never confirms. The process must stay up and HTTP-healthy; a crash would end only it, not
//! this test run.

use super::*;
use common::amqp_raw::{FRAME_MAX, Nesting, RawPublisher, deepest_that_fits, nested_headers};
use std::path::Path;

/// A `claimd run` process whose `payments` consumer reads `q` (its id from the header
/// `x-message-id` or the property), calling `provider`; its log goes to `<dir>/worker.log`.
async fn worker(q: &TestQueues, store: &TestStore, provider: &str, dir: &Path) -> Worker {
    let toml = config_toml(
        &store.url(),
        &q.consumer_toml(
            "payments",
            "message_id_header = \"x-message-id\"",
            &http_effect(provider),
        ),
    );
    ready_worker(&toml, dir, "worker").await
}

/// Still running, `/healthz` and `/readyz` answering 200.
async fn alive_and_ready(w: &mut Worker, log: &Path) {
    let exited = w.child.try_wait().unwrap();
    assert!(
        exited.is_none(),
        "claimd exited ({exited:?}); its log ends:\n{}",
        tail(log)
    );
    for path in ["/healthz", "/readyz"] {
        let r = client()
            .get(format!("{}{path}", w.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..]
        .iter()
        .map(|l| l.chars().take(400).collect::<String>() + "\n")
        .collect()
}

async fn metrics(w: &Worker) -> String {
    client()
        .get(format!("{}/metrics", w.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample `name{labels}` in a metrics text (0 when absent).
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nested_to_the_largest_frame_are_dead_lettered_and_the_worker_stays_up() {
    let Some(q) = TestQueues::new("poison").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut w = worker(&q, &store, &provider, dir.path()).await;

    // Depths from the issue, then the deepest the broker's largest frame holds (tables and,
    // 5 bytes a level, arrays): 100 and 1,000 levels did not crash before, 2,000 did.
    let id = |d: usize, s: Nesting| format!("poison-{s:?}-{d}");
    let mut cases: Vec<(usize, Nesting)> = [100, 1_000, 2_000, 5_000, 15_000]
        .into_iter()
        .map(|d| (d, Nesting::Tables))
        .collect();
    for shape in [Nesting::Tables, Nesting::Arrays] {
        // Ids of five digits: the deepest of both shapes has five.
        let len = id(10_000, shape).len();
        cases.push((deepest_that_fits(FRAME_MAX, len, shape), shape));
    }
    let queue = q.queue.clone();
    let (published, too_big) = tokio::task::spawn_blocking(move || {
        let mut p = RawPublisher::connect().expect("raw AMQP connection");
        for (d, shape) in &cases {
            let headers = nested_headers(*d, *shape);
            p.publish(&queue, id(*d, *shape).as_bytes(), Some(&headers), b"{}")
                .unwrap_or_else(|e| panic!("{shape:?} {d} levels not accepted: {e}"));
        }
        // One level more no longer fits: the broker refuses the frame, so nothing deeper can
        // reach claimd with RabbitMQ's default frame_max.
        let (d, shape) = cases[cases.len() - 1];
        let over = p.publish(
            &queue,
            id(d + 1, shape).as_bytes(),
            Some(&nested_headers(d + 1, shape)),
            b"{}",
        );
        (cases, over)
    })
    .await
    .unwrap();
    assert!(
        too_big.as_ref().is_err_and(|e| e.contains("FRAME_ERROR")),
        "{too_big:?}"
    );

    // A good message after them is performed.
    q.publish_json("good-after-poison", r#"{"amount":1}"#).await;
    let url = format!("{}/v1/messages/payments/good-after-poison", w.base);
    let done = eventually(Duration::from_secs(20), || {
        let url = url.clone();
        async move {
            let r = client().get(url).send().await;
            match r {
                Ok(r) if r.status() == 200 => r
                    .json::<serde_json::Value>()
                    .await
                    .is_ok_and(|v| v["state"] == "completed"),
                _ => false,
            }
        }
    })
    .await;
    alive_and_ready(&mut w, &log).await;
    assert!(done, "the good message after the poison was not completed");

    // Every poison message is in the dead-letter queue with its reason, the deep header left
    // out, its id kept; none is left in the work queue.
    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while dead.len() < published.len() && tokio::time::Instant::now() < end {
        dead.extend(q.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), published.len());
    for (d, shape) in &published {
        let want = id(*d, *shape);
        let m = dead
            .iter()
            .find(|m| {
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str())
                    == Some(want.as_str())
            })
            .unwrap_or_else(|| panic!("{want} not dead-lettered"));
        let reason = header(&m.delivery.properties, "claimd-reason").unwrap();
        assert!(
            reason.contains("deeper than 32 levels") && reason.contains("\"deep\""),
            "{want}: {reason}"
        );
        assert_eq!(header(&m.delivery.properties, "deep"), None, "{want}");
    }
    assert_eq!(q.ready(&q.queue).await, 0);
    let m = metrics(&w).await;
    assert_eq!(
        sample(
            &m,
            "claimd_dead_lettered_total{consumer=\"payments\",reason=\"headers_too_deep\"}"
        ),
        published.len() as f64,
        "{m}"
    );
    alive_and_ready(&mut w, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_utf8_are_dead_lettered_not_redelivered_for_ever() {
    let Some(q) = TestQueues::new("poison-utf8").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut w = worker(&q, &store, &provider, dir.path()).await;

    // RabbitMQ takes short strings as bytes; the decoder refused them, which closed the
    // connection, and the broker delivered the message again on the next one.
    let queue = q.queue.clone();
    tokio::task::spawn_blocking(move || {
        let mut p = RawPublisher::connect().expect("raw AMQP connection");
        // A header name that is not UTF-8, too.
        let mut headers = vec![2, 0xff, b'k', b'S'];
        headers.extend_from_slice(&1u32.to_be_bytes());
        headers.push(b'v');
        let mut table = (headers.len() as u32).to_be_bytes().to_vec();
        table.extend_from_slice(&headers);
        p.publish(&queue, b"id-\xff\xfe", Some(&table), b"{}")
            .unwrap();
    })
    .await
    .unwrap();
    q.publish_json("good-after-utf8", r#"{"amount":1}"#).await;

    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while dead.is_empty() && tokio::time::Instant::now() < end {
        dead.extend(q.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1);
    let reason = header(&dead[0].delivery.properties, "claimd-reason").unwrap();
    assert!(
        reason.contains("non-ASCII character at position 3"),
        "{reason}"
    );
    let sessions_ok = eventually(Duration::from_secs(10), || {
        let url = format!("{}/v1/messages/payments/good-after-utf8", w.base);
        async move {
            client()
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    })
    .await;
    assert!(sessions_ok, "the good message was not claimed");
    alive_and_ready(&mut w, &log).await;
    assert_eq!(q.ready(&q.queue).await, 0);
    // One session all along: the bad id did not cost a reconnection.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("lost the broker connection"),
        "{}",
        tail(&log)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_is_dead_lettered_with_the_readable_headers_kept() {
    let Some(q) = TestQueues::new("poison-name").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut w = worker(&q, &store, &provider, dir.path()).await;

    // A good id, a readable header and one whose name is not UTF-8: which header that was
    // meant to be is unknown (it may have been the tenant), so the message is set aside.
    let queue = q.queue.clone();
    tokio::task::spawn_blocking(move || {
        let mut entries = Vec::new();
        for (name, value) in [(&b"kept"[..], &b"yes"[..]), (b"\xffk", b"v")] {
            entries.push(name.len() as u8);
            entries.extend_from_slice(name);
            entries.push(b'S');
            entries.extend_from_slice(&(value.len() as u32).to_be_bytes());
            entries.extend_from_slice(value);
        }
        let mut table = (entries.len() as u32).to_be_bytes().to_vec();
        table.extend_from_slice(&entries);
        let mut p = RawPublisher::connect().expect("raw AMQP connection");
        p.publish(&queue, b"name-1", Some(&table), b"{}").unwrap();
    })
    .await
    .unwrap();
    q.publish_json("good-after-name", r#"{"amount":1}"#).await;

    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while dead.is_empty() && tokio::time::Instant::now() < end {
        dead.extend(q.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1);
    let props = &dead[0].delivery.properties;
    let reason = header(props, "claimd-reason").unwrap();
    assert!(
        reason.contains("cannot be read in full") && reason.contains("not UTF-8"),
        "{reason}"
    );
    assert_eq!(header(props, "kept").as_deref(), Some("yes"));
    assert_eq!(
        props.message_id().as_ref().map(|s| s.as_str()),
        Some("name-1")
    );
    let good = eventually(Duration::from_secs(10), || {
        let url = format!("{}/v1/messages/payments/good-after-name", w.base);
        async move {
            client()
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    })
    .await;
    assert!(good, "the good message was not claimed");
    let m = metrics(&w).await;
    assert_eq!(
        sample(
            &m,
            "claimd_dead_lettered_total{consumer=\"payments\",reason=\"unreadable_headers\"}"
        ),
        1.0,
        "{m}"
    );
    alive_and_ready(&mut w, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_never_confirmed_show_in_metrics_and_readiness_and_logs_stay_short() {
    let Some(q) = TestQueues::new("poison-noq").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut w = worker(&q, &store, &provider, dir.path()).await;

    // The dead-letter queue is deleted: every dead-letter publish comes back unroutable.
    let ch = q.conn.create_channel().await.unwrap();
    ch.queue_delete(
        q.dead().as_str().into(),
        lapin::options::QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    // A 100 KB message id in a header: refused (over 255), and its dead letter returned.
    let long_id = format!("long-{}", "k".repeat(100_000));
    let mut h = FieldTable::default();
    h.insert(
        "x-message-id".into(),
        AMQPValue::LongString(long_id.as_str().into()),
    );
    let payload = format!("{{\"secret\":\"payload-{}\"}}", fastrand::u32(..));
    q.publish(
        BasicProperties::default().with_headers(h),
        payload.as_bytes(),
    )
    .await;

    let counted = eventually(Duration::from_secs(15), || async {
        sample(
            &metrics(&w).await,
            "claimd_dead_letter_unconfirmed_total{consumer=\"payments\"}",
        ) >= 2.0
    })
    .await;
    assert!(counted, "{}", metrics(&w).await);
    let ready: serde_json::Value = get_json(&format!("{}/readyz", w.base)).await;
    let said = ready["dead_letters"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.starts_with("payments: ")
            && said.contains("not confirmed")
            && said.contains("no queue bound"),
        "{ready}"
    );
    // Readiness itself stays green: good messages and HTTP intake still work.
    assert_eq!(ready["ready"], true, "{ready}");
    alive_and_ready(&mut w, &log).await;

    // The log holds neither the payload nor the whole id; the id is cut, its length noted.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(&payload), "payload logged:\n{}", tail(&log));
    assert!(!text.contains(&long_id), "whole id logged:\n{}", tail(&log));
    assert!(
        text.contains("(100005 bytes in all)"),
        "no cut id:\n{}",
        tail(&log)
    );
    assert!(text.lines().all(|l| l.len() < 4096), "{}", tail(&log));

    // Once the queue is back, the message is dead-lettered and readiness says so.
    ch.queue_declare(
        q.dead().as_str().into(),
        lapin::options::QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        q.dead().as_str().into(),
        q.dlx.as_str().into(),
        "".into(),
        lapin::options::QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let recovered = eventually(Duration::from_secs(15), || async {
        get_json(&format!("{}/readyz", w.base)).await["dead_letters"] == "ok"
    })
    .await;
    assert!(recovered);
    let dead = q.take_dead().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].delivery.data, payload.as_bytes());
}
