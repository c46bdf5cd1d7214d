//! Email end to end: from the broker into a real SMTP sink, once, with the key as Message-ID.

use super::*;

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
