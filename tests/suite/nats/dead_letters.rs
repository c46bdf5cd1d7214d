//! Bad messages: every kind dead-lettered with a readable reason and the original's headers,
//! a message delivered past `max_deliver` set aside unless it was claimed (with its payload:
//! another payload is a conflict), and a bad message
//! kept until a stream acknowledges its dead letter.

use super::*;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use claimd::edge::intake::nats::DeadLetterReason as R;
use futures_util::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_kind_of_bad_message_is_dead_lettered_with_a_reason() {
    let Some(s) = TestStream::new("bad").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml_with(
        &store.url(),
        "max_body_bytes = 1024",
        &s.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;

    // A first, good message that the changed payload will collide with, claimed directly:
    // published with the same Nats-Msg-Id within the stream's duplicate window (2 min by
    // default), JetStream itself would drop the second one.
    let accepted = running
        .app()
        .claimer
        .submit(claim_of("same-1", r#"{"case":"original"}"#))
        .await;
    assert!(accepted.is_ok(), "{accepted:?}");
    let st = running.app().store.clone();
    let claimed = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        async move { completed(&st, "payments").await == 1 }
    })
    .await;
    assert!(claimed);

    let with = |pairs: &[(&str, &str)]| {
        let mut all = vec![("X-Trace", "trace-7"), ("Content-Type", "application/json")];
        all.extend_from_slice(pairs);
        headers(&all)
    };
    let long_id = "k".repeat(300);
    let long_tenant = "t".repeat(300);
    let big = format!("{{\"case\":\"big\",\"pad\":\"{}\"}}", "x".repeat(2048));
    // (headers, body, reason code, expected words in Claimd-Reason)
    let cases: Vec<(async_nats::HeaderMap, String, R, &str)> = vec![
        (
            with(&[]),
            r#"{"case":"no-id"}"#.into(),
            R::MissingMessageId,
            "has no message id",
        ),
        (
            with(&[("Nats-Msg-Id", &long_id)]),
            r#"{"case":"long-id"}"#.into(),
            R::InvalidMessageId,
            "300 characters long; the limit is 255",
        ),
        (
            with(&[("Nats-Msg-Id", "a b")]),
            r#"{"case":"space"}"#.into(),
            R::InvalidMessageId,
            "space, control or non-ASCII character at position 1",
        ),
        (
            with(&[("Nats-Msg-Id", "two-1"), ("Nats-Msg-Id", "two-2")]),
            r#"{"case":"two-ids"}"#.into(),
            R::InvalidMessageId,
            "appears with different values",
        ),
        (
            with(&[("Nats-Msg-Id", "tenant-1"), ("Tenant-Id", &long_tenant)]),
            r#"{"case":"tenant"}"#.into(),
            R::InvalidTenant,
            "tenant (header \"Tenant-Id\")",
        ),
        (
            with(&[("Nats-Msg-Id", "big-1")]),
            big.clone(),
            R::BodyTooLarge,
            "over the limit of 1024 bytes",
        ),
        (
            with(&[("Nats-Msg-Id", "same-1")]),
            r#"{"case":"changed"}"#.into(),
            R::PayloadMismatch,
            "already used with a different payload",
        ),
        (
            with(&[("Nats-Msg-Id", "ct-1"), ("Content-Type", "text/plain")]),
            r#"{"case":"two-types"}"#.into(),
            R::InvalidContentType,
            "content type cannot be read",
        ),
        (
            with(&[("Nats-Msg-Id", "later-1"), ("Not-Before", "next tuesday")]),
            r#"{"case":"not-before"}"#.into(),
            R::InvalidNotBefore,
            "not-before",
        ),
        (
            with(&[("Nats-Msg-Id", "urgent-1"), ("Message-Priority", "urgent")]),
            r#"{"case":"priority"}"#.into(),
            R::InvalidPriority,
            "priority \"urgent\" is not an integer from -100 to 100",
        ),
    ];
    for (h, body, _, _) in &cases {
        s.publish(h.clone(), body.as_bytes()).await;
    }

    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while dead.len() < cases.len() && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        dead = s.dead_letters().await;
    }
    assert_eq!(
        dead.len(),
        cases.len(),
        "dead-lettered {} of {}",
        dead.len(),
        cases.len()
    );
    for (h, body, code, needle) in &cases {
        let m = dead
            .iter()
            .find(|m| m.payload == body.as_bytes())
            .unwrap_or_else(|| panic!("no dead letter for {needle:?}"));
        let reason = header(m, "Claimd-Reason").expect("Claimd-Reason header");
        assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
        assert_eq!(
            header(m, "Claimd-Reason-Code").as_deref(),
            Some(code.as_str())
        );
        // The original's headers are kept; its id moves to a header of its own, so the dead
        // letter is never taken for a duplicate publish.
        assert_eq!(header(m, "X-Trace").as_deref(), Some("trace-7"), "{needle}");
        assert!(header(m, "Nats-Msg-Id").is_none(), "{needle}");
        if let Some(id) = h.get("Nats-Msg-Id") {
            assert_eq!(
                header(m, "Claimd-Original-Msg-Id").as_deref(),
                Some(id.as_str()),
                "{needle}"
            );
        }
    }

    // Nothing refused was claimed or performed; nothing is left unacknowledged.
    assert_eq!(claims_in(&st, "payments", None).await.len(), 1);
    assert_eq!(sandbox.effects().len(), 1);
    assert!(
        eventually(Duration::from_secs(5), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await
    );
    let pc = counts_of(&st, "payments").await;
    assert_eq!(pc.dead_lettered, cases.len() as i64, "{pc:?}");
    assert_eq!(pc.payload_mismatches, 1, "{pc:?}");
    let by_reason = running.nats.consumer("payments").unwrap().dead_lettered();
    assert_eq!(by_reason.get(&R::InvalidMessageId), Some(&3));
    assert_eq!(by_reason.get(&R::PayloadMismatch), Some(&1));

    running.shutdown(Duration::from_secs(5)).await;
    s.delete().await;
}

/// A JSON message of `payments` as an intake hands it to the claimer.
fn claim_of(id: &str, body: &'static str) -> claimd::engine::claimer::Delivery {
    claimd::engine::claimer::Delivery {
        consumer: "payments".into(),
        tenant: Vec::new(),
        message_id: id.as_bytes().to_vec(),
        payload: bytes::Bytes::from_static(body.as_bytes()),
        content_type: b"application/json".to_vec(),
        not_before: None,
        trace_parent: None,
        priority: 0,
    }
}

/// Pulls every message of the durable consumer `durable` and naks it, until each has been
/// delivered at least `times` times: what a worker that dies holding them leaves. Returns each
/// message's deliveries so far, in publishing order (a busy server may redeliver a nak'ed
/// message within the same fetch, so one may pass `times`).
async fn deliver_without_ack(s: &TestStream, durable: &str, ids: usize, times: i64) -> Vec<i64> {
    let stream = s.js.get_stream(&s.stream).await.unwrap();
    let c: PullConsumer = stream.get_consumer(durable).await.unwrap();
    let mut seen = std::collections::HashMap::<u64, i64>::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while (seen.len() < ids || seen.values().any(|n| *n < times))
        && tokio::time::Instant::now() < end
    {
        let mut batch = c
            .fetch()
            .max_messages(ids)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            let info = m.info().unwrap();
            seen.insert(info.stream_sequence, info.delivered);
            m.ack_with(AckKind::Nak(None)).await.unwrap();
        }
    }
    assert!(
        seen.len() == ids && seen.values().all(|n| *n >= times),
        "deliveries: {seen:?}"
    );
    let mut by_sequence: Vec<_> = seen.into_iter().collect();
    by_sequence.sort();
    by_sequence.into_iter().map(|(_, n)| n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_delivered_past_max_deliver_is_set_aside_unless_claimed() {
    let Some(s) = TestStream::new("limit").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml(
        &store.url(),
        &s.consumer_toml("payments", "max_deliver = 2", &http_effect(&provider)),
    );
    // A first worker creates the durable consumer and claims `claimed-1` (as if it had
    // committed the claim and died before its acknowledgement), then stops.
    let first = start(&toml).await;
    wait_connected(&first).await;
    let accepted = first
        .app()
        .claimer
        .submit(claim_of("claimed-1", r#"{"case":"claimed"}"#))
        .await;
    assert!(accepted.is_ok(), "{accepted:?}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            sandbox.effects().len() == 1
        })
        .await
    );
    first.shutdown(Duration::from_secs(5)).await;

    // Both delivered (at least) twice and never acknowledged; the next delivery passes the limit.
    s.publish_json("poison-1", r#"{"case":"poison"}"#).await;
    s.publish_json("claimed-1", r#"{"case":"claimed"}"#).await;
    let deliveries = deliver_without_ack(&s, "claimd-payments", 2, 2).await;

    let second = start(&toml).await;
    wait_connected(&second).await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await,
        "not every message was acknowledged"
    );
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1, "only the unclaimed message is set aside");
    let m = &dead[0];
    assert_eq!(&m.payload[..], br#"{"case":"poison"}"#);
    assert_eq!(
        header(m, "Claimd-Reason-Code").as_deref(),
        Some("delivery_limit")
    );
    let reason = header(m, "Claimd-Reason").unwrap();
    let nth = deliveries[0] + 1;
    assert!(
        reason.contains(&format!("delivered {nth} times")) && reason.contains("max_deliver 2"),
        "{reason}"
    );
    // The claimed one is a duplicate: acknowledged, not performed again, not dead-lettered.
    assert_eq!(sandbox.effects().len(), 1);
    assert!(sandbox.effects().iter().all(|e| e.applied == 1));
    let st = second.app().store.clone();
    assert_eq!(claims_in(&st, "payments", None).await.len(), 1);
    assert_eq!(counts_of(&st, "payments").await.dead_lettered, 1);
    second.shutdown(Duration::from_secs(5)).await;
    s.delete().await;
}

/// Past `max_deliver`, a claim with the message's id is not enough: a copy with another
/// payload is a conflict (I5), dead-lettered as `payload_mismatch`, never acknowledged as a
/// duplicate; a copy with the claimed payload is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_payload_past_max_deliver_is_dead_lettered_as_a_conflict() {
    let Some(s) = TestStream::new("limit-changed").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml(
        &store.url(),
        &s.consumer_toml("payments", "max_deliver = 2", &http_effect(&provider)),
    );
    let first = start(&toml).await;
    wait_connected(&first).await;
    for id in ["same-1", "changed-1"] {
        let accepted = first
            .app()
            .claimer
            .submit(claim_of(id, r#"{"amount":100}"#))
            .await;
        assert!(accepted.is_ok(), "{accepted:?}");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    first.shutdown(Duration::from_secs(5)).await;

    s.publish_json("same-1", r#"{"amount":100}"#).await;
    s.publish_json("changed-1", r#"{"amount":999}"#).await;
    deliver_without_ack(&s, "claimd-payments", 2, 2).await;

    let second = start(&toml).await;
    wait_connected(&second).await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await,
        "not every message was acknowledged"
    );
    let dead = s.dead_letters().await;
    let shown: Vec<_> = dead
        .iter()
        .map(|m| {
            (
                String::from_utf8_lossy(&m.payload).into_owned(),
                header(m, "Claimd-Reason-Code"),
                header(m, "Claimd-Reason"),
            )
        })
        .collect();
    eprintln!("dead letters: {shown:?}");
    assert_eq!(
        dead.len(),
        1,
        "the changed payload is set aside, the same one acknowledged: {shown:?}"
    );
    let m = &dead[0];
    assert_eq!(&m.payload[..], br#"{"amount":999}"#);
    assert_eq!(
        header(m, "Claimd-Reason-Code").as_deref(),
        Some("payload_mismatch")
    );
    let reason = header(m, "Claimd-Reason").unwrap();
    assert!(
        reason.contains("already used with a different payload"),
        "{reason}"
    );
    assert_eq!(sandbox.effects().len(), 2);
    assert!(sandbox.effects().iter().all(|e| e.applied == 1));
    let st = second.app().store.clone();
    let pc = counts_of(&st, "payments").await;
    assert_eq!(pc.dead_lettered, 1, "{pc:?}");
    assert_eq!(pc.payload_mismatches, 1, "{pc:?}");
    second.shutdown(Duration::from_secs(5)).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_message_is_kept_until_a_stream_acknowledges_its_dead_letter() {
    let Some(s) = TestStream::new("unacked-dead").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &s.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    // The dead-letter stream goes away (an operator deleted it).
    s.js.delete_stream(s.dead()).await.unwrap();
    s.publish(headers(&[("X-Trace", "t-1")]), br#"{"case":"no-id"}"#)
        .await;
    let state = running.nats.consumer("payments").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            state.dead_letter_failing().is_some_and(|f| f.failures >= 2)
        })
        .await,
        "the failing dead letter is not shown"
    );
    let ready = client()
        .get(format!("http://{}/readyz", running.http_addr))
        .send()
        .await
        .unwrap();
    let body = ready.text().await.unwrap();
    assert!(
        body.contains("dead-letter publishes not confirmed"),
        "{body}"
    );
    // Held, not acknowledged, not counted.
    assert_eq!(s.unacknowledged("claimd-payments").await, 1);
    let st = running.app().store.clone();
    assert_eq!(counts_of(&st, "payments").await.dead_lettered, 0);

    s.create_dead_stream().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await,
        "the message was not acknowledged once its dead letter was"
    );
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(header(&dead[0], "X-Trace").as_deref(), Some("t-1"));
    assert_eq!(counts_of(&st, "payments").await.dead_lettered, 1);
    assert!(state.dead_letter_failing().is_none());
    running.shutdown(Duration::from_secs(5)).await;
    s.delete().await;
}
