//! Operator actions over HTTP (issue 15): `POST /v1/claims/{consumer}/{id}/resolve|redrive`
//! need the admin token, refuse what is not actionable or badly asked with a specific
//! problem, act on parked claims, and record who did it in the claim's history.

use crate::common;

use claimd::domain::claim::ClaimState;
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_and_redrive_over_http_act_on_parked_claims_and_record_who() {
    let (_store, _sandbox, running) = payments_worker("admin_token = \"secret-admin-token\"").await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(&s, "payments", "to-resolve", "unknown outcome").await;
    parked_claim(&s, "payments", "to-redrive", "unknown outcome").await;
    let post = |path: &str, body: serde_json::Value, token: Option<&str>| {
        let mut r = client().post(format!("{base}{path}")).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let ok = Some("secret-admin-token");
    let resolve = "/v1/claims/payments/to-resolve/resolve";

    // Without the token: 401, nothing changes.
    let r = post(
        resolve,
        json!({"to":"completed","note":"paid","actor":"ann"}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // Bad requests name what is wrong.
    for (body, says) in [
        (
            json!({"to":"done","note":"x","actor":"ann"}),
            "\\\"completed\\\" or \\\"failed\\\"",
        ),
        (json!({"to":"completed","note":"  ","actor":"ann"}), "note"),
        (json!({"to":"completed","note":"x","actor":""}), "actor"),
        (json!({"to":"completed","note":"x"}), "actor"),
        (
            json!({"to":"completed","note":"x","actor":"a","extra":1}),
            "extra",
        ),
    ] {
        let r = post(resolve, body.clone(), ok).await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(says), "{body}: {text}");
    }
    let c = s.get("payments", "", "to-resolve").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::NeedsAttention);

    // Resolve: completed, with the note and who did it in the history.
    let r = post(
        resolve,
        json!({"to":"completed","note":"seen at the provider as ch_123","actor":"ann"}),
        ok,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let view: serde_json::Value = r.json().await.unwrap();
    assert_eq!(view["state"], "completed");
    let c = s.get("payments", "", "to-resolve").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Completed);
    let events = s.events(c.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.actor == "api:ann" && e.detail.as_deref().unwrap_or("").contains("ch_123")),
        "{events:?}"
    );

    // Again: the claim is completed now, not actionable.
    let r = post(resolve, json!({"to":"failed","note":"x","actor":"ann"}), ok)
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);

    // Redrive: started again, new attempt, and performed by the sweeper with the same key.
    let r = post(
        "/v1/claims/payments/to-redrive/redrive",
        json!({"actor":"bob"}),
        ok,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let c = s.get("payments", "", "to-redrive").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Started);
    assert_eq!(c.attempt, 2);
    assert!(
        s.events(c.id)
            .await
            .unwrap()
            .iter()
            .any(|e| e.actor == "api:bob")
    );

    // No such claim: 404.
    let r = post(
        "/v1/claims/payments/nobody/redrive",
        json!({"actor":"bob"}),
        ok,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    running.shutdown(std::time::Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_message_counts_the_duplicates_that_arrived() {
    let (_store, _sandbox, running) = payments_worker("").await;
    let base = format!("http://{}", running.http_addr);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = client()
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", "dup-1")
            .header("Content-Type", "application/json")
            .body(r#"{"amount":1}"#)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [202, 200, 200]);
    let v = get_json(&format!("{base}/v1/messages/payments/dup-1")).await;
    assert_eq!(v["duplicate"], true, "{v}");
    assert_eq!(v["duplicates"], 2, "{v}");
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
