//! What the intake tokens may read, over a real socket to an in-process worker: a tenant's
//! token (`[http] tenant_tokens`) submits and reads only its own tenant's messages (another
//! tenant's, or none, is `403` before anything is read, the same whether the claim exists);
//! the all-tenant `intake_token` reads every tenant; a wrong token is `401`. Bad tenant tokens
//! stop the real binary with exit 2 naming the key, never the token.

use super::common::*;
use std::time::Duration;

const ALL: &str = "intake-all-tenants-0123456789";
const ACME: &str = "acme-intake-token-0123456789";
const GLOBEX: &str = "globex-intake-token-0123456789";
const ADMIN: &str = "admin-token-0123456789abcdef";

fn http_tokens() -> String {
    format!(
        "admin_token = \"{ADMIN}\"\nintake_token = \"{ALL}\"\ntenant_tokens = {{ acme = \"{ACME}\", globex = \"{GLOBEX}\" }}"
    )
}

/// One intake request: `POST` (with a body) or `GET` of `payments/order`, with `token` and
/// `Tenant-Id: tenant` when given. Answers the status and the JSON body.
async fn intake(
    base: &str,
    post: Option<&str>,
    order: &str,
    token: Option<&str>,
    tenant: Option<&str>,
) -> (u16, serde_json::Value, reqwest::header::HeaderMap) {
    let c = client();
    let mut req = match post {
        Some(body) => c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", order)
            .header("Content-Type", "application/json")
            .header("Prefer", "wait=5")
            .body(body.to_string()),
        None => c.get(format!("{base}/v1/messages/payments/{order}")),
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(t) = tenant {
        req = req.header("Tenant-Id", t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, json, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_token_submits_and_reads_only_its_own_tenant() {
    let (_store, sandbox, running) = payments_worker(&http_tokens()).await;
    let base = format!("http://{}", running.http_addr);
    let charge = r#"{"amount": 1200, "currency": "EUR"}"#;

    // globex pays order-1 and sees its outcome, with the provider's answer.
    let (s, globex_order, _) =
        intake(&base, Some(charge), "order-1", Some(GLOBEX), Some("globex")).await;
    assert!(s == 200 || s == 202, "{s} {globex_order}");
    let (s, globex_order, _) = intake(&base, None, "order-1", Some(GLOBEX), Some("globex")).await;
    assert_eq!(s, 200, "{globex_order}");
    assert_eq!(globex_order["tenant"], "globex");

    // acme's token: its own tenant is fine, for a message id globex also used.
    let (s, v, _) = intake(&base, Some(charge), "order-1", Some(ACME), Some("acme")).await;
    assert!(s == 200 || s == 202, "{s} {v}");
    assert_eq!(v["duplicate"], false, "{v}");
    let (s, v, _) = intake(&base, None, "order-1", Some(ACME), Some("acme")).await;
    assert_eq!((s, v["tenant"].as_str()), (200, Some("acme")), "{v}");

    // acme's token naming globex: 403, the same for a claim that exists and one that does not,
    // and nothing of globex's claim in it.
    let (s, exists, _) = intake(&base, None, "order-1", Some(ACME), Some("globex")).await;
    let (s2, missing, _) = intake(&base, None, "order-404", Some(ACME), Some("globex")).await;
    assert_eq!((s, s2), (403, 403), "{exists} / {missing}");
    assert_eq!(
        exists, missing,
        "the answer must not tell whether the claim exists"
    );
    let detail = exists["detail"].as_str().unwrap();
    assert!(
        detail.contains(r#"tenant "acme"'s"#) && detail.contains(r#"Tenant-Id "globex""#),
        "{detail}"
    );
    assert!(exists.get("provider_answer").is_none() && exists.get("state").is_none());

    // Replaying globex's POST with acme's token, or a new one for globex: 403, nothing recorded.
    let (s, v, h) = intake(&base, Some(charge), "order-1", Some(ACME), Some("globex")).await;
    assert_eq!(s, 403, "{v}");
    assert!(h.get("idempotent-replayed").is_none());
    let (s, v, _) = intake(&base, Some(charge), "order-2", Some(ACME), Some("globex")).await;
    assert_eq!(s, 403, "{v}");

    // Without Tenant-Id a tenant's token names no tenant's claims: 403 saying what to send.
    let (s, v, _) = intake(&base, Some(charge), "order-3", Some(ACME), None).await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("send Tenant-Id: acme"),
        "{v}"
    );
    let (s, _, _) = intake(&base, None, "order-1", Some(ACME), None).await;
    assert_eq!(s, 403);

    // The all-tenant token reads every tenant; globex's claim is as it was (no duplicate
    // counted from the refused replay), and nothing was recorded for the refused posts.
    let (s, now, _) = intake(&base, None, "order-1", Some(ALL), Some("globex")).await;
    assert_eq!(s, 200, "{now}");
    assert_eq!(now["duplicates"], 0, "{now}");
    assert_eq!(globex_order["state"], "completed", "{globex_order}");
    assert_eq!(now["state"], "completed");
    assert_eq!(now["provider_answer"], globex_order["provider_answer"]);
    assert!(now["provider_answer"].is_string(), "{now}");
    let (s, v, _) = intake(&base, None, "order-1", Some(ALL), Some("acme")).await;
    assert_eq!((s, v["tenant"].as_str()), (200, Some("acme")));
    for (order, tenant) in [
        ("order-2", Some("globex")),
        ("order-3", None),
        ("order-3", Some("acme")),
    ] {
        let (s, v, _) = intake(&base, None, order, Some(ALL), tenant).await;
        assert_eq!(s, 404, "{order} {tenant:?}: {v}");
    }
    let effects = sandbox.effects();
    let keys: Vec<&str> = effects.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["payments:acme:order-1", "payments:globex:order-1"],
        "only the two accepted payments reached the provider"
    );

    // Wrong, missing, or the admin token: 401 with WWW-Authenticate, for every tenant.
    for token in [Some("acme-intake-token-0123456788"), None, Some(ADMIN)] {
        for tenant in [Some("acme"), Some("globex"), None] {
            let (s, v, h) = intake(&base, None, "order-1", token, tenant).await;
            assert_eq!(s, 401, "{token:?} {tenant:?}: {v}");
            assert_eq!(h["www-authenticate"], "Bearer");
            assert!(
                v["detail"].as_str().unwrap().contains("tenant_tokens"),
                "{v}"
            );
        }
    }
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_tokens_alone_close_intake_to_requests_without_a_token() {
    let http = format!("tenant_tokens = {{ acme = \"{ACME}\" }}");
    let (_store, provider, running) = payments_worker(&http).await;
    let base = format!("http://{}", running.http_addr);
    let body = r#"{"amount": 100, "currency": "EUR"}"#;
    // No all-tenant token: a request without a token is no longer let through as local.
    let (s, v, _) = intake(&base, Some(body), "o-1", None, Some("acme")).await;
    assert_eq!(s, 401, "{v}");
    let (s, v, _) = intake(&base, Some(body), "o-1", Some(ACME), Some("acme")).await;
    assert!(s == 200 || s == 202, "{s} {v}");
    let (s, v, _) = intake(&base, None, "o-1", None, Some("acme")).await;
    assert_eq!(s, 401, "{v}");
    assert_eq!(provider.effects().len(), 1);
    running.shutdown(Duration::from_secs(2)).await;

    // On an address that is not loopback a tenant token is a token: claimd starts without
    // allow_open_intake.
    let store = TestStore::sqlite();
    let (_provider, provider_url) = sandbox(Default::default()).await;
    let toml = config_toml_with(
        &store.url(),
        &format!("admin_token = \"{ADMIN}\"\n{http}"),
        &consumer_toml("payments", &provider_url, ""),
    )
    .replace("listen = \"127.0.0.1:0\"", "listen = \"0.0.0.0:0\"");
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let running = claimd::service::run::start(app)
        .await
        .expect("tenant tokens are intake tokens: no allow_open_intake needed");
    running.shutdown(Duration::from_secs(2)).await;
}

#[test]
fn bad_tenant_tokens_stop_the_binary_naming_the_key_not_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("c.db").display());
    let cases = [
        (
            format!("admin_token = \"{ADMIN}\"\ntenant_tokens = {{ acme = \"{ADMIN}\" }}"),
            "http.tenant_tokens.acme: is the same as http.admin_token",
            Some(ADMIN),
        ),
        (
            "tenant_tokens = { acme = \"short-secret\" }".to_string(),
            "http.tenant_tokens.acme: is 12 characters",
            Some("short-secret"),
        ),
        (
            // An unset variable gives an empty token, not an open door.
            "tenant_tokens = { acme = \"${CLAIMD_TEST_UNSET_ACME_TOKEN}\" }".to_string(),
            "http.tenant_tokens.acme: is 0 characters",
            None,
        ),
        (
            format!("tenant_tokens = {{ acme = \"{ACME}\", globex = \"{ACME}\" }}"),
            "http.tenant_tokens.acme: is the same as the token of tenant \"globex\"",
            Some(ACME),
        ),
    ];
    for (http, says, secret) in cases {
        let path = dir.path().join("claimd.toml");
        let toml = config_toml_with(
            &db,
            &http,
            &consumer_toml("payments", "http://127.0.0.1:9", ""),
        );
        std::fs::write(&path, toml).unwrap();
        let (code, out, err) = cli(&["run", "--config", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{http}: {out}{err}");
        assert!(err.contains(says), "{http}: {err}");
        if let Some(secret) = secret {
            assert!(!err.contains(secret) && !out.contains(secret), "{err}");
        }
    }
}

/// The README's command table names every flag `claimd sandbox --help` offers: a user copying
/// the line for Square's shape needs `--key-field`.
#[test]
fn the_readme_sandbox_line_lists_every_flag_of_claimd_sandbox() {
    let (code, help, err) = cli(&["sandbox", "--help"]);
    assert_eq!(code, 0, "{err}");
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
        .filter(|f| !["--help", "--config", "--log-format"].contains(f))
        .collect();
    assert!(flags.contains(&"--key-field"), "{help}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("| `claimd sandbox"))
        .expect("the README lists claimd sandbox");
    for flag in flags {
        assert!(
            line.contains(&format!("[{flag}")),
            "README's sandbox line lacks {flag}: {line}"
        );
    }
}
