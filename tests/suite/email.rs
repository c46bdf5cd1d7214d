//! The SMTP effect against a real SMTP server on loopback (tests/common/smtp.rs): how each
//! server answer is classified, an unknown outcome (the connection dropped after the content,
//! or no answer in time) parked under `on_unknown = "park"` and re-sent with the same
//! Message-ID under `"redrive"`, and a payload without a recipient refused before anything is
//! claimed (HTTP 422; a body that is not JSON at all, 400).

use crate::common;

use chrono::Utc;
use claimd::config::SmtpEffectConfig;
use claimd::domain::claim::{Claim, ClaimState};
use claimd::domain::duration::Dur;
use claimd::provider::effect::smtp::SmtpEffect;
use claimd::provider::effect::{Effect, Outcome};
use claimd::store::ClaimFilter;
use common::smtp::{Behaviour, SmtpSink};
use common::*;
use std::time::Duration;

fn effect(port: u16, timeout: Duration) -> SmtpEffect {
    SmtpEffect::new(&SmtpEffectConfig {
        host: "127.0.0.1".into(),
        port,
        tls: claimd::config::SmtpTls::None,
        username: String::new(),
        password: String::new(),
        message_id_domain: "test.claimd".into(),
        from: "claimd <noreply@test.claimd>".into(),
        subject: "Hello".into(),
        timeout: Dur(timeout),
        max_key_length: 255,
    })
    .unwrap()
}

fn claim(key: &str, payload: &str) -> Claim {
    let now = Utc::now();
    Claim {
        id: 1,
        consumer: "email".into(),
        tenant: String::new(),
        message_id: key.into(),
        idem_key: key.into(),
        fingerprint: String::new(),
        payload: payload.as_bytes().to_vec().into(),
        content_type: "application/json".into(),
        state: ClaimState::Started,
        attempt: 1,
        lease_owner: None,
        lease_until: None,
        received_utc: now,
        started_utc: now,
        processed_utc: None,
        last_error: None,
        provider_status: None,
        provider_response: None,
        duplicate_count: 0,
        mismatch_count: 0,
        reconciled: false,
        resent_count: 0,
        waits: 0,
        claim_token: None,
        provider_id: None,
        pending_utc: None,
        version: 1,
        order_key: None,
        not_before: None,
        trace_parent: None,
        erased_utc: None,
    }
}

const MAIL: &str = r#"{"to":"someone@example.test","text":"hello"}"#;

