//! The Stripe example against a real third-party Stripe imitation: localstripe (PyPI,
//! pinned 1.15.10; `.ci/run` installs it and sets `LOCALSTRIPE`). localstripe ignores
//! `Idempotency-Key`, as some real providers do, and has no search API, so a fault proxy stands
//! between claimd and it: it forwards every call, drops the answer of the first
//! `POST /v1/payment_intents` of each key *after localstripe acted* (an ambiguous failure), and
//! serves `GET /v1/payment_intents/search` the way Stripe documents it, over localstripe's list.
//!
//! Under CI=true a missing localstripe is a failure; elsewhere the test says why it skips.

use crate::common;

use bytes::Bytes;
use claimd::config::Config;
use claimd::domain::claim::ClaimState;
use common::localstripe::*;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/stripe.toml")
}

/// The environment that points the Stripe example at `api` and fits its timings to a test.
fn example_env(store_url: &str, api: &str) -> Vec<(String, String)> {
    [
        ("STRIPE_API", api),
        ("STRIPE_SECRET_KEY", SECRET),
        ("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ("CLAIMD_STORE_URL", store_url),
        ("CLAIMD__HTTP__LISTEN", "127.0.0.1:0"),
        ("CLAIMD__SWEEPER__SCHEDULE", "* * * * * *"),
        ("CLAIMD__CONSUMERS__0__LEASE", "4s"),
        ("CLAIMD__CONSUMERS__0__EFFECT__TIMEOUT", "3s"),
        // The proxy's search is consistent at once; Stripe's is not (the example waits 90s).
        ("CLAIMD__CONSUMERS__0__EFFECT__NOT_FOUND_AFTER", "1s"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `config/examples/stripe.toml`, loaded as a user would, pointed at `api`.
fn stripe_example(store_url: &str, api: &str) -> Config {
    let path = example_path();
    let text = std::fs::read_to_string(&path).unwrap();
    Config::from_toml(&text, &path, example_env(store_url, api))
        .unwrap_or_else(|e| panic!("{e}"))
        .config
}

/// `claimd run` on the Stripe example, as a process of its own.
async fn spawn_worker(store_url: &str, api: &str, port: u16, log: &Path) -> Worker {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = std::process::Command::new(claimd_bin())
        .args(["run", "--config"])
        .arg(example_path())
        .envs(example_env(store_url, api))
        .env("CLAIMD__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("CLAIMD_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn claimd");
    Worker::attach(child, port).await
}

/// The signing secret of the example's webhook endpoint in these tests.
const WEBHOOK_SECRET: &str = "whsec_claimd_localstripe_test";

/// Posts `order-{i}` for each `i`, paid with `payment_method`, expecting `status`.
async fn post_orders(
    base: &str,
    orders: std::ops::Range<usize>,
    payment_method: &str,
    status: u16,
) {
    for i in orders {
        let r = client()
            .post(format!("{base}/v1/messages/stripe-payments"))
            .header("Idempotency-Key", format!("order-{i}"))
            .header("Content-Type", "application/json")
            .body(
                json!({"amount": 1000 + i, "currency": "eur", "order": i,
                       "payment_method": payment_method})
                .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "order-{i}");
    }
}

/// Checks that localstripe holds exactly one PaymentIntent per message of `store`, with the
/// message's amount, and none besides; returns them.
async fn one_payment_intent_each(
    ls: &LocalStripe,
    store: &claimd::store::Store,
    n: usize,
) -> Vec<Value> {
    let pis = ls.payment_intents().await;
    for i in 0..n {
        let c = order(store, i).await;
        assert_eq!(
            c.state,
            ClaimState::Completed,
            "order-{i}: {:?}",
            c.last_error
        );
        let mine: Vec<&Value> = pis
            .iter()
            .filter(|p| p["metadata"]["claimd_key"] == json!(c.idem_key))
            .collect();
        assert_eq!(mine.len(), 1, "order-{i}: exactly one PaymentIntent");
        assert_eq!(mine[0]["amount"], json!(1000 + i));
        assert_eq!(mine[0]["metadata"]["order"], json!(i.to_string()));
    }
    assert_eq!(pis.len(), n, "no PaymentIntent beyond one per message");
    pis
}

/// The claim of `order-{i}`.
async fn order(store: &claimd::store::Store, i: usize) -> claimd::domain::claim::Claim {
    store
        .get("stripe-payments", "", &format!("order-{i}"))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("order-{i} was never claimed"))
}

async fn all_completed(store: &claimd::store::Store, n: usize) -> bool {
    eventually(Duration::from_secs(60), || async {
        let mut all = true;
        for i in 0..n {
            let c = store
                .get("stripe-payments", "", &format!("order-{i}"))
                .await
                .unwrap();
            all &= c.is_some_and(|c| c.state == ClaimState::Completed);
        }
        all
    })
    .await
}

/// Each message posted twice, the first answer of each dropped after localstripe created the
/// PaymentIntent: every claim completes by search, and localstripe holds exactly one
/// PaymentIntent per message, with the amount from the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_example_creates_one_payment_intent_per_message_through_lost_answers() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let faults = Arc::new(Mutex::new(Faults::default()));
    let proxy = fault_proxy(ls.url.clone(), 1, faults.clone()).await;
    let store = TestStore::sqlite();
    let app = claimd::service::app::App::open(stripe_example(&store.url(), &proxy), true)
        .await
        .unwrap();
    let running = claimd::service::run::start(app).await.expect("start");
    let base = format!("http://{}", running.http_addr);
    const N: usize = 8;
    let card = ls.payment_method(CARD_OK).await;
    post_orders(&base, 0..N, &card, 202).await;
    post_orders(&base, 0..N, &card, 200).await;
    let s = running.app().store.clone();
    assert!(all_completed(&s, N).await, "every claim completes");
    assert_eq!(
        faults.lock().unwrap().dropped as usize,
        N,
        "every first answer was lost"
    );
    let pis = one_payment_intent_each(&ls, &s, N).await;
    for i in 0..N {
        let c = order(&s, i).await;
        assert!(c.reconciled, "order-{i} settled by the search");
        let history = s.events(c.id).await.unwrap();
        let found = history
            .iter()
            .find(|e| e.action == "lookup" && e.outcome == "found")
            .expect("a lookup found it");
        let pi = pis
            .iter()
            .find(|p| p["metadata"]["claimd_key"] == json!(c.idem_key))
            .unwrap();
        let id = pi["id"].as_str().unwrap();
        assert_eq!(
            found.detail.as_deref(),
            Some(format!("provider id {id}").as_str())
        );
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// Pointed straight at localstripe, which has no search API (every search is a `404`), the
/// Stripe example refuses to start instead of reading the 404 as "never paid".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_example_refuses_a_provider_without_the_search_api() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let store = TestStore::sqlite();
    let app = claimd::service::app::App::open(stripe_example(&store.url(), &ls.url), true)
        .await
        .unwrap();
    let Err(e) = claimd::service::run::start(app).await else {
        panic!("started")
    };
    let e = e.to_string();
    assert!(
        e.contains("consumer stripe-payments: effect.status_url") && e.contains("404"),
        "{e}"
    );
}

/// A worker SIGKILLed while localstripe's answers are held (after it created the
/// PaymentIntents): a restarted worker's sweeper finds each one by search and completes the
/// claim without creating another; duplicates sent to it are recognised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_example_survives_a_sigkill_between_the_payment_and_its_answer() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let faults = Arc::new(Mutex::new(Faults {
        hold: Duration::from_secs(30),
        ..Default::default()
    }));
    let proxy = fault_proxy(ls.url.clone(), 0, faults.clone()).await;
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workers.log");
    let port = free_port();
    let first = spawn_worker(&store.url(), &proxy, port, &log).await;
    const N: usize = 5;
    let card = ls.payment_method(CARD_OK).await;
    post_orders(&first.base, 0..N, &card, 202).await;
    let created = eventually(Duration::from_secs(30), || async {
        ls.payment_intents().await.len() == N
    })
    .await;
    assert!(created, "localstripe created the PaymentIntents");
    first.kill();
    faults.lock().unwrap().hold = Duration::ZERO;
    let second = spawn_worker(&store.url(), &proxy, port, &log).await;
    post_orders(&second.base, 0..N, &card, 200).await;
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    assert!(
        all_completed(&s, N).await,
        "every claim completes after the restart"
    );
    one_payment_intent_each(&ls, &s, N).await;
    for i in 0..N {
        let c = order(&s, i).await;
        assert!(c.reconciled && c.attempt >= 2, "order-{i}: {c:?}");
    }
    second.kill();
}

