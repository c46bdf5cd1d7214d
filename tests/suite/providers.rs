//! Driving real provider APIs safely: secrets that must be set, request shaping, status checks
//! that read the answer and the cap on re-sends, against the sandbox and a user's provider.

use crate::common;

use claimd::domain::claim::{Claim, ClaimState};
use claimd::provider::sandbox::{Sandbox, SandboxModes, SandboxOptions};
use common::*;
use std::time::Duration;

/// An unset `${VAR}` in a provider header stops the commands that call the provider with exit
/// 2 naming the key; with the default written out they start.
#[test]
fn an_unset_provider_secret_refuses_to_start() {
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    )
    .replace(
        "Bearer provider-secret-token",
        "Bearer ${CLAIMD_TEST_UNSET_SECRET_7C1}",
    );
    std::fs::write(&cfg, &toml).unwrap();
    // A command that calls the provider (`run`, `sweep`, `reconcile`) needs its secret.
    let (code, _out, err) = cli(&["sweep", "--dry-run", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("consumers[0].effect.headers.Authorization")
            && err.contains("CLAIMD_TEST_UNSET_SECRET_7C1"),
        "{err}"
    );
    std::fs::write(&cfg, toml.replace("SECRET_7C1}", "SECRET_7C1:-}")).unwrap();
    let (code, _out, err) = cli(&["migrate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

async fn post(base: &str, key: &str, body: &str) -> u16 {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn wait_state(store: &claimd::store::Store, id: &str, state: ClaimState) -> Claim {
    eventually(Duration::from_secs(30), || async {
        let c = store.get("payments", "", id).await.unwrap();
        c.is_some_and(|c| c.state == state)
    })
    .await;
    let c = store
        .get("payments", "", id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{id} was never claimed"));
    assert_eq!(c.state, state, "{id}: {:?}", c.last_error);
    c
}

/// Starts a sandbox shaped by `modes`.
async fn shaped_sandbox(options: SandboxOptions, modes: SandboxModes) -> (Sandbox, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sb = Sandbox::with_modes(options, modes);
    let served = sb.clone();
    tokio::spawn(async move {
        let _ = served.serve(listener, std::future::pending()).await;
    });
    (sb, url)
}

/// One worker in this process with the consumer `consumer(provider_url)` gives, against a
/// sandbox shaped by `options` and `modes`.
struct Setup {
    sandbox: Sandbox,
    running: claimd::service::run::Running,
    base: String,
    store: claimd::store::Store,
    _db: TestStore,
}

async fn setup(
    options: SandboxOptions,
    modes: SandboxModes,
    consumer: impl FnOnce(&str) -> String,
) -> Setup {
    let db = TestStore::sqlite();
    let (sandbox, provider) = shaped_sandbox(options, modes).await;
    let running = start(&config_toml(&db.url(), &consumer(&provider))).await;
    Setup {
        sandbox,
        base: format!("http://{}", running.http_addr),
        store: running.app().store.clone(),
        running,
        _db: db,
    }
}

/// A provider that ignores keys and applies every call, whose answers are always lost: under
/// `on_unknown = "redrive"` claimd sends at most `max_sends` times, records each re-send with
/// its reason, counts them in `report` and `/metrics`, and parks the claim saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_are_recorded_counted_and_capped_by_max_sends() {
    let Setup {
        sandbox,
        running,
        base,
        store: s,
        _db,
    } = setup(
        SandboxOptions {
            ignore_keys: true,
            ambiguous_rate: 1.0,
            ..Default::default()
        },
        SandboxModes::default(),
        |provider| {
            consumer_toml(
                "payments",
                provider,
                "on_unknown = \"redrive\"\nmax_sends = 3\nkey = \"{message_id}\"",
            )
        },
    )
    .await;
    assert_eq!(post(&base, "pay-1", "{}").await, 202);
    let c = wait_state(&s, "pay-1", ClaimState::NeedsAttention).await;
    let why = c.last_error.clone().unwrap();
    assert!(why.contains("max_sends = 3"), "{why}");
    assert_eq!(c.resent_count, 2);
    let applied: u64 = sandbox
        .effects()
        .iter()
        .filter(|e| e.key == "pay-1")
        .map(|e| e.applied)
        .sum();
    assert_eq!(applied, 3, "the first send and two re-sends, no more");
    let history = s.events(c.id).await.unwrap();
    let resends: Vec<_> = history.iter().filter(|e| e.action == "resend").collect();
    assert_eq!(resends.len(), 3, "{:?}", lines(&history));
    assert!(
        resends[..2].iter().all(|e| e.outcome == "unknown_outcome"
            && e.detail
                .as_deref()
                .unwrap_or("")
                .contains("outcome was unknown")),
        "{:?}",
        lines(&history)
    );
    assert_eq!(resends[2].outcome, "capped");
    // Several sweeper passes later nothing more was sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sandbox.requests(), 3);
    let report = get_json(&format!("{base}/v1/report")).await;
    let payments = report["consumers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["consumer"] == "payments"))
        .cloned()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(payments["resent"], 1, "{payments}");
    let metrics = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("claimd_resent_total{consumer=\"payments\",reason=\"unknown_outcome\"} 2"),
        "{metrics}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// Under `reconcile`, the unknown call is in the history before the lookup that found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unknown_call_before_an_inline_lookup_is_in_the_history() {
    let Setup {
        sandbox: _,
        running,
        base,
        store: s,
        _db,
    } = setup(
        SandboxOptions {
            ambiguous_rate: 1.0,
            ..Default::default()
        },
        SandboxModes::default(),
        |provider| consumer_toml("payments", provider, "key = \"{message_id}\""),
    )
    .await;
    assert_eq!(post(&base, "pay-2", "{}").await, 202);
    let c = wait_state(&s, "pay-2", ClaimState::Completed).await;
    assert!(c.reconciled);
    let history = lines(&s.events(c.id).await.unwrap());
    assert_eq!(
        history,
        ["perform unknown", "lookup found", "reconcile found"],
        "{history:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A consumer whose status check is a search: `200` with a list, found when `/data/0` exists.
fn search_consumer(provider: &str, extra: &str, effect_extra: &str) -> String {
    format!(
        "{}{effect_extra}\n[consumers.effect.status]\nnot_found_status = []\nfound_pointer = \"/data/0\"\nid_pointer = \"/data/0/key\"\n",
        consumer_toml("payments", provider, extra).replace(
            &format!("status_url = \"{provider}/v1/effects/{{key}}\""),
            &format!("status_url = \"{provider}/v1/search?key={{key}}\""),
        )
    )
}

fn applied(sandbox: &Sandbox, key: &str) -> u64 {
    sandbox
        .effects()
        .iter()
        .filter(|e| e.key == key)
        .map(|e| e.applied)
        .sum()
}

/// The status check reads the body: a search answering `200` with an empty list is "not
/// found", one with a match is "found", and the provider's id is in the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_status_check_reads_the_body_and_keeps_the_providers_id() {
    let Setup {
        sandbox,
        running,
        base,
        store: s,
        _db,
    } = setup(
        SandboxOptions {
            ambiguous_rate: 1.0,
            ..Default::default()
        },
        SandboxModes::default(),
        |provider| search_consumer(provider, "key = \"{message_id}\"", ""),
    )
    .await;
    assert_eq!(post(&base, "pay-3", "{}").await, 202);
    let c = wait_state(&s, "pay-3", ClaimState::Completed).await;
    assert!(c.reconciled);
    assert_eq!(applied(&sandbox, "pay-3"), 1);
    let history = s.events(c.id).await.unwrap();
    let found = history
        .iter()
        .find(|e| e.action == "lookup" && e.outcome == "found")
        .unwrap_or_else(|| panic!("{:?}", lines(&history)));
    assert_eq!(found.detail.as_deref(), Some("provider id pay-3"));
    running.shutdown(Duration::from_secs(5)).await;
}

/// A status endpoint that does not exist (every lookup `404`) fails the start-up probe of a
/// search-shaped check: `run` refuses to start, naming the consumer and the key; with
/// `probe = "warn"` it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_endpoint_that_does_not_exist_is_refused_at_start() {
    let store = TestStore::sqlite();
    let (_sandbox, provider) = shaped_sandbox(
        SandboxOptions::default(),
        SandboxModes {
            lookup_missing: true,
            ..Default::default()
        },
    )
    .await;
    let toml = config_toml(&store.url(), &search_consumer(&provider, "", ""));
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let Err(e) = claimd::service::run::start(app).await else {
        panic!("started")
    };
    let e = e.to_string();
    assert!(
        e.contains("consumer payments: effect.status_url") && e.contains("404"),
        "{e}"
    );
    let warn = toml.replace("found_pointer = ", "probe = \"warn\"\nfound_pointer = ");
    let app = claimd::service::app::App::open(load(&warn), true)
        .await
        .unwrap();
    let running = claimd::service::run::start(app)
        .await
        .expect("starts with a warning");
    running.shutdown(Duration::from_secs(5)).await;
}

/// A search that shows an effect only 3 s after it was applied, a provider that ignores keys
/// and answers that are always lost: with `not_found_after = "4s"` the early "not found" is
/// not trusted, and the claim settles by lookup with the effect applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_is_trusted_only_after_not_found_after() {
    let Setup {
        sandbox,
        running,
        base,
        store: s,
        _db,
    } = setup(
        SandboxOptions {
            ambiguous_rate: 1.0,
            ignore_keys: true,
            ..Default::default()
        },
        SandboxModes {
            lookup_delay: Duration::from_secs(3),
            ..Default::default()
        },
        |provider| {
            search_consumer(
                provider,
                "key = \"{message_id}\"",
                "not_found_after = \"4s\"",
            )
        },
    )
    .await;
    assert_eq!(post(&base, "pay-4", "{}").await, 202);
    let c = wait_state(&s, "pay-4", ClaimState::Completed).await;
    assert!(c.reconciled);
    assert_eq!(applied(&sandbox, "pay-4"), 1, "sent once");
    assert_eq!(c.resent_count, 0);
    running.shutdown(Duration::from_secs(5)).await;
}

/// Square's shape: a JSON body built from the payload with the key in a body field and no
/// key header. A payload without a field the template needs is refused with 422, unclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_template_carries_the_key_in_a_field() {
    let Setup {
        sandbox,
        running,
        base,
        store: s,
        _db,
    } = setup(
        SandboxOptions::default(),
        SandboxModes {
            key_field: Some("idempotency_key".into()),
            ..Default::default()
        },
        |provider| {
            consumer_toml("payments", provider, "key = \"{message_id}\"").replace(
                "timeout = \"1s\"",
                "timeout = \"1s\"\nidempotency_header = \"\"\nbody = \"json\"\nbody_template = { idempotency_key = \"{key}\", amount_money = { amount = \"{amount}\", currency = \"EUR\" } }",
            )
        },
    )
    .await;
    assert_eq!(post(&base, "sq-1", r#"{"amount": 1250}"#).await, 202);
    wait_state(&s, "sq-1", ClaimState::Completed).await;
    assert_eq!(applied(&sandbox, "sq-1"), 1);
    let r = client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "sq-2")
        .body(r#"{"currency": "EUR"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let text = r.text().await.unwrap();
    assert!(text.contains("no field \\\"amount\\\""), "{text}");
    assert!(s.get("payments", "", "sq-2").await.unwrap().is_none());
    running.shutdown(Duration::from_secs(5)).await;
}

/// A claim that outlasts one effect timeout (a provider answering 503 while the lease allows
/// retries) does not hold the sweeper pass: the pass reports it as finishing in the background
/// and returns, while the claim keeps being driven under its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_claim_does_not_hold_a_sweeper_pass() {
    use common::provider::{Script, TestProvider};
    let store = TestStore::sqlite();
    let provider = TestProvider::start(Script {
        fail_first: 1000,
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml(
            "payments",
            &provider.url,
            "lease = \"20s\"\nkey = \"{message_id}\"",
        ),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    app.store
        .claim(&orphan_claim("payments", "", "slow-1", "slow-1"))
        .await
        .unwrap();
    // The orphan's lease ends the millisecond it is written: a pass within that millisecond
    // does not see it as stale yet (`lease_until < now`), and found nothing once on CI.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let sweeper = claimd::engine::sweeper::Sweeper::new(app.claimer.clone(), 10);
    let pass = sweeper.pass(false).await.unwrap();
    assert_eq!(pass.items.len(), 1, "{pass:?}");
    assert!(
        pass.items[0].result.contains("finishing in the background"),
        "{pass:?}"
    );
    let c = app
        .store
        .get("payments", "", "slow-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.state, ClaimState::Started);
    // The claim is still being driven after the pass returned.
    let before = provider.requests("slow-1");
    assert!(
        eventually(Duration::from_secs(10), || async {
            provider.requests("slow-1") > before
        })
        .await
    );
}

/// Every configuration in `config/examples/` loads as shipped once its secrets are set, and
/// refuses to start, naming the key, when they are not.
#[test]
fn every_example_configuration_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples");
    let secrets = [
        ("STRIPE_SECRET_KEY", "sk_test_x"),
        ("STRIPE_WEBHOOK_SECRET", "whsec_x"),
        ("SQUARE_ACCESS_TOKEN", "sq-x"),
        ("SMS_API_TOKEN", "sms-x"),
    ];
    let mut loaded = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let env = secrets.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let l =
            claimd::config::Config::from_toml(&text, &path, env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.config.consumers.len(), 1, "{}", path.display());
        let e = claimd::config::Config::from_toml(&text, &path, std::iter::empty())
            .err()
            .unwrap_or_else(|| panic!("{} starts without its secret", path.display()))
            .to_string();
        assert!(e.contains("effect.headers.Authorization"), "{e}");
        loaded.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    loaded.sort();
    assert_eq!(loaded, ["sms.toml", "square.toml", "stripe.toml"]);
}

/// `http_version = "2"`: calls in flight together share one connection to the provider (a
/// thirty-call burst of 300 ms calls opens one), each is applied once, and a call whose
/// answer is lost on its stream (a reset, or a `500`) is still settled by its lookup on the
/// same connection. The default, HTTP/1.1, holds a connection per call in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_2_carries_every_call_on_one_connection() {
    for (version, ambiguous) in [("\"2\"", 0.0), ("\"2\"", 1.0), ("\"1.1\"", 0.0)] {
        let Setup {
            sandbox,
            running,
            base,
            store: s,
            _db,
        } = setup(
            SandboxOptions {
                latency: Duration::from_millis(300),
                ambiguous_rate: ambiguous,
                ..Default::default()
            },
            SandboxModes::default(),
            |provider| {
                format!(
                    "{}http_version = {version}\n",
                    consumer_toml("payments", provider, "key = \"{message_id}\"")
                )
            },
        )
        .await;
        let posts = (0..30).map(|i| {
            let base = base.clone();
            async move { post(&base, &format!("h-{i}"), "{}").await }
        });
        let codes = futures_util::future::join_all(posts).await;
        assert!(codes.iter().all(|&c| c == 202), "{codes:?}");
        for i in 0..30 {
            let key = format!("h-{i}");
            let c = wait_state(&s, &key, ClaimState::Completed).await;
            assert_eq!(c.reconciled, ambiguous > 0.0, "{version}: {key}");
            assert_eq!(applied(&sandbox, &key), 1, "{version}: {key}");
        }
        let connections = sandbox.connections();
        if version == "\"2\"" {
            assert_eq!(connections, 1, "{version}, ambiguous {ambiguous}");
        } else {
            assert!(connections >= 10, "HTTP/1.1 opened only {connections}");
        }
        running.shutdown(Duration::from_secs(5)).await;
    }
}
