//! Scheduled sends over RabbitMQ: the `not-before` header schedules a message (acknowledged at
//! once, sent at its time); a malformed one is dead-lettered with the reason
//! `invalid_not_before`, nothing claimed. The `priority` property likewise (`invalid_priority`).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_not_before_header_schedules_or_is_dead_lettered() {
    let Some(q) = TestQueues::new("sched").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    let st = running.app().store.clone();
    let props = |id: &str, not_before: &str| {
        let mut h = FieldTable::default();
        h.insert(
            "not-before".into(),
            AMQPValue::LongString(not_before.to_string().into()),
        );
        BasicProperties::default()
            .with_message_id(id.into())
            .with_content_type("application/json".into())
            .with_headers(h)
    };
    q.publish(props("later", "2s"), br#"{"amount_cents":1}"#)
        .await;
    q.publish(props("never", "next tuesday"), br#"{"amount_cents":2}"#)
        .await;
    let scheduled = eventually(Duration::from_secs(10), || async {
        st.get("payments", "", "later")
            .await
            .unwrap()
            .is_some_and(|c| c.is_scheduled())
    })
    .await;
    assert!(scheduled, "claimed as a scheduled send");
    assert!(sandbox.effects().is_empty(), "not sent before its time");
    let sent = eventually(Duration::from_secs(10), || async {
        st.get("payments", "", "later")
            .await
            .unwrap()
            .unwrap()
            .state
            == ClaimState::Completed
    })
    .await;
    assert!(sent, "sent at its time");
    let c = st.get("payments", "", "later").await.unwrap().unwrap();
    let applied = sandbox.effects()[0].first_applied_utc;
    assert!(applied >= c.not_before.unwrap());
    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while dead.is_empty() && tokio::time::Instant::now() < end {
        dead.extend(q.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1);
    let reason = header(&dead[0].delivery.properties, "claimd-reason").unwrap();
    assert!(reason.contains("not-before"), "{reason}");
    assert!(st.get("payments", "", "never").await.unwrap().is_none());
    running.shutdown(Duration::from_secs(5)).await;
    q.delete().await;
}

/// The message's `priority` property: 0-100 is the claim's priority, above it 100 (RabbitMQ's
/// range is 0-255; a message is never refused for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_priority_property_is_stored_and_capped_at_100() {
    let Some(q) = TestQueues::new("prio").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    let props = |id: &str, priority: u8| {
        BasicProperties::default()
            .with_message_id(id.into())
            .with_content_type("application/json".into())
            .with_priority(priority)
    };
    q.publish(props("urgent", 90), br#"{"amount_cents":1}"#)
        .await;
    q.publish(props("too-high", 200), br#"{"amount_cents":2}"#)
        .await;
    let pool = sqlx::SqlitePool::connect(&store.url()).await.unwrap();
    let stored = eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i64>("SELECT priority FROM claims WHERE message_id = 'urgent'")
            .fetch_optional(&pool)
            .await
            .unwrap()
            == Some(90)
    })
    .await;
    assert!(stored, "claimed with priority 90");
    let capped = eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i64>("SELECT priority FROM claims WHERE message_id = 'too-high'")
            .fetch_optional(&pool)
            .await
            .unwrap()
            == Some(100)
    })
    .await;
    assert!(capped, "claimed with priority 100");
    running.shutdown(Duration::from_secs(5)).await;
    q.delete().await;
}