/// The outcome each test payment method comes to at localstripe, and in claimd.
const OUTCOMES: [(Method, &str, ClaimState); 5] = [
    (CARD_OK, "succeeded", ClaimState::Completed),
    // Charged and declined: the create call is answered 402 (the PaymentIntent stays
    // `requires_payment_method`).
    (CARD_DECLINED, "requires_payment_method", ClaimState::Failed),
    (SEPA_OK, "succeeded", ClaimState::Completed),
    // `processing` in the answer, then failed at the "bank" about 0.5 s later.
    (SEPA_FAILS, "requires_payment_method", ClaimState::Failed),
    (CARD_3DS, "requires_action", ClaimState::NeedsAttention),
];

/// Posts one order per entry of [`OUTCOMES`] (`order-{i}`), each paid with its method.
async fn post_outcome_orders(ls: &LocalStripe, base: &str) {
    for (i, (method, _, _)) in OUTCOMES.iter().enumerate() {
        let pm = ls.payment_method(*method).await;
        post_orders(base, i..i + 1, &pm, 202).await;
    }
}

/// Waits until each claim of [`OUTCOMES`] is in its state; then checks it against the
/// PaymentIntent localstripe holds for it. Returns whether all got there.
async fn claims_end_as_their_payment_intents(ls: &LocalStripe, s: &claimd::store::Store) {
    let settled = eventually(Duration::from_secs(60), || async {
        let mut all = true;
        for (i, (_, _, state)) in OUTCOMES.iter().enumerate() {
            all &= order(s, i).await.state == *state;
        }
        all
    })
    .await;
    let pis = ls.payment_intents().await;
    for (i, (method, pi_status, state)) in OUTCOMES.iter().enumerate() {
        let c = order(s, i).await;
        let pi = pis
            .iter()
            .find(|p| p["metadata"]["claimd_key"] == json!(c.idem_key))
            .unwrap_or_else(|| panic!("order-{i}: no PaymentIntent"));
        assert_eq!(
            pi["status"],
            json!(pi_status),
            "order-{i} ({method:?}) at localstripe"
        );
        assert!(
            settled,
            "order-{i} ({method:?}): claim {} ({:?}), PaymentIntent {}",
            c.state, c.last_error, pi["status"]
        );
        assert_eq!(
            c.state, *state,
            "order-{i} ({method:?}): {:?}",
            c.last_error
        );
        if *state != ClaimState::Failed || i != 1 {
            // The 402 of a declined card carries no PaymentIntent; every other claim knows
            // its PaymentIntent's id.
            assert_eq!(c.provider_id.as_deref(), pi["id"].as_str(), "order-{i}");
        }
    }
    assert_eq!(pis.len(), OUTCOMES.len(), "one PaymentIntent per order");
}

