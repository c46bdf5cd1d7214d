//! Good messages through JetStream: competing workers and redelivered copies (each key applied
//! once), a store outage (held and tried again: nothing lost, nothing doubled), a server
//! restart (reconnect without loss).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_apply_each_message_once_despite_redelivered_copies() {
    const N: usize = 400;
    const COPIES: usize = N / 5;
    const BAD: usize = 4;
    let Some(s) = TestStream::new("e2e").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    // The id in a header of the producer's own: JetStream would drop copies that repeat
    // Nats-Msg-Id within its duplicate window, and this test wants them delivered.
    let toml = config_toml(
        &store.url(),
        &s.consumer_toml(
            "payments",
            "message_id_header = \"X-Message-Id\"",
            &http_effect(&provider),
        ),
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
        let h = headers(&[("X-Message-Id", id), ("Content-Type", "application/json")]);
        s.publish(
            h,
            format!("{{\"order\":\"{id}\",\"amount\":100}}").as_bytes(),
        )
        .await;
        if n % 120 == 0 {
            // Bad input among good: no message id at all.
            s.publish(headers(&[]), format!("{{\"bad\":{n}}}").as_bytes())
                .await;
        }
    }

    let st = w1.app().store.clone();
    let done = eventually(Duration::from_secs(40), || {
        let st = st.clone();
        async move { completed(&st, "payments").await == N }
    })
    .await;
    assert!(
        done,
        "completed {} of {N}",
        completed(&st, "payments").await
    );
    applied_once_each(&sandbox, N);
    assert_eq!(claims_in(&st, "payments", None).await.len(), N);
    let drained = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        let s = &s;
        async move {
            counts_of(&st, "payments").await.duplicates == COPIES as i64
                && s.unacknowledged("claimd-payments").await == 0
        }
    })
    .await;
    assert!(
        drained,
        "not drained: {:?}",
        counts_of(&st, "payments").await
    );
    w1.shutdown(Duration::from_secs(5)).await;
    w2.shutdown(Duration::from_secs(5)).await;
    assert_eq!(s.unacknowledged("claimd-payments").await, 0);

    let counts = counts_of(&st, "payments").await;
    assert_eq!(counts.received, (N + COPIES) as i64, "{counts:?}");
    assert_eq!(counts.dead_lettered, BAD as i64, "{counts:?}");
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), BAD, "only the messages without an id are dead");
    for m in &dead {
        let body = String::from_utf8_lossy(&m.payload);
        assert!(body.starts_with("{\"bad\":"), "{body}");
        let reason = header(m, "Claimd-Reason").unwrap();
        assert!(reason.contains("has no message id"), "{reason}");
        assert_eq!(
            header(m, "Claimd-Reason-Code").as_deref(),
            Some("missing_message_id")
        );
        assert_eq!(
            header(m, "Claimd-Original-Subject"),
            Some(s.subject.clone())
        );
    }
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_holds_the_messages_and_loses_nothing() {
    let Some(s) = TestStream::new("outage").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &s.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    for i in 0..10 {
        s.publish_json(&format!("before-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    let st = running.app().store.clone();
    let done = |n: usize| {
        let st = st.clone();
        move || {
            let st = st.clone();
            async move { completed(&st, "payments").await == n }
        }
    };
    assert!(eventually(Duration::from_secs(10), done(10)).await);

    // The store fails every claim: an administrator renames the claims table, for longer
    // than ack_wait (5 s), so the messages must be kept in hand by progress reports.
    rename_table(&store, "claims", "claims_offline").await;
    for i in 0..20 {
        s.publish_json(&format!("during-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(sandbox.effects().len(), 10, "nothing performed meanwhile");
    assert!(
        s.dead_letters().await.is_empty(),
        "a store outage is not bad input"
    );
    rename_table(&store, "claims_offline", "claims").await;

    assert!(
        eventually(Duration::from_secs(20), done(30)).await,
        "not every message was claimed after the store came back"
    );
    applied_once_each(&sandbox, 30);
    assert!(
        eventually(Duration::from_secs(10), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert!(s.dead_letters().await.is_empty());
    assert_eq!(counts_of(&st, "payments").await.dead_lettered, 0);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_restart_reconnects_without_loss_or_double_claims() {
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = common::nats::PrivateServer::start(dir.path()) else {
        return;
    };
    let Some(s) = TestStream::on(&server.url, "restart").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(20),
        ..Default::default()
    })
    .await;
    let running = start(&config_toml(
        &store.url(),
        &s.consumer_toml(
            "payments",
            "concurrency = 8\nprefetch = 16",
            &http_effect(&provider),
        ),
    ))
    .await;
    wait_connected(&running).await;
    for i in 0..N {
        s.publish_json(&format!("rs-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sandbox.effects().len() >= 40
        })
        .await
    );
    // A crash of the server (SIGKILL), then the same server on the same store.
    server.kill();
    let state = running.nats.consumer("payments").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(15), || async { !state.connected() }).await,
        "readiness did not see the server go"
    );
    server.restart();
    let st = running.app().store.clone();
    let done = eventually(Duration::from_secs(60), || {
        let st = st.clone();
        async move { completed(&st, "payments").await == N }
    })
    .await;
    assert!(
        done,
        "completed {} of {N} after the restart; consumer: {:?}",
        completed(&st, "payments").await,
        state.last_error()
    );
    applied_once_each(&sandbox, N);
    // Every claim may have committed before the kill, so the work can end before the intake
    // is back: readiness sees the new connection within its next check.
    assert!(
        eventually(Duration::from_secs(20), || async { state.connected() }).await,
        "not reconnected: {:?}",
        state.last_error()
    );
    // The test's own client reconnected too.
    assert!(
        eventually(Duration::from_secs(15), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await,
        "messages left unacknowledged"
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert!(s.dead_letters().await.is_empty());
    s.delete().await;
}
