//! CloudEvents 1.0 over HTTP (`POST /v1/events/{consumer}`): binary and structured content
//! modes claim the event under `source|id`, once; a redelivery of the same event in the other
//! mode is a duplicate; the tenant comes from the configured extension attribute; events
//! missing required attributes are refused with `400` naming them, batches with `415`, and
//! nothing refused is recorded.

use super::*;
use sha2::Digest;

fn sha(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_content_modes_claim_each_event_once_under_source_and_id() {
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml(
            "payments",
            &provider,
            "cloudevents_tenant = \"tenantid\"\ntenant_header = \"Tenant-Id\"",
        ),
    ))
    .await;
    let url = format!("http://{}/v1/events/payments", running.http_addr);
    let c = client();

    // Binary content mode: attributes in ce- headers, the data as the body.
    let data = r#"{"order":"o-1","amount":100}"#;
    let r = c
        .post(&url)
        .header("ce-specversion", "1.0")
        .header("ce-id", "evt-1")
        .header("ce-source", "https://shop.example/orders")
        .header("ce-type", "order.paid")
        .header("ce-tenantid", "acme")
        .header("content-type", "application/json")
        .body(data)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["message_id"], "https://shop.example/orders|evt-1");
    assert_eq!(v["tenant"], "acme");
    // Read back by its id, percent-encoded in the path.
    let r = c
        .get(format!(
            "http://{}/v1/messages/payments/https%3A%2F%2Fshop.example%2Forders%7Cevt-1",
            running.http_addr
        ))
        .header("Tenant-Id", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    // The same event again, in structured content mode with the same data: a duplicate,
    // not a second payment.
    let structured = format!(
        r#"{{"specversion":"1.0","id":"evt-1","source":"https://shop.example/orders","type":"order.paid","tenantid":"acme","datacontenttype":"application/json","data":{data}}}"#
    );
    let r = c
        .post(&url)
        .header(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )
        .body(structured.clone())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(status == 200 && v["duplicate"] == true, "{status} {v}");

    // The same id from another source is another event.
    let other = structured.replace("https://shop.example/orders", "https://billing.example");
    let r = c
        .post(&url)
        .header("content-type", "application/cloudevents+json")
        .body(other)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    let st = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    let effects = sandbox.effects();
    assert!(effects.iter().all(|e| e.applied == 1), "{effects:?}");
    assert!(
        effects
            .iter()
            .any(|e| e.key == "payments:acme:https://shop.example/orders|evt-1"),
        "{effects:?}"
    );
    // The provider got the event's data, not the envelope.
    let claim = st
        .get("payments", "acme", "https://shop.example/orders|evt-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&claim.payload[..], data.as_bytes());
    assert_eq!(claim.content_type, "application/json");
    let mine = effects
        .iter()
        .find(|e| e.key.ends_with("orders|evt-1"))
        .unwrap();
    assert_eq!(mine.body_sha256, sha(data.as_bytes()));
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_missing_attributes_and_batches_are_refused_and_not_recorded() {
    let (_store, _sandbox, running) = payments_worker("").await;
    let url = format!("http://{}/v1/events/payments", running.http_addr);
    let c = client();
    let r = c
        .post(&url)
        .header("ce-specversion", "1.0")
        .header("ce-type", "order.paid")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("missing CloudEvents attributes: id, source"),
        "{body}"
    );

    let r = c
        .post(&url)
        .header("content-type", "application/cloudevents+json")
        .body(r#"{"specversion":"1.0","source":"/s"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("missing CloudEvents attributes: id, type"),
        "{body}"
    );

    let r = c
        .post(&url)
        .header("content-type", "application/cloudevents-batch+json")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);

    let r = c
        .post(&url)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("not a CloudEvent"));

    let r = c
        .post(&url)
        .header("ce-specversion", "0.3")
        .header("ce-id", "1")
        .header("ce-source", "/s")
        .header("ce-type", "t")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("CloudEvents 1.0"));
    assert_eq!(
        claim_count(&running).await,
        0,
        "nothing refused is recorded"
    );
    running.shutdown(Duration::from_secs(5)).await;
}