/// An in-process worker on the Stripe example with `pending_poll` as given, its webhook
/// endpoint registered at localstripe when `webhook` is set.
async fn outcome_worker(
    ls: &LocalStripe,
    api: &str,
    store: &TestStore,
    pending_poll: &str,
    webhook: bool,
) -> claimd::service::run::Running {
    let path = example_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut env = example_env(&store.url(), api);
    env.push((
        "CLAIMD__CONSUMERS__0__EFFECT__OUTCOME__PENDING_POLL".into(),
        pending_poll.into(),
    ));
    let config = Config::from_toml(&text, &path, env)
        .unwrap_or_else(|e| panic!("{e}"))
        .config;
    let app = claimd::service::app::App::open(config, true).await.unwrap();
    let running = claimd::service::run::start(app).await.expect("start");
    if webhook {
        ls.register_webhook(
            &format!(
                "http://{}/v1/provider-events/stripe-payments",
                running.http_addr
            ),
            WEBHOOK_SECRET,
        )
        .await;
    }
    running
}

/// Card payments (succeeded, declined, 3-D Secure) and SEPA debits (succeeded, processing
/// then failed): each claim ends in the state its PaymentIntent ends in, the pending one by
/// localstripe's signed webhook (polling is an hour away), with the event in its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_end_as_their_payment_intents_by_signed_webhooks() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let proxy = fault_proxy(ls.url.clone(), 0, Arc::new(Mutex::new(Faults::default()))).await;
    let store = TestStore::sqlite();
    let running = outcome_worker(&ls, &proxy, &store, "1h", true).await;
    let base = format!("http://{}", running.http_addr);
    post_outcome_orders(&ls, &base).await;
    let s = running.app().store.clone();
    claims_end_as_their_payment_intents(&ls, &s).await;
    let sepa = order(&s, 3).await;
    let history = s.events(sepa.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.action == "perform" && e.outcome == "pending"),
        "the debit was pending first: {history:?}"
    );
    let event = history
        .iter()
        .find(|e| e.action == "event" && e.outcome == "payment_intent.payment_failed")
        .unwrap_or_else(|| panic!("settled by the webhook: {history:?}"));
    assert!(
        event
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("signature verified (Stripe-Signature)")),
        "{event:?}"
    );
    assert!(
        !history.iter().any(|e| e.action == "poll"),
        "not polled: {history:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// The same payments with no webhook endpoint registered: the pending debit is settled by
/// polling the search API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_end_as_their_payment_intents_by_polling_without_webhooks() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let proxy = fault_proxy(ls.url.clone(), 0, Arc::new(Mutex::new(Faults::default()))).await;
    let store = TestStore::sqlite();
    let running = outcome_worker(&ls, &proxy, &store, "1s", false).await;
    let base = format!("http://{}", running.http_addr);
    post_outcome_orders(&ls, &base).await;
    let s = running.app().store.clone();
    claims_end_as_their_payment_intents(&ls, &s).await;
    let history = s.events(order(&s, 3).await.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.action == "poll" && e.outcome == "failed"),
        "settled by a poll: {history:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// Signed webhooks about PaymentIntents that only look like a claim's: another tenant's,
/// another consumer's (one Stripe account delivers every event to every endpoint) and one made
/// outside claimd, each carrying the same order number and message id. They succeed, the
/// claim's own SEPA debit fails: the claim ends `failed` with its own PaymentIntent, and the
/// three events are recorded without a claim, listed for reconciliation.
async fn look_alike_payment_intents_decide_nothing(store: TestStore) {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let proxy = fault_proxy(ls.url.clone(), 0, Arc::new(Mutex::new(Faults::default()))).await;
    let running = outcome_worker(&ls, &proxy, &store, "1h", true).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let debit = ls.payment_method(SEPA_FAILS).await;
    post_orders(&base, 0..1, &debit, 202).await;
    let card = ls.payment_method(CARD_OK).await;
    let mut others = Vec::new();
    for key in [
        Some("stripe-payments:acme:order-0"),
        Some("refunds::order-0"),
        None,
    ] {
        let mut metadata = vec![("claimd_message_id", "order-0"), ("order", "0")];
        if let Some(key) = key {
            metadata.push(("claimd_key", key));
        }
        let pi = ls.create_payment_intent(&card, &metadata).await;
        assert_eq!(pi["status"], "succeeded", "{pi}");
        others.push(pi["id"].as_str().unwrap().to_string());
    }
    let recorded = eventually(Duration::from_secs(30), || async {
        let unmatched = s.unmatched_provider_events(None, 20).await.unwrap();
        others.iter().all(|id| {
            unmatched
                .iter()
                .any(|e| e.object_id.as_deref() == Some(id.as_str()))
        })
    })
    .await;
    let failed = eventually(Duration::from_secs(30), || async {
        order(&s, 0).await.state == ClaimState::Failed
    })
    .await;
    let claim = order(&s, 0).await;
    let history = s.events(claim.id).await.unwrap();
    assert!(
        failed && recorded,
        "claim {} ({:?}), look-alikes recorded: {recorded}; {history:?}",
        claim.state,
        claim.last_error
    );
    let own = ls
        .payment_intents()
        .await
        .into_iter()
        .find(|p| p["metadata"]["claimd_key"] == json!(claim.idem_key))
        .expect("its own PaymentIntent");
    assert_eq!(own["status"], "requires_payment_method");
    assert_eq!(claim.provider_id.as_deref(), own["id"].as_str());
    assert!(
        !history.iter().any(|e| e
            .detail
            .as_deref()
            .is_some_and(|d| others.iter().any(|o| d.contains(o.as_str())))),
        "no look-alike in the claim's history: {history:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_look_alike_payment_intents_with_the_same_order_number_decide_nothing() {
    look_alike_payment_intents_decide_nothing(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_look_alike_payment_intents_with_the_same_order_number_decide_nothing() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    look_alike_payment_intents_decide_nothing(store).await;
}

/// A webhook relay that re-delivers like Stripe does: it takes each event from localstripe
/// (which sends once) and posts it to `target` until it is answered 2xx, every 200 ms for a
/// minute. Returns its URL and the count of deliveries that were not answered 2xx.
async fn retrying_relay(target: String) -> (String, Arc<Mutex<u32>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let failed = Arc::new(Mutex::new(0u32));
    let failures = failed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (target, failures) = (target.clone(), failures.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r: Request<Incoming>| {
                    let (target, failures) = (target.clone(), failures.clone());
                    async move {
                        let (parts, body) = r.into_parts();
                        let body = body.collect().await?.to_bytes();
                        tokio::spawn(async move {
                            for _ in 0..300 {
                                let mut post = client().post(&target).body(body.clone());
                                for (name, value) in &parts.headers {
                                    if name != hyper::header::HOST
                                        && name != hyper::header::CONTENT_LENGTH
                                    {
                                        post = post.header(name, value);
                                    }
                                }
                                match post.send().await {
                                    Ok(r) if r.status().is_success() => return,
                                    _ => *failures.lock().unwrap() += 1,
                                }
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        });
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, failed)
}

/// SEPA debits pending at localstripe while their worker is SIGKILLed: the failure webhooks
/// arrive while nothing listens, the relay delivers them again (as Stripe does) once a new
/// worker is up, and every claim ends failed, as its PaymentIntent did. Polling is an hour
/// away: only the events settle them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_that_arrive_while_the_worker_is_killed_are_not_lost() {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let proxy = fault_proxy(ls.url.clone(), 0, Arc::new(Mutex::new(Faults::default()))).await;
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workers.log");
    let port = free_port();
    let (relay, undelivered) = retrying_relay(format!(
        "http://127.0.0.1:{port}/v1/provider-events/stripe-payments"
    ))
    .await;
    ls.register_webhook(&relay, WEBHOOK_SECRET).await;
    let spawn = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        std::process::Command::new(claimd_bin())
            .args(["run", "--config"])
            .arg(example_path())
            .envs(example_env(&store.url(), &proxy))
            .env("CLAIMD__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env("CLAIMD__CONSUMERS__0__EFFECT__OUTCOME__PENDING_POLL", "1h")
            .env("CLAIMD_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn claimd")
    };
    let first = Worker::attach(spawn(), port).await;
    const N: usize = 6;
    let pm = ls.payment_method(SEPA_FAILS).await;
    post_orders(&first.base, 0..N, &pm, 202).await;
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    let pending = eventually(Duration::from_secs(30), || async {
        let mut all = true;
        for i in 0..N {
            all &= order(&s, i).await.state == ClaimState::Pending;
        }
        all
    })
    .await;
    assert!(pending, "every debit is pending at first");
    // localstripe fails the debits ~0.5 s later and sends each webhook ~1 s after that.
    first.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        *undelivered.lock().unwrap() > 0,
        "webhooks arrived while no worker listened"
    );
    let second = Worker::attach(spawn(), port).await;
    let failed = eventually(Duration::from_secs(30), || async {
        let mut all = true;
        for i in 0..N {
            all &= order(&s, i).await.state == ClaimState::Failed;
        }
        all
    })
    .await;
    for i in 0..N {
        let c = order(&s, i).await;
        assert!(failed, "order-{i}: {} ({:?})", c.state, c.last_error);
        let pi = ls.payment_intent(c.provider_id.as_deref().unwrap()).await;
        assert_eq!(pi["status"], json!("requires_payment_method"));
        let history = s.events(c.id).await.unwrap();
        assert!(
            history.iter().any(|e| e.action == "event"),
            "order-{i} settled by its event: {history:?}"
        );
    }
    second.kill();
}
