//! RabbitMQ intake against the real broker on 127.0.0.1:5672: competing workers and redelivered
//! copies (each key applied once), every kind of bad message dead-lettered with a readable
//! reason, a store outage (nack and requeue: nothing lost, nothing doubled), a broker-side
//! connection close (reconnect without loss), and email end to end into a real SMTP sink.
//!
//! Each test uses queues with a random suffix and deletes them. Without a broker the tests
//! print `SKIPPED: ...`; under `CI=true` they fail.

mod common;

use claimd::claim::ClaimState;
use claimd::sandbox::SandboxOptions;
use claimd::store::{ClaimFilter, ConsumerCounts, Store};
use common::amqp::{TestQueues, close_connections_named, header};
use common::smtp::SmtpSink;
use common::*;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::HashMap;
use std::time::Duration;

fn http_effect(provider: &str) -> String {
    format!(
        r#"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

fn smtp_effect(sink: &SmtpSink) -> String {
    format!(
        r#"
[consumers.effect]
kind = "smtp"
host = "127.0.0.1"
port = {port}
message_id_domain = "test.claimd"
from = "claimd <noreply@test.claimd>"
timeout = "1s"
"#,
        port = sink.addr.port()
    )
}

async fn claims_in(
    store: &Store,
    consumer: &str,
    state: Option<ClaimState>,
) -> Vec<claimd::claim::Claim> {
    store
        .list(&ClaimFilter {
            consumer: Some(consumer.to_string()),
            state,
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
}

async fn counts_of(store: &Store, consumer: &str) -> ConsumerCounts {
    store
        .counts(None)
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.consumer == consumer)
        .unwrap_or_default()
}

async fn wait_connected(running: &claimd::run::Running) {
    let ok = eventually(Duration::from_secs(15), || async {
        running.amqp.connected()
    })
    .await;
    assert!(
        ok,
        "AMQP consumers did not connect: {:?}",
        running
            .amqp
            .consumers()
            .iter()
            .map(|s| (s.name().to_string(), s.last_error()))
            .collect::<Vec<_>>()
    );
}

/// A worker on a fresh PostgreSQL database whose `payments` consumer reads fresh queues and
/// calls the sandbox, connected. `None` (skipped) outside CI without a broker or a database.
async fn payments_on_postgres(
    prefix: &str,
) -> Option<(
    TestQueues,
    TestStore,
    claimd::sandbox::Sandbox,
    claimd::run::Running,
)> {
    let q = TestQueues::new(prefix).await?;
    let store = TestStore::pg().await?;
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    Some((q, store, sandbox, running))
}

/// Renames a table of the store's database, as an administrator would (the store's statements
/// on it fail until it is renamed back).
async fn rename_table(store: &TestStore, from: &str, to: &str) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {from} RENAME TO {to}"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_apply_each_message_once_despite_redelivered_copies() {
    const N: usize = 500;
    const COPIES: usize = N / 5;
    const BAD: usize = 5;
    let Some(q) = TestQueues::new("e2e").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    );
    let w1 = start(&toml).await;
    let w2 = start(&toml).await;
    wait_connected(&w1).await;
    wait_connected(&w2).await;

    let mut ids: Vec<String> = (0..N).map(|i| format!("pay-{i}")).collect();
    for i in 0..COPIES {
        ids.push(format!("pay-{}", (i * 5) % N));
    }
    fastrand::shuffle(&mut ids);
    for (n, id) in ids.iter().enumerate() {
        q.publish_json(id, &format!("{{\"order\":\"{id}\",\"amount\":100}}"))
            .await;
        if n % 120 == 0 {
            // Bad input among good: no message id at all.
            q.publish(
                BasicProperties::default().with_content_type("application/json".into()),
                format!("{{\"bad\":{n}}}").as_bytes(),
            )
            .await;
        }
    }

    let st = w1.app().store.clone();
    let done = eventually(Duration::from_secs(40), || {
        let st = st.clone();
        async move {
            claims_in(&st, "payments", Some(ClaimState::Completed))
                .await
                .len()
                == N
        }
    })
    .await;
    let effects = sandbox.effects();
    assert!(
        done,
        "completed {} of {N}; sandbox applied {}",
        claims_in(&st, "payments", Some(ClaimState::Completed))
            .await
            .len(),
        effects.len()
    );
    assert_eq!(effects.len(), N, "every key reached the provider");
    assert!(
        effects.iter().all(|e| e.applied == 1),
        "a key was applied twice: {:?}",
        effects
            .iter()
            .filter(|e| e.applied != 1)
            .collect::<Vec<_>>()
    );
    assert_eq!(claims_in(&st, "payments", None).await.len(), N);

    // Every copy was acknowledged as a duplicate: nothing is left ready or unacknowledged
    // (a graceful stop returns unacknowledged messages to the queue).
    let drained = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        let q = &q;
        async move {
            counts_of(&st, "payments").await.duplicates == COPIES as i64
                && q.ready(&q.queue).await == 0
        }
    })
    .await;
    assert!(
        drained,
        "work queue not drained: {:?}",
        counts_of(&st, "payments").await
    );
    w1.shutdown(Duration::from_secs(5)).await;
    w2.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        q.ready(&q.queue).await,
        0,
        "messages returned to the queue at stop"
    );

    let counts = counts_of(&st, "payments").await;
    assert_eq!(counts.duplicates, COPIES as i64, "{counts:?}");
    assert_eq!(counts.received, (N + COPIES) as i64, "{counts:?}");
    assert_eq!(counts.dead_lettered, BAD as i64, "{counts:?}");

    let dead = q.take_dead().await;
    assert_eq!(dead.len(), BAD, "only the messages without an id are dead");
    for m in &dead {
        let body = String::from_utf8_lossy(&m.delivery.data);
        assert!(body.starts_with("{\"bad\":"), "{body}");
        let reason = header(&m.delivery.properties, "claimd-reason").unwrap();
        assert!(reason.contains("has no message id"), "{reason}");
    }
    q.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_kind_of_bad_message_is_dead_lettered_with_a_reason() {
    let Some(pay) = TestQueues::new("bad-pay").await else {
        return;
    };
    let Some(mail) = TestQueues::new("bad-mail").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let sink = SmtpSink::start().await;
    let consumers = format!(
        "{}{}",
        pay.consumer_toml(
            "payments",
            "message_id_header = \"x-message-id\"",
            &http_effect(&provider)
        ),
        mail.consumer_toml("email", "on_unknown = \"park\"", &smtp_effect(&sink)),
    );
    let running = start(&config_toml_with(
        &store.url(),
        "max_body_bytes = 1024",
        &consumers,
    ))
    .await;
    wait_connected(&running).await;

    // A first, good message that the changed payload will collide with.
    pay.publish_json("same-1", r#"{"case":"original"}"#).await;
    let st = running.app().store.clone();
    let claimed = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        async move {
            st.get("payments", "", "same-1")
                .await
                .unwrap()
                .is_some_and(|c| c.state == ClaimState::Completed)
        }
    })
    .await;
    assert!(claimed);

    let traced = |props: BasicProperties| {
        let mut h = FieldTable::default();
        h.insert("x-trace".into(), AMQPValue::LongString("trace-7".into()));
        props
            .with_content_type("application/json".into())
            .with_headers(h)
    };
    let with_header_id = |id: String| {
        let mut h = FieldTable::default();
        h.insert("x-trace".into(), AMQPValue::LongString("trace-7".into()));
        h.insert("x-message-id".into(), AMQPValue::LongString(id.into()));
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_headers(h)
    };
    // (queue, properties, body, expected words in claimd-reason)
    let big = format!("{{\"case\":\"big\",\"pad\":\"{}\"}}", "x".repeat(2048));
    let cases: Vec<(&TestQueues, BasicProperties, String, &str)> = vec![
        (
            &pay,
            traced(BasicProperties::default()),
            r#"{"case":"no-id"}"#.into(),
            "has no message id",
        ),
        (
            &pay,
            with_header_id("k".repeat(300)),
            r#"{"case":"long-id"}"#.into(),
            "300 characters long; the limit is 255",
        ),
        (
            &pay,
            traced(BasicProperties::default().with_message_id("a b".into())),
            r#"{"case":"space"}"#.into(),
            "space, control or non-ASCII character at position 1",
        ),
        (
            &pay,
            traced(BasicProperties::default().with_message_id("a\u{1}b".into())),
            r#"{"case":"control"}"#.into(),
            "space, control or non-ASCII character at position 1",
        ),
        (
            &pay,
            traced(BasicProperties::default().with_message_id("big-1".into())),
            big.clone(),
            "over the limit of 1024 bytes",
        ),
        (
            &pay,
            traced(BasicProperties::default().with_message_id("same-1".into())),
            r#"{"case":"changed"}"#.into(),
            "already used with a different payload",
        ),
        // Content types that could never be sent on (issue 11.5): once requeued forever, or
        // stored and then refused by the HTTP client as an "unknown outcome".
        (
            &pay,
            BasicProperties::default()
                .with_message_id("ct-nul".into())
                .with_content_type("application/json\u{0}".into()),
            r#"{"case":"ct-nul"}"#.into(),
            "content_type property cannot be used",
        ),
        (
            &pay,
            BasicProperties::default()
                .with_message_id("ct-bell".into())
                .with_content_type("text/plain\u{7}".into()),
            r#"{"case":"ct-bell"}"#.into(),
            "not printable ASCII",
        ),
        // An id the contract accepts whose rendered key the provider would refuse (issue 11.4).
        (
            &pay,
            with_header_id("k".repeat(250)),
            r#"{"case":"long-key"}"#.into(),
            "the provider's limit is 255",
        ),
        (
            &mail,
            traced(BasicProperties::default().with_message_id("mail-1".into())),
            r#"{"from":"a@example.test","subject":"no recipient","text":"hi"}"#.into(),
            "no recipient",
        ),
        (
            &mail,
            BasicProperties::default()
                .with_message_id("mail-2".into())
                .with_content_type("text/plain".into()),
            "plain words, not JSON".into(),
            "must be JSON",
        ),
    ];
    for (q, props, body, _) in &cases {
        q.publish(props.clone(), body.as_bytes()).await;
    }

    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while dead.len() < cases.len() && tokio::time::Instant::now() < end {
        dead.extend(pay.take_dead().await);
        dead.extend(mail.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got_all = dead.len() >= cases.len();
    assert!(got_all, "dead-lettered {} of {}", dead.len(), cases.len());
    assert_eq!(dead.len(), cases.len());
    for (_, props, body, needle) in &cases {
        let m = dead
            .iter()
            .find(|m| m.delivery.data == body.as_bytes())
            .unwrap_or_else(|| panic!("no dead letter for {needle:?}"));
        let p = &m.delivery.properties;
        let reason = header(p, "claimd-reason").expect("claimd-reason header");
        assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
        // Body and properties unchanged, plus the reason.
        assert_eq!(p.message_id(), props.message_id(), "{needle}");
        assert_eq!(p.content_type(), props.content_type(), "{needle}");
        if header(props, "x-trace").is_some() {
            assert_eq!(header(p, "x-trace").as_deref(), Some("trace-7"), "{needle}");
        }
    }

    // Nothing refused was claimed or performed; the work queues are empty.
    assert_eq!(claims_in(&st, "payments", None).await.len(), 1);
    assert!(claims_in(&st, "email", None).await.is_empty());
    assert_eq!(sandbox.effects().len(), 1);
    assert!(sink.received().is_empty());
    assert_eq!(pay.ready(&pay.queue).await, 0);
    assert_eq!(mail.ready(&mail.queue).await, 0);

    // Counted per consumer and reason, in memory and in the store (report's dead_lettered),
    // right after the original is acknowledged.
    let counted = eventually(Duration::from_secs(5), || {
        let st = st.clone();
        async move {
            counts_of(&st, "payments").await.dead_lettered == 9
                && counts_of(&st, "email").await.dead_lettered == 2
        }
    })
    .await;
    assert!(counted);
    let pc = counts_of(&st, "payments").await;
    assert_eq!(pc.dead_lettered, 9, "{pc:?}");
    assert_eq!(pc.payload_mismatches, 1, "{pc:?}");
    assert_eq!(counts_of(&st, "email").await.dead_lettered, 2);
    let by_reason = running.amqp.consumer("payments").unwrap().dead_lettered();
    let n = |r: claimd::intake::amqp::DeadLetterReason| by_reason.get(&r).copied().unwrap_or(0);
    use claimd::intake::amqp::DeadLetterReason as R;
    assert_eq!(n(R::MissingMessageId), 1);
    assert_eq!(n(R::InvalidMessageId), 3);
    assert_eq!(n(R::BodyTooLarge), 1);
    assert_eq!(n(R::PayloadMismatch), 1);
    assert_eq!(n(R::InvalidContentType), 2);
    assert_eq!(n(R::KeyTooLong), 1);
    let report = claimd::report::render_csv(
        &claimd::report::build(
            &st,
            &["payments".into()],
            None,
            claimd::report::Window::All,
            Duration::from_secs(1),
        )
        .await
        .unwrap(),
    );
    assert!(report.contains(",dead_lettered,"), "{report}");

    running.shutdown(Duration::from_secs(5)).await;
    pay.delete().await;
    mail.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_requeues_and_loses_nothing() {
    let Some((q, store, sandbox, running)) = payments_on_postgres("outage").await else {
        return;
    };
    for i in 0..10 {
        q.publish_json(&format!("before-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    let st = running.app().store.clone();
    let done = |n: usize| {
        let st = st.clone();
        move || {
            let st = st.clone();
            async move {
                claims_in(&st, "payments", Some(ClaimState::Completed))
                    .await
                    .len()
                    == n
            }
        }
    };
    assert!(eventually(Duration::from_secs(10), done(10)).await);

    // The store fails every claim: the claims table is renamed by an administrator.
    rename_table(&store, "claims", "claims_offline").await;
    for i in 0..20 {
        q.publish_json(&format!("during-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Nothing was claimed, performed or dead-lettered meanwhile: the messages wait in the broker.
    assert_eq!(sandbox.effects().len(), 10);
    assert!(
        q.take_dead().await.is_empty(),
        "a store outage is not bad input"
    );
    rename_table(&store, "claims_offline", "claims").await;

    assert!(
        eventually(Duration::from_secs(20), done(30)).await,
        "not every message was claimed after the store came back"
    );
    let effects = sandbox.effects();
    assert_eq!(effects.len(), 30);
    assert!(effects.iter().all(|e| e.applied == 1));
    assert!(
        eventually(Duration::from_secs(10), || async {
            q.ready(&q.queue).await == 0
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(q.ready(&q.queue).await, 0);
    assert!(q.take_dead().await.is_empty());
    assert_eq!(counts_of(&st, "payments").await.dead_lettered, 0);
    q.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_side_close_reconnects_without_loss_or_double_claims() {
    const N: usize = 300;
    let Some(q) = TestQueues::new("reconnect").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    if close_connections_named("no-such-connection-name").is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("rabbitmqctl is required under CI=true");
        }
        eprintln!("SKIPPED: rabbitmqctl is not usable here");
        return;
    }
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(20),
        ..Default::default()
    })
    .await;
    let instance = format!("amqp-reconnect-{:08x}", fastrand::u32(..));
    let toml = format!(
        "{}\n[run]\ninstance = \"{instance}\"\n",
        config_toml(
            &store.url(),
            &q.consumer_toml(
                "payments",
                "concurrency = 8\nprefetch = 16",
                &http_effect(&provider)
            ),
        )
    );
    let running = start(&toml).await;
    wait_connected(&running).await;
    for i in 0..N {
        q.publish_json(&format!("rc-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sandbox.effects().len() >= 40
        })
        .await
    );
    let closed = tokio::task::spawn_blocking(move || close_connections_named(&instance))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed, 1, "the worker's one connection");
    let state = running.amqp.consumer("payments").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(20), || async {
            state.sessions() >= 2 && state.connected()
        })
        .await,
        "did not reconnect: {:?}",
        state.last_error()
    );
    let st = running.app().store.clone();
    let done = eventually(Duration::from_secs(30), || {
        let st = st.clone();
        async move {
            claims_in(&st, "payments", Some(ClaimState::Completed))
                .await
                .len()
                == N
        }
    })
    .await;
    assert!(done, "not every message completed after the reconnect");
    let effects = sandbox.effects();
    assert_eq!(effects.len(), N);
    assert!(effects.iter().all(|e| e.applied == 1));
    assert!(
        eventually(Duration::from_secs(10), || async {
            q.ready(&q.queue).await == 0
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(q.ready(&q.queue).await, 0);
    assert!(q.take_dead().await.is_empty());
    q.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emails_from_the_broker_are_sent_once_with_the_key_as_message_id() {
    const N: usize = 20;
    let Some(q) = TestQueues::new("email").await else {
        return;
    };
    let store = TestStore::sqlite();
    let sink = SmtpSink::start().await;
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml(
            "email",
            "on_unknown = \"park\"\nkey = \"{message_id}\"",
            &smtp_effect(&sink),
        ),
    ))
    .await;
    wait_connected(&running).await;
    let body = |i: usize| {
        format!(
            r#"{{"to":["user{i}@example.test"],"subject":"Receipt {i}","text":"Thanks for order {i}."}}"#
        )
    };
    for i in 0..N {
        q.publish_json(&format!("mail-{i}"), &body(i)).await;
    }
    for i in (0..N).step_by(5) {
        // Redelivered copies: same id, same payload.
        q.publish_json(&format!("mail-{i}"), &body(i)).await;
    }
    let st = running.app().store.clone();
    let done = eventually(Duration::from_secs(20), || {
        let st = st.clone();
        async move {
            claims_in(&st, "email", Some(ClaimState::Completed))
                .await
                .len()
                == N
        }
    })
    .await;
    assert!(done, "sink has {} messages", sink.received().len());
    let received = sink.received();
    assert_eq!(received.len(), N, "one mail per key");
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for r in &received {
        *by_id
            .entry(r.message_id.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for i in 0..N {
        assert_eq!(
            by_id.get(&format!("<mail-{i}@test.claimd>")),
            Some(&1),
            "{by_id:?}"
        );
        let r = received
            .iter()
            .find(|r| r.rcpt_to == vec![format!("user{i}@example.test")])
            .unwrap();
        assert_eq!(r.mail_from, "noreply@test.claimd");
        assert!(
            r.data.contains(&format!("Subject: Receipt {i}")),
            "{}",
            r.data
        );
    }
    for c in claims_in(&st, "email", None).await {
        assert_eq!(c.provider_status, Some(250));
        assert!(
            c.provider_response
                .as_deref()
                .unwrap_or("")
                .contains("queued as"),
            "{:?}",
            c.provider_response
        );
    }
    // The copies are acknowledged as duplicates (they may still be in hand when the last
    // claim completes).
    let dups = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        async move { counts_of(&st, "email").await.duplicates == 4 }
    })
    .await;
    assert!(dups, "{:?}", counts_of(&st, "email").await);
    assert_eq!(sink.received().len(), N, "no mail for a duplicate");
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(q.ready(&q.queue).await, 0);
    q.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_message_is_kept_until_its_dead_letter_is_confirmed() {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    let Some(q) = TestQueues::new("no-dlx").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    // declare = false: the operator owns the topology, and forgot the dead-letter exchange.
    q.channel
        .queue_declare(
            q.queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml("payments", "declare = false", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    q.publish(
        BasicProperties::default().with_content_type("application/json".into()),
        br#"{"case":"no id, nowhere to go"}"#,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Not acknowledged, not dropped: it is back in the queue (or in hand again).
    assert_eq!(
        counts_of(&running.app().store, "payments")
            .await
            .dead_lettered,
        0
    );
    let state = running.amqp.consumer("payments").unwrap().clone();
    assert!(
        state.sessions() >= 2,
        "the session restarts after the broker closed the channel"
    );

    // The operator adds the exchange and its queue: the message lands there, with its reason.
    q.channel
        .exchange_declare(
            q.dlx.as_str().into(),
            lapin::ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    q.channel
        .queue_declare(
            q.dead().as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    q.channel
        .queue_bind(
            q.dead().as_str().into(),
            q.dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while dead.is_empty() && tokio::time::Instant::now() < end {
        dead = q.take_dead().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        dead.len(),
        1,
        "the bad message reached the dead-letter queue"
    );
    let reason = header(&dead[0].delivery.properties, "claimd-reason").unwrap();
    assert!(reason.contains("has no message id"), "{reason}");
    assert!(
        eventually(Duration::from_secs(5), || async {
            q.ready(&q.queue).await == 0
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(q.ready(&q.queue).await, 0);
    q.delete().await;
}

/// Found by the long reliability run: a bad message dead-lettered while the store could not
/// count it was acknowledged anyway, and the store's dead-letter count (report, metrics) fell
/// short of the dead-letter queue. Now the original is requeued until the count is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_is_counted_even_when_the_store_was_down_at_the_time() {
    let Some((q, store, _sandbox, running)) = payments_on_postgres("dl-count").await else {
        return;
    };
    let st = running.app().store.clone();
    // The store cannot count dead letters: the table is renamed by an administrator.
    rename_table(&store, "dead_letters", "dead_letters_offline").await;
    q.publish(
        BasicProperties::default().with_content_type("application/json".into()),
        br#"{"case":"no id while the store is down"}"#,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rename_table(&store, "dead_letters_offline", "dead_letters").await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            counts_of(&st, "payments").await.dead_lettered == 1
        })
        .await,
        "the dead letter was never counted: {:?}",
        counts_of(&st, "payments").await
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            q.ready(&q.queue).await == 0
        })
        .await
    );
    // Copies from the attempts that could not be counted are there too; none is lost.
    let dead = q.take_dead().await;
    assert!(!dead.is_empty());
    assert!(
        dead.iter()
            .all(|m| m.delivery.data == br#"{"case":"no id while the store is down"}"#)
    );
    running.shutdown(Duration::from_secs(5)).await;
    q.delete().await;
}
