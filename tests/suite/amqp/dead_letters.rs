//! Bad messages: every kind dead-lettered with a readable reason, kept until the dead letter
//! is confirmed, and counted even when the store was down at the time.

use super::*;

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
    let n =
        |r: claimd::edge::intake::amqp::DeadLetterReason| by_reason.get(&r).copied().unwrap_or(0);
    use claimd::edge::intake::amqp::DeadLetterReason as R;
    assert_eq!(n(R::MissingMessageId), 1);
    assert_eq!(n(R::InvalidMessageId), 3);
    assert_eq!(n(R::BodyTooLarge), 1);
    assert_eq!(n(R::PayloadMismatch), 1);
    assert_eq!(n(R::InvalidContentType), 2);
    assert_eq!(n(R::KeyTooLong), 1);
    let report = claimd::ops::report::render_csv(
        &claimd::ops::report::build(
            &st,
            &["payments".into()],
            None,
            claimd::ops::report::Window::All,
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
