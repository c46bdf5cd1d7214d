//! `[traces]`: one trace per message, read back from a real OTLP/HTTP receiver on loopback
//! (an axum route decoding `ExportTraceServiceRequest` with the official protobuf types).
//! The message comes with the producer's `traceparent`, waits out a provider outage, is
//! accepted as "processing", settled by a signed provider webhook, and its outcome event is
//! confirmed by a webhook destination: every step is in the producer's trace.

use crate::common;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use claimd::domain::claim::ClaimState;
use claimd::provider::provider_events::signature::sign_stripe;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "whsec_claimd_traces_test_secret";
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// A span as the receiver got it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub attributes: BTreeMap<String, String>,
    /// 2: error.
    pub status: i32,
    pub service: String,
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf) on loopback: its URL and what it got.
pub async fn otlp_receiver() -> (String, Arc<Mutex<Vec<ReceivedSpan>>>) {
    async fn export(
        State(got): State<Arc<Mutex<Vec<ReceivedSpan>>>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> impl IntoResponse {
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/x-protobuf")
        );
        let request = match ExportTraceServiceRequest::decode(body) {
            Ok(r) => r,
            Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        };
        let mut spans = Vec::new();
        for rs in request.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(&kv.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(ReceivedSpan {
                        name: s.name,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent: hex::encode(&s.parent_span_id),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(&kv.value)))
                            .collect(),
                        status: s.status.map(|st| st.code).unwrap_or(0),
                        service: service.clone(),
                    });
                }
            }
        }
        got.lock().unwrap().extend(spans);
        (
            [("content-type", "application/x-protobuf")],
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
            .into_response()
    }
    fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.as_ref().and_then(|v| v.value.as_ref()) {
            Some(AnyValue::StringValue(s)) => s.clone(),
            Some(AnyValue::IntValue(i)) => i.to_string(),
            Some(AnyValue::BoolValue(b)) => b.to_string(),
            Some(AnyValue::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        }
    }
    let got = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/v1/traces", post(export))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// A provider that answers `503` while `down`, then `200 {"id": "obj-<key>", "status":