#[tokio::test]
async fn smtp_answers_are_classified_by_when_they_happen() {
    let sink = SmtpSink::start().await;
    let e = effect(sink.addr.port(), Duration::from_secs(1));

    // 250 after the content: applied, with the server's answer kept.
    let out = e.perform(&claim("ok-1", MAIL)).await;
    match &out {
        Outcome::Applied { status, response } => {
            assert_eq!(*status, 250);
            assert!(response.contains("queued as"), "{response}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sink.with_message_id("<ok-1@test.claimd>").len(), 1);
    // The connection is reused for the next message.
    let before = sink.connections();
    assert!(matches!(
        e.perform(&claim("ok-2", MAIL)).await,
        Outcome::Applied { .. }
    ));
    assert_eq!(sink.connections(), before, "pooled connection reused");

    // 4xx to the content: the server refused before accepting: not applied, retry.
    sink.push(Behaviour::DataReply(451));
    assert!(
        matches!(
            e.perform(&claim("t-1", MAIL)).await,
            Outcome::NotApplied {
                status: Some(451),
                ..
            }
        ),
        "451 after DATA"
    );
    // 5xx to the content or to a recipient: permanent.
    sink.push(Behaviour::DataReply(554));
    assert!(matches!(
        e.perform(&claim("p-1", MAIL)).await,
        Outcome::Rejected { status: 554, .. }
    ));
    sink.push(Behaviour::RcptReply(550));
    assert!(matches!(
        e.perform(&claim("p-2", MAIL)).await,
        Outcome::Rejected { status: 550, .. }
    ));
    assert!(
        sink.with_message_id("<p-2@test.claimd>").is_empty(),
        "no content after a refused recipient"
    );
    sink.push(Behaviour::RcptReply(452));
    assert!(matches!(
        e.perform(&claim("t-2", MAIL)).await,
        Outcome::NotApplied {
            status: Some(452),
            ..
        }
    ));

    // The connection dropped after the content, or no answer in time: unknown (maybe sent).
    sink.push(Behaviour::DropAfterData);
    match e.perform(&claim("u-1", MAIL)).await {
        Outcome::Unknown { error, .. } => {
            assert!(
                error.contains("after the message content was sent"),
                "{error}"
            )
        }
        other => panic!("{other:?}"),
    }
    sink.push(Behaviour::DelayAfterData(Duration::from_secs(3)));
    match e.perform(&claim("u-2", MAIL)).await {
        Outcome::Unknown { error, .. } => assert!(error.contains("timed out"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(sink.with_message_id("<u-2@test.claimd>").len(), 1);

    // Nobody listening: nothing was sent.
    let refused = effect(free_port(), Duration::from_secs(1));
    assert!(matches!(
        refused.perform(&claim("r-1", MAIL)).await,
        Outcome::NotApplied { status: None, .. }
    ));
    assert!(refused.lookup(&claim("r-1", MAIL)).await.is_none());
}

fn email_consumer(sink: &SmtpSink, on_unknown: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "email"
source = "http"
concurrency = 8
lease = "3s"
max_attempts = 3
redrive_within = "1h"
on_unknown = "{on_unknown}"
key = "{{message_id}}"
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

async fn post(base: &str, key: &str, body: &str) -> (u16, String) {
    let r = client()
        .post(format!("{base}/v1/messages/email"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn state_of(running: &claimd::service::run::Running, key: &str) -> Option<Claim> {
    running.app().store.get("email", "", key).await.unwrap()
}

#[tokio::test]
async fn an_unknown_outcome_is_parked_under_park() {
    let sink = SmtpSink::start().await;
    let store = TestStore::sqlite();
    let running = start(&config_toml(&store.url(), &email_consumer(&sink, "park"))).await;
    let base = format!("http://{}", running.http_addr);

    sink.push(Behaviour::DropAfterData);
    assert_eq!(post(&base, "park-1", MAIL).await.0, 202);
    let parked = eventually(Duration::from_secs(10), || async {
        state_of(&running, "park-1")
            .await
            .is_some_and(|c| c.state == ClaimState::NeedsAttention)
    })
    .await;
    assert!(parked, "{:?}", state_of(&running, "park-1").await);
    let c = state_of(&running, "park-1").await.unwrap();
    assert!(
        c.last_error
            .as_deref()
            .unwrap_or("")
            .contains("after the message content was sent"),
        "{:?}",
        c.last_error
    );
    // Sent once, never again: a person decides.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.with_message_id("<park-1@test.claimd>").len(), 1);

    // An email without a recipient is refused before anything is claimed.
    let (status, text) = post(&base, "norcpt-1", r#"{"subject":"x","text":"y"}"#).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("no recipient"), "{text}");
    assert!(state_of(&running, "norcpt-1").await.is_none());
    // A body declared JSON that does not parse is refused as such, before any effect reads it.
    let (status, text) = post(&base, "notjson-1", "hello").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("not valid JSON"), "{text}");
    assert!(state_of(&running, "notjson-1").await.is_none());
    running.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test]
async fn an_unknown_outcome_is_resent_with_the_same_message_id_under_redrive() {
    let sink = SmtpSink::start().await;
    let store = TestStore::sqlite();
    let running = start(&config_toml(
        &store.url(),
        &email_consumer(&sink, "redrive"),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);

    sink.push(Behaviour::DropAfterData);
    assert_eq!(post(&base, "redrive-1", MAIL).await.0, 202);
    let done = eventually(Duration::from_secs(10), || async {
        state_of(&running, "redrive-1")
            .await
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "{:?}", state_of(&running, "redrive-1").await);
    let copies = sink.with_message_id("<redrive-1@test.claimd>");
    assert_eq!(
        copies.len(),
        2,
        "the second send carries the same Message-ID"
    );
    assert_eq!(copies[0].answer, "dropped");
    assert_eq!(copies[1].answer, "accepted");

    let counts = running.app().store.counts(None).await.unwrap();
    let email = counts.iter().find(|c| c.consumer == "email").unwrap();
    assert!(email.resent >= 1, "{email:?}");
    assert_eq!(email.completed, 1);
    let all = running
        .app()
        .store
        .list(&ClaimFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    running.shutdown(Duration::from_secs(3)).await;
}
