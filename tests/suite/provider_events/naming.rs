//! Invariant I9 on both stores: an event decides only the claim it names. Another object with
//! the same order number, another tenant's, another consumer's, one arriving while the call is
//! in flight, a failure after success of the claim's own object, a second object carrying the
//! claim's key; and the configurations that could not tell claims apart, refused at start.

use super::*;
use claimd::service::run::Running;

/// Runs one test body on SQLite and on PostgreSQL.
macro_rules! on_both_stores {
    ($body:ident, $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $body(TestStore::sqlite()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            let Some(store) = TestStore::pg().await else {
                return;
            };
            $body(store).await;
        }
    };
}

/// A worker with the consumers `cards` (and `shop`, on the same provider account, with its
/// own secret), its store and its endpoint.
async fn cards_and_shop(store: &TestStore) -> (Running, claimd::store::Store, Endpoint) {
    let provider = echo_provider().await;
    let consumers = format!(
        "{}{}",
        consumer("cards", &provider, "stripe", STRIPE_SECRET),
        consumer("shop", &provider, "stripe", SHOP_SECRET)
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let s = running.app().store.clone();
    let ep = Endpoint {
        base: format!("http://{}", running.http_addr),
    };
    (running, s, ep)
}

const SHOP_SECRET: &str = "whsec_claimd_test_shop_secret";

/// The claim's history lines written by provider events: `(outcome, detail)`.
async fn event_lines(s: &claimd::store::Store, claim: &Claim) -> Vec<(String, String)> {
    s.events(claim.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "event")
        .map(|e| (e.outcome, e.detail.unwrap_or_default()))
        .collect()
}

/// Issue item 2, first way: another object carrying the same order number (message id) does
/// not decide a pending claim; the claim's own object still does.
async fn another_object_with_the_same_order_number(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();

    let other = event(
        "evt_other",
        "payment_intent.payment_failed",
        json!({"id": "pi_other_order", "status": "failed", "metadata": {"message_id": "1001"}}),
    );
    let (status, body) = ep.stripe(&other, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id.as_deref(), Some(own.as_str()));
    let unmatched = s.unmatched_provider_events(None, 10).await.unwrap();
    assert_eq!(unmatched.len(), 1, "listed for reconciliation");
    assert_eq!(unmatched[0].object_id.as_deref(), Some("pi_other_order"));

    // The real object's event still finds and settles it.
    let real = event(
        "evt_real",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded", "metadata": {"message_id": "1001"}}),
    );
    let (_, body) = ep.stripe(&real, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_object_with_the_same_order_number,
    sqlite_another_object_with_the_same_order_number_decides_nothing,
    postgres_another_object_with_the_same_order_number_decides_nothing
);

/// Issue item 2, second way: another tenant's object with the same message id does not
/// complete a tenant-less claim whose own payment was declined.
async fn another_tenants_object(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let acme = event(
        "evt_acme",
        "payment_intent.succeeded",
        json!({"id": "pi_acme", "status": "succeeded",
               "metadata": {"message_id": "1001", "key": "cards:acme:1001"}}),
    );
    let (status, body) = ep.stripe(&acme, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    claim_in(&s, "cards", "1001", ClaimState::Pending).await;

    let declined = event(
        "evt_declined",
        "payment_intent.payment_failed",
        json!({"id": claim.provider_id, "status": "failed"}),
    );
    let (_, body) = ep.stripe(&declined, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let after = claim_in(&s, "cards", "1001", ClaimState::Failed).await;
    assert_eq!(after.provider_id, claim.provider_id);
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_tenants_object,
    sqlite_another_tenants_object_decides_nothing,
    postgres_another_tenants_object_decides_nothing
);

/// Issue item 2, third way: one provider account delivers every event to every endpoint, so
/// `cards` receives `shop`'s events, signed with `cards`' own secret. `shop`'s object with
/// the same message id decides nothing for `cards`.
async fn another_consumers_object(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    ep.message("shop", "1001", "processing").await;
    let cards = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let shop = claim_in(&s, "shop", "1001", ClaimState::Pending).await;
    let shops_event = event(
        "evt_shop",
        "payment_intent.payment_failed",
        json!({"id": shop.provider_id, "status": "failed",
               "metadata": {"message_id": "1001", "key": "shop::1001"}}),
    );
    let (status, body) = ep
        .stripe_to("cards", &shops_event, now(), STRIPE_SECRET)
        .await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id, cards.provider_id);
    // Delivered to its own endpoint, it settles its own claim.
    let (_, body) = ep.stripe_to("shop", &shops_event, now(), SHOP_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "shop", "1001", ClaimState::Failed).await;
    claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_consumers_object,
    sqlite_another_consumers_object_decides_nothing,
    postgres_another_consumers_object_decides_nothing
);

/// An event that arrives while the claim's call is in flight (no provider id yet) does not
/// decide it on weaker evidence than its full key; the worker's own answer does. One that
/// carries its full key may decide it, and keeps its object id.
async fn events_during_the_call(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    let in_flight = |id: &'static str| {
        let s = s.clone();
        async move {
            eventually(Duration::from_secs(5), || async {
                s.get("cards", "", id).await.unwrap().is_some()
            })
            .await
        }
    };
    // Declined, answered after 800 ms; meanwhile a look-alike reports success.
    let sending = tokio::spawn({
        let base = ep.base.clone();
        async move {
            Endpoint { base }
                .message_with(
                    "cards",
                    "1001",
                    json!({"status": "failed", "delay_ms": 800}),
                )
                .await
        }
    });
    assert!(in_flight("1001").await);
    sending.await.unwrap();
    let look_alike = event(
        "evt_look_alike",
        "payment_intent.succeeded",
        json!({"id": "pi_look_alike", "status": "succeeded", "metadata": {"message_id": "1001"}}),
    );
    let (status, body) = ep.stripe(&look_alike, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let declined = claim_in(&s, "cards", "1001", ClaimState::Failed).await;
    assert_eq!(declined.provider_id.as_deref(), Some("obj-cards::1001"));

    // The claim's own object, named by its full key before the answer came back.
    ep.message_with(
        "cards",
        "1002",
        json!({"status": "succeeded", "delay_ms": 800}),
    )
    .await;
    assert!(in_flight("1002").await);
    let own = event(
        "evt_own",
        "payment_intent.succeeded",
        json!({"id": "obj-cards::1002", "status": "succeeded",
               "metadata": {"message_id": "1002", "key": "cards::1002"}}),
    );
    let (_, body) = ep.stripe(&own, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let done = claim_in(&s, "cards", "1002", ClaimState::Completed).await;
    assert_eq!(done.provider_id.as_deref(), Some("obj-cards::1002"));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    events_during_the_call,
    sqlite_an_event_during_the_call_needs_the_full_key,
    postgres_an_event_during_the_call_needs_the_full_key
);

/// Issue item 7: `succeeded` then `payment_failed` for the claim's own object asks a person,
/// with both pieces of evidence in the reason.
async fn failure_after_success(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();
    let succeeded = event(
        "evt_ok",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded"}),
    );
    let (_, body) = ep.stripe(&succeeded, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    let failed = event(
        "evt_failed",
        "payment_intent.payment_failed",
        json!({"id": own, "status": "failed"}),
    );
    let (status, body) = ep.stripe(&failed, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("conflict")),
        "{body}"
    );
    let parked = claim_in(&s, "cards", "1001", ClaimState::NeedsAttention).await;
    let reason = parked.last_error.clone().unwrap_or_default();
    assert!(
        reason.contains("evt_failed") && reason.contains("\"succeeded\""),
        "both pieces of evidence: {reason}"
    );
    assert_eq!(parked.provider_id.as_deref(), Some(own.as_str()));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    failure_after_success,
    sqlite_a_failure_after_success_of_its_own_object_asks_a_person,
    postgres_a_failure_after_success_of_its_own_object_asks_a_person
);

/// A claim's known provider id is never replaced: another object carrying its full key is
/// recorded (and noted in the claim's history), not applied; the claim's own object still
/// settles it.
async fn provider_id_kept(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();
    let second = event(
        "evt_second",
        "payment_intent.succeeded",
        json!({"id": "pi_second", "status": "succeeded",
               "metadata": {"message_id": "1001", "key": "cards::1001"}}),
    );
    let (status, body) = ep.stripe(&second, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("other_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id.as_deref(), Some(own.as_str()));
    let lines = event_lines(&s, &after).await;
    assert!(
        lines
            .iter()
            .any(|(o, d)| o == "other_object" && d.contains("pi_second") && d.contains(&own)),
        "{lines:?}"
    );
    let real = event(
        "evt_real",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded"}),
    );
    let (_, body) = ep.stripe(&real, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let done = claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    assert_eq!(done.provider_id.as_deref(), Some(own.as_str()));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    provider_id_kept,
    sqlite_a_known_provider_id_is_never_overwritten,
    postgres_a_known_provider_id_is_never_overwritten
);

/// The configuration refusals of invariant I9, each naming its key on one line.
#[test]
fn configurations_that_cannot_tell_claims_apart_are_refused() {
    let refusal = |consumers: String| -> String {
        let toml = config_toml("sqlite://unused.db", &consumers);
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars())
            .map(|_| ())
            .expect_err("refused")
            .to_string()
    };
    let provider = "http://127.0.0.1:9";
    // Two consumers sharing a signing secret.
    let shared = refusal(format!(
        "{}{}",
        consumer("cards", provider, "stripe", STRIPE_SECRET),
        consumer("shop", provider, "stripe", STRIPE_SECRET)
    ));
    assert!(
        shared.contains("consumers[1].provider_events.secrets") && shared.contains("\"cards\""),
        "{shared}"
    );
    assert_eq!(shared.lines().count(), 1, "{shared}");
    // A key with {tenant} and nothing that reads the tenant.
    let no_tenant = refusal(
        consumer("cards", provider, "stripe", STRIPE_SECRET)
            .replace(BINDING, "consumer_pointer = \"/metadata/consumer\"\n"),
    );
    assert!(
        no_tenant.contains("consumers[0].provider_events.tenant_pointer"),
        "{no_tenant}"
    );
    // Nothing that binds an object to this consumer.
    let unbound = refusal(
        consumer("cards", provider, "stripe", STRIPE_SECRET)
            .replace(BINDING, "tenant_pointer = \"/metadata/tenant\"\n"),
    );
    assert!(
        unbound.contains("consumers[0].provider_events.consumer_pointer"),
        "{unbound}"
    );
    // All three read as fields, or the key: taken.
    for ok in [
        consumer("cards", provider, "stripe", STRIPE_SECRET),
        consumer("cards", provider, "stripe", STRIPE_SECRET).replace(
            BINDING,
            "tenant_pointer = \"/metadata/tenant\"\nconsumer_pointer = \"/metadata/consumer\"\n",
        ),
    ] {
        let toml = config_toml("sqlite://unused.db", &ok);
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars())
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