/// "processing"}`; its status endpoint knows nothing (`404`).
async fn provider(down: Arc<AtomicBool>) -> String {
    let app = Router::new()
        .route(
            "/v1/{name}",
            post(move |headers: HeaderMap| {
                let down = down.clone();
                async move {
                    if down.load(Ordering::SeqCst) {
                        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({}))).into_response();
                    }
                    let key = headers
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    Json(json!({"id": format!("obj-{key}"), "status": "processing"}))
                        .into_response()
                }
            }),
        )
        .route(
            "/v1/effects/{key}",
            get(|Path(_k): Path<String>| async { StatusCode::NOT_FOUND }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A webhook destination for outcome events that takes every one.
async fn hook() -> String {
    let app = Router::new().route("/hook", post(|| async { StatusCode::NO_CONTENT }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn config(store: &TestStore, provider: &str, hook: &str, otlp: &str) -> String {
    let consumer = format!(
        r#"{}
[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
pending = ["processing"]
failed = ["failed"]
id_pointer = "/id"
pending_poll = "1h"

[consumers.provider_events]
scheme = "stripe"
secrets = ["{SECRET}"]

[consumers.outcomes]
name = "hooks"
kind = "http"
url = "{hook}"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
poll = "50ms"
"#,
        consumer_toml("cards", provider, "")
    );
    format!(
        "{}\n[traces]\nendpoint = \"{otlp}\"\nservice_name = \"claimd-test\"\nexport_every = \"100ms\"\n",
        config_toml(&store.url(), &consumer)
    )
}

/// The spans of the producer's trace, once `done` holds for them (up to 30 s).
async fn trace_when(
    got: &Arc<Mutex<Vec<ReceivedSpan>>>,
    done: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let ok = eventually(Duration::from_secs(30), || async {
        let spans = of_trace(got);
        done(&spans)
    })
    .await;
    let spans = of_trace(got);
    assert!(ok, "the trace never got there: {:#?}", names(&spans));
    spans
}

fn of_trace(got: &Arc<Mutex<Vec<ReceivedSpan>>>) -> Vec<ReceivedSpan> {
    got.lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == PRODUCER_TRACE)
        .cloned()
        .collect()
}

fn names(spans: &[ReceivedSpan]) -> Vec<String> {
    spans
        .iter()
        .map(|s| format!("{} {:?}", s.name, s.attributes))
        .collect()
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

async fn a_message_that_waited_out_an_outage_and_was_settled_by_a_webhook_is_one_trace(
    store: TestStore,
) {
    let (otlp, got) = otlp_receiver().await;
    let down = Arc::new(AtomicBool::new(true));
    let provider = provider(down.clone()).await;
    let hook = hook().await;
    let running = start(&config(&store, &provider, &hook, &otlp)).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();

    let r = client()
        .post(format!("{base}/v1/messages/cards"))
        .header("Idempotency-Key", "pay-1")
        .header("Content-Type", "application/json")
        .header(
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        )
        .body(r#"{"amount": 100}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    // The provider is down for 5 s: the claim waits (503s, the destination held), then
    // goes through as "processing".
    tokio::time::sleep(Duration::from_secs(5)).await;
    down.store(false, Ordering::SeqCst);
    let pending = eventually(Duration::from_secs(30), || async {
        s.get("cards", "", "pay-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Pending)
    })
    .await;
    let claim = s.get("cards", "", "pay-1").await.unwrap().unwrap();
    assert!(pending, "{:?} {:?}", claim.state, claim.last_error);

    // The provider's signed webhook settles it.
    let body = json!({
        "id": "evt_1",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": claim.provider_id, "status": "succeeded"}},
    })
    .to_string();
    let t = chrono::Utc::now().timestamp();
    let r = client()
        .post(format!("{base}/v1/provider-events/cards"))
        .header("Content-Type", "application/json")
        .header("Stripe-Signature", sign_stripe(SECRET, t, body.as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["result"], "settled", "{r}");
    // The claim names its trace.
    let shown: Value = client()
        .get(format!("{base}/v1/claims/cards/pay-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["trace_id"], PRODUCER_TRACE, "{shown}");

    // Read back: every step, in the producer's trace.
    let spans = trace_when(&got, |spans| {
        spans.iter().any(|s| {
            s.name == "claimd.outcome"
                && s.attributes.get("claimd.state").map(String::as_str) == Some("completed")
        })
    })
    .await;
    let shown = names(&spans);
    assert!(
        spans.iter().all(|s| s.service == "claimd-test"),
        "{shown:#?}"
    );

    let intake = named(&spans, "claimd.intake");
    assert_eq!(intake.len(), 1, "{shown:#?}");
    let intake = intake[0];
    assert_eq!(
        intake.parent, PRODUCER_SPAN,
        "the producer's span is the parent"
    );
    assert_eq!(intake.attributes["claimd.intake.result"], "accepted");
    assert_eq!(intake.attributes["messaging.message.id"], "pay-1");
    assert_eq!(intake.attributes["claimd.claim.id"], claim.id.to_string());

    let commit = named(&spans, "claimd.claim");
    assert_eq!(commit.len(), 1, "{shown:#?}");
    assert_eq!(commit[0].parent, intake.span_id);
    assert_eq!(commit[0].attributes["claimd.claim.result"], "created");

    // The outage: attempts whose calls got 503, and waits that say why.
    let attempts = named(&spans, "claimd.attempt");
    assert!(attempts.len() >= 2, "a wait and a takeover: {shown:#?}");
    assert!(attempts.iter().all(|a| a.parent == intake.span_id));
    assert!(
        attempts
            .iter()
            .all(|a| a.attributes["claimd.destination"] == provider),
        "{shown:#?}"
    );
    let attempt_ids: Vec<&str> = attempts.iter().map(|a| a.span_id.as_str()).collect();
    let calls = named(&spans, "claimd.call");
    assert!(
        calls
            .iter()
            .all(|c| attempt_ids.contains(&c.parent.as_str())),
        "every call is under its attempt: {shown:#?}"
    );
    let failed_calls = calls
        .iter()
        .filter(|c| {
            c.attributes
                .get("http.response.status_code")
                .map(String::as_str)
                == Some("503")
        })
        .count();
    assert!(failed_calls >= 1, "{shown:#?}");
    assert!(
        calls
            .iter()
            .filter(|c| c
                .attributes
                .get("http.response.status_code")
                .map(String::as_str)
                == Some("503"))
            .all(|c| c.status == 2),
        "a 503 is an error: {shown:#?}"
    );
    let answered: Vec<_> = calls
        .iter()
        .filter(|c| {
            c.attributes
                .get("http.response.status_code")
                .map(String::as_str)
                == Some("200")
        })
        .collect();
    assert_eq!(answered.len(), 1, "{shown:#?}");
    let waits = named(&spans, "claimd.wait");
    assert!(!waits.is_empty(), "{shown:#?}");
    assert!(
        waits
            .iter()
            .all(|w| !w.attributes["claimd.wait.reason"].is_empty()),
        "{shown:#?}"
    );
    assert!(
        waits
            .iter()
            .any(|w| w.attributes["claimd.wait.reason"].contains("503")),
        "{shown:#?}"
    );

    // Settled twice: pending by the call, completed by the provider's event.
    let settles = named(&spans, "claimd.settle");
    let by = |state: &str| {
        settles
            .iter()
            .find(|s| s.attributes["claimd.state"] == state)
            .unwrap_or_else(|| panic!("no settle to {state}: {shown:#?}"))
    };
    let to_pending = by("pending");
    assert_eq!(to_pending.attributes["claimd.settle.by"], "perform");
    assert!(attempt_ids.contains(&to_pending.parent.as_str()));
    let to_completed = by("completed");
    assert_eq!(to_completed.attributes["claimd.settle.by"], "event");
    assert_eq!(
        to_completed.attributes["claimd.settle.outcome"],
        "payment_intent.succeeded"
    );
    assert_eq!(to_completed.parent, intake.span_id);

    // The outcome event the destination confirmed.
    let outcome = named(&spans, "claimd.outcome")
        .into_iter()
        .find(|o| o.attributes["claimd.state"] == "completed")
        .unwrap();
    assert_eq!(outcome.parent, intake.span_id);
    assert_eq!(outcome.attributes["claimd.destination"], "hooks");
    assert!(outcome.attributes["claimd.outcome.event_id"].starts_with("evt_"));

    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn one_trace_per_message_on_sqlite() {
    a_message_that_waited_out_an_outage_and_was_settled_by_a_webhook_is_one_trace(
        TestStore::sqlite(),
    )
    .await;
}

#[tokio::test]
async fn one_trace_per_message_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_message_that_waited_out_an_outage_and_was_settled_by_a_webhook_is_one_trace(store).await;
}

#[tokio::test]
async fn without_traces_nothing_is_sent_and_a_bad_traceparent_starts_a_trace_of_its_own() {
    let (otlp, got) = otlp_receiver().await;
    let down = Arc::new(AtomicBool::new(false));
    let provider = provider(down).await;
    let hook = hook().await;
    let store = TestStore::sqlite();
    let running = start(&config(&store, &provider, &hook, &otlp)).await;
    let base = format!("http://{}", running.http_addr);
    // A malformed traceparent never refuses a message.
    let r = client()
        .post(format!("{base}/v1/messages/cards"))
        .header("Idempotency-Key", "bad-parent")
        .header("Content-Type", "application/json")
        .header("traceparent", "00-not-a-trace-01")
        .body(r#"{"amount": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let ok = eventually(Duration::from_secs(20), || async {
        got.lock().unwrap().iter().any(|s| {
            s.name == "claimd.intake"
                && s.attributes.get("messaging.message.id").map(String::as_str)
                    == Some("bad-parent")
        })
    })
    .await;
    assert!(ok);
    let intake = got
        .lock()
        .unwrap()
        .iter()
        .find(|s| s.name == "claimd.intake")
        .cloned()
        .unwrap();
    assert_eq!(intake.parent, "", "a root span: {intake:?}");
    running.shutdown(Duration::from_secs(5)).await;

    // The same worker with `[traces]` left out sends nothing.
    let (otlp2, got2) = otlp_receiver().await;
    let toml = config(&store, &provider, &hook, &otlp2);
    let toml = toml.split("\n[traces]").next().unwrap().to_string();
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let r = client()
        .post(format!("{base}/v1/messages/cards"))
        .header("Idempotency-Key", "untraced")
        .header("Content-Type", "application/json")
        .header(
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        )
        .body(r#"{"amount": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let s = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(20), || async {
            s.get("cards", "", "untraced")
                .await
                .unwrap()
                .is_some_and(|c| c.state == ClaimState::Pending)
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert!(got2.lock().unwrap().is_empty());
    let _ = otlp2;
}

/// AMQP and NATS headers carry the producer's `traceparent` as HTTP's does.
#[tokio::test]
async fn amqp_and_nats_headers_carry_the_producers_trace() {
    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, FieldTable};
    let Some(q) = common::amqp::TestQueues::new("traces").await else {
        return;
    };
    let Some(st) = common::nats::TestStream::new("traces").await else {
        return;
    };
    let (otlp, got) = otlp_receiver().await;
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let effect = format!(
        "\n[consumers.effect]\nkind = \"http\"\nurl = \"{provider}/v1/payments\"\ntimeout = \"1s\"\n"
    );
    let store = TestStore::sqlite();
    let consumers = format!(
        "{}{}",
        q.consumer_toml("by-amqp", "", &effect),
        st.consumer_toml("by-nats", "", &effect)
    );
    let toml = format!(
        "{}\n[traces]\nendpoint = \"{otlp}\"\nexport_every = \"100ms\"\n",
        config_toml(&store.url(), &consumers)
    );
    let running = start(&toml).await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            running.amqp.connected() && running.nats.connected()
        })
        .await,
        "the broker consumers did not connect"
    );

    let amqp_trace = "0af7651916cd43dd8448eb211c80319c";
    let nats_trace = "5b8efff798038103d269b633813fc60c";
    let mut h = FieldTable::default();
    h.insert(
        "traceparent".into(),
        AMQPValue::LongString(format!("00-{amqp_trace}-b7ad6b7169203331-01").into()),
    );
    q.publish(
        BasicProperties::default()
            .with_message_id("a-1".into())
            .with_content_type("application/json".into())
            .with_headers(h),
        br#"{"amount": 1}"#,
    )
    .await;
    st.publish(
        common::nats::headers(&[
            ("Nats-Msg-Id", "n-1"),
            ("Content-Type", "application/json"),
            (
                "traceparent",
                &format!("00-{nats_trace}-c7ad6b7169203331-01"),
            ),
        ]),
        br#"{"amount": 2}"#,
    )
    .await;

    for (trace, parent, consumer) in [
        (amqp_trace, "b7ad6b7169203331", "by-amqp"),
        (nats_trace, "c7ad6b7169203331", "by-nats"),
    ] {
        let ok = eventually(Duration::from_secs(30), || async {
            let spans = got.lock().unwrap().clone();
            let of: Vec<_> = spans.iter().filter(|s| s.trace_id == trace).collect();
            of.iter()
                .any(|s| s.name == "claimd.intake" && s.parent == parent)
                && of.iter().any(|s| {
                    s.name == "claimd.settle"
                        && s.attributes.get("claimd.state").map(String::as_str) == Some("completed")
                })
        })
        .await;
        let spans = got.lock().unwrap().clone();
        assert!(ok, "{consumer}: {:#?}", names(&spans));
        let intake = spans
            .iter()
            .find(|s| s.trace_id == trace && s.name == "claimd.intake")
            .unwrap();
        assert_eq!(intake.attributes["claimd.consumer"], consumer);
    }
    running.shutdown(Duration::from_secs(5)).await;
    q.delete().await;
    st.delete().await;
}

/// A worker SIGKILLed in the middle of a call: the process that takes the claim over puts its
/// attempt, call and settle in the same trace, under the intake span the first one made (the
/// claim's stored `traceparent`). The killed attempt's own span is lost with its process.
#[tokio::test]
async fn a_takeover_after_a_sigkill_joins_the_messages_trace() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (otlp, got) = otlp_receiver().await;
    // Hangs every call while `hang`, else applies it.
    let hang = Arc::new(AtomicBool::new(true));
    let calls = {
        let hang = hang.clone();
        Router::new().route(
            "/v1/{name}",
            post(move |headers: HeaderMap| {
                let hang = hang.clone();
                async move {
                    if hang.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    let key = headers
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    Json(json!({"id": format!("obj-{key}"), "status": "succeeded"}))
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, calls).await });
    let consumer = format!(
        "{}\n[consumers.effect.outcome]\npointer = \"/status\"\ncompleted = [\"succeeded\"]\n",
        consumer_toml(
            "cards",
            &provider,
            "on_unknown = \"redrive\"\nlease = \"2s\""
        )
        .replace("timeout = \"1s\"", "timeout = \"1500ms\"")
    );
    let toml = format!(
        "{}\n[traces]\nendpoint = \"{otlp}\"\nexport_every = \"100ms\"\n",
        config_toml(&store.url(), &consumer)
    );
    let dir = tempfile::tempdir().unwrap();
    let first = ready_worker(&toml, dir.path(), "first").await;
    let r = client()
        .post(format!("{}/v1/messages/cards", first.base))
        .header("Idempotency-Key", "killed-1")
        .header("Content-Type", "application/json")
        .header(
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        )
        .body(r#"{"amount": 7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // The intake and claim spans are sent (every 100 ms) while the call hangs; then the kill.
    let intake_sent = eventually(Duration::from_secs(10), || async {
        of_trace(&got).iter().any(|s| s.name == "claimd.claim")
    })
    .await;
    assert!(intake_sent, "{:#?}", names(&of_trace(&got)));
    first.kill();
    hang.store(false, Ordering::SeqCst);

    let second = ready_worker(&toml, dir.path(), "second").await;
    let spans = trace_when(&got, |spans| {
        spans.iter().any(|s| {
            s.name == "claimd.settle"
                && s.attributes.get("claimd.state").map(String::as_str) == Some("completed")
        })
    })
    .await;
    let shown = names(&spans);
    let intake = named(&spans, "claimd.intake");
    assert_eq!(intake.len(), 1, "{shown:#?}");
    let intake = intake[0];
    assert_eq!(intake.parent, PRODUCER_SPAN);
    let attempts = named(&spans, "claimd.attempt");
    assert!(
        attempts
            .iter()
            .all(|a| a.attributes["claimd.attempt"] != "1"),
        "the killed attempt never ended: {shown:#?}"
    );
    let takeover = attempts
        .iter()
        .find(|a| a.attributes["claimd.attempt.end"] == "completed")
        .unwrap_or_else(|| panic!("no attempt completed it: {shown:#?}"));
    assert_eq!(takeover.parent, intake.span_id, "{shown:#?}");
    let settle = named(&spans, "claimd.settle")
        .into_iter()
        .find(|s| s.attributes["claimd.state"] == "completed")
        .unwrap();
    assert_eq!(settle.parent, takeover.span_id, "{shown:#?}");
    assert!(
        named(&spans, "claimd.call")
            .iter()
            .any(|c| c.parent == takeover.span_id
                && c.attributes.get("claimd.call.resend").map(String::as_str) == Some("takeover")),
        "the re-send after the kill is in the trace: {shown:#?}"
    );
    drop(second);

    // `claims show` names the trace, to look it up in the tracing backend.
    let config = dir.path().join("second.toml");
    let config = config.to_str().unwrap();
    let (code, out, err) = cli(&["claims", "show", "cards", "killed-1", "--config", config]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("trace") && l.ends_with(PRODUCER_TRACE)),
        "{out}"
    );
    let (code, out, err) = cli(&[
        "claims", "show", "cards", "killed-1", "--config", config, "--format", "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["trace_id"], PRODUCER_TRACE);
}

/// A takeover the sweeper settles by asking the provider's status endpoint (the worker that
/// sent the call was SIGKILLed; `on_unknown = "reconcile"`) records its attempt: a
/// `claimd.attempt` span under the intake span, ended `completed`, with the settle (by
/// `reconcile`) under it.
#[tokio::test]
async fn a_takeover_settled_by_a_status_lookup_records_its_attempt() {
    let store = TestStore::sqlite();
    let (otlp, got) = otlp_receiver().await;
    // Every call hangs (the worker is killed in it); the status endpoint has the effect of
    // each key called (and no other: the start-up probe's key is not found).
    let called = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    let seen = called.clone();
    let app = Router::new()
        .route(
            "/v1/{name}",
            post(move |headers: HeaderMap| {
                let key = headers
                    .get("Idempotency-Key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().insert(key);
                async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    StatusCode::OK
                }
            }),
        )
        .route(
            "/v1/effects/{key}",
            get(move |Path(key): Path<String>| {
                let found = called.lock().unwrap().contains(&key);
                async move {
                    if !found {
                        return StatusCode::NOT_FOUND.into_response();
                    }
                    Json(json!({"id": format!("obj-{key}"), "status": "succeeded"})).into_response()
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let consumer = format!(
        "{}\n[consumers.effect.outcome]\npointer = \"/status\"\ncompleted = [\"succeeded\"]\n",
        consumer_toml(
            "cards",
            &provider,
            "on_unknown = \"reconcile\"\nlease = \"2s\""
        )
        .replace("timeout = \"1s\"", "timeout = \"1500ms\"")
    );
    let toml = format!(
        "{}\n[traces]\nendpoint = \"{otlp}\"\nexport_every = \"100ms\"\n",
        config_toml(&store.url(), &consumer)
    );
    let dir = tempfile::tempdir().unwrap();
    let first = ready_worker(&toml, dir.path(), "first").await;
    let r = client()
        .post(format!("{}/v1/messages/cards", first.base))
        .header("Idempotency-Key", "looked-up-1")
        .header("Content-Type", "application/json")
        .header(
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        )
        .body(r#"{"amount": 7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let intake_sent = eventually(Duration::from_secs(10), || async {
        of_trace(&got).iter().any(|s| s.name == "claimd.claim")
    })
    .await;
    assert!(intake_sent, "{:#?}", names(&of_trace(&got)));
    first.kill();

    let second = ready_worker(&toml, dir.path(), "second").await;
    trace_when(&got, |spans| {
        spans.iter().any(|s| {
            s.name == "claimd.settle"
                && s.attributes.get("claimd.state").map(String::as_str) == Some("completed")
        })
    })
    .await;
    // The attempt's span ends after its settle's: give the exporter a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans = of_trace(&got);
    let shown = names(&spans);
    eprintln!("{shown:#?}");
    let settle = named(&spans, "claimd.settle")
        .into_iter()
        .find(|s| s.attributes["claimd.state"] == "completed")
        .unwrap();
    assert_eq!(
        settle
            .attributes
            .get("claimd.settle.by")
            .map(String::as_str),
        Some("reconcile"),
        "{shown:#?}"
    );
    let intake = named(&spans, "claimd.intake")[0];
    let attempt = named(&spans, "claimd.attempt")
        .into_iter()
        .find(|a| a.attributes.get("claimd.attempt.end").map(String::as_str) == Some("completed"))
        .unwrap_or_else(|| panic!("no claimd.attempt span for the takeover: {shown:#?}"));
    assert_eq!(attempt.parent, intake.span_id, "{shown:#?}");
    assert_eq!(attempt.attributes["claimd.attempt"], "2", "{shown:#?}");
    assert_eq!(settle.parent, attempt.span_id, "{shown:#?}");
    drop(second);
}
