//! Operator accounts, roles and the operator audit, over HTTP on both stores: a wrong
//! credential is `401` and audited; a viewer reads but gets `403` (audited) for every action;
//! an operator's resolve is audited with their name and address; a disabled account's session
//! and credential are refused at the next request; the admin token acts as `admin-token`; and
//! audit rows cannot be changed or deleted (on PostgreSQL not even granted to the runtime role).

use crate::common;

use claimd::domain::operator_role::Role;
use claimd::ops::accounts;
use claimd::provider::sandbox::Sandbox;
use claimd::service::run::Running;
use claimd::store::audit::{AuditEntry, AuditFilter};
use common::pg_roles::{TwoRoles, exec};
use common::*;
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

const ADMIN: &str = "s3cret-admin-token";
const VIEWER_CRED: &str = "vera-credential-0123456789";
const OPERATOR_CRED: &str = "otto-credential-0123456789";

fn no_redirects() -> reqwest::Client {
    claimd::provider::tls::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn worker(store: TestStore, http_extra: &str) -> (TestStore, Sandbox, Running) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml_with(
        &store.url(),
        http_extra,
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    (store, sandbox, running)
}

async fn audit_of(s: &claimd::store::Store, actor: &str) -> Vec<AuditEntry> {
    s.audit(&AuditFilter {
        actor: Some(actor.into()),
        limit: 1000,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Signs in on the form; the session cookie, or the status when refused.
async fn sign_in(c: &reqwest::Client, base: &str, name: &str, cred: &str) -> Result<String, u16> {
    let r = c
        .post(format!("{base}/signin"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("name={name}&token={cred}"))
        .send()
        .await
        .unwrap();
    if r.status().as_u16() != 303 {
        assert!(r.headers().get("set-cookie").is_none());
        return Err(r.status().as_u16());
    }
    let set = r.headers()["set-cookie"].to_str().unwrap();
    Ok(set.split(';').next().unwrap().to_string())
}

fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..].split('"').next().unwrap().to_string()
}

async fn page_csrf(c: &reqwest::Client, base: &str, cookie: &str) -> String {
    let r = c
        .get(format!("{base}/"))
        .header("Cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    csrf_of(&r.text().await.unwrap())
}

async fn roles_and_audit(store: TestStore, http_extra: &str) {
    let (_store, _sandbox, running) = worker(store, http_extra).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(&s, "payments", "paid-1", "outcome unknown (timeout)").await;
    parked_claim(&s, "payments", "paid-2", "outcome unknown (timeout)").await;
    let vera = accounts::add(s.as_ref(), "vera", Role::Viewer, Some(VIEWER_CRED.into()))
        .await
        .unwrap();
    assert_eq!(vera, VIEWER_CRED);
    accounts::add(
        s.as_ref(),
        "otto",
        Role::Operator,
        Some(OPERATOR_CRED.into()),
    )
    .await
    .unwrap();
    let generated = accounts::add(s.as_ref(), "ada", Role::Admin, None)
        .await
        .unwrap();
    assert!(generated.len() >= 40, "a generated credential: {generated}");
    assert!(
        accounts::add(s.as_ref(), "vera", Role::Admin, None)
            .await
            .is_err(),
        "a name is taken once"
    );
    let c = no_redirects();

    // A wrong credential: 401, no cookie, and a line in the audit with the address.
    assert_eq!(
        sign_in(&c, &base, "vera", "not-her-credential").await,
        Err(401)
    );
    assert_eq!(sign_in(&c, &base, "nobody", VIEWER_CRED).await, Err(401));
    let refused = audit_of(&s, "vera").await;
    assert!(
        refused.iter().any(|e| e.action == "sign-in-refused"
            && e.origin == "127.0.0.1"
            && e.result.starts_with("refused: 401")),
        "{refused:?}"
    );
    let r = c
        .get(format!("{base}/v1/claims"))
        .bearer_auth("vera:not-her-credential")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // The viewer reads the page, the claims, the report and the audit.
    let cookie = sign_in(&c, &base, "vera", VIEWER_CRED).await.unwrap();
    for path in ["/", "/v1/claims", "/v1/report", "/v1/audit", "/audit"] {
        let r = c
            .get(format!("{base}{path}"))
            .header("Cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let csrf = page_csrf(&c, &base, &cookie).await;

    // ... and gets 403 for every action, each audited.
    let claim = "/v1/claims/payments/paid-1";
    let json_actions = [
        (
            format!("{claim}/resolve"),
            json!({"to": "completed", "note": "seen at the provider", "actor": "vera"}),
        ),
        (format!("{claim}/redrive"), json!({"actor": "vera"})),
        (
            format!("{claim}/cancel"),
            json!({"reason": "no", "actor": "vera"}),
        ),
    ];
    for (path, body) in &json_actions {
        let r = c
            .post(format!("{base}{path}"))
            .header("Cookie", &cookie)
            .header("X-CSRF-Token", &csrf)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{path}");
        assert!(r.text().await.unwrap().contains("role viewer"));
        // A script with the viewer's credential: the same.
        let r = c
            .post(format!("{base}{path}"))
            .bearer_auth(format!("vera:{VIEWER_CRED}"))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "bearer {path}");
    }
    let target = "payments\tt\tpaid-1\t1\t1".replace("\tt\t", "\t\t");
    for (path, action) in [
        ("/actions/preview", "redrive"),
        ("/actions/apply", "redrive"),
        ("/actions/apply", "complete"),
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .header("Cookie", &cookie)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(
                serde_urlencoded::to_string([
                    ("csrf", csrf.as_str()),
                    ("action", action),
                    ("note", "x"),
                    ("claim", &target),
                ])
                .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{path} {action}");
    }
    let lines = audit_of(&s, "vera").await;
    let forbidden: Vec<_> = lines
        .iter()
        .filter(|e| e.result.starts_with("refused: 403"))
        .collect();
    assert_eq!(forbidden.len(), 9, "{lines:?}");
    for action in ["resolve", "redrive", "cancel"] {
        assert_eq!(
            forbidden
                .iter()
                .filter(|e| e.action == action && e.target == "payments/paid-1")
                .count(),
            2,
            "{action}: {lines:?}"
        );
    }
    assert!(forbidden.iter().all(|e| e.origin == "127.0.0.1"));
    assert!(
        lines
            .iter()
            .any(|e| e.action == "sign-in" && e.source == "account")
    );
    let claim_now = s.get("payments", "", "paid-1").await.unwrap().unwrap();
    assert_eq!(
        claim_now.state.to_string(),
        "needs_attention",
        "nothing moved"
    );

    // The operator resolves with their own credential: done, audited with name and address,
    // and the claim's history names them whatever the body says.
    let r = c
        .post(format!("{base}{claim}/resolve"))
        .bearer_auth(format!("otto:{OPERATOR_CRED}"))
        .json(&json!({"to": "completed", "note": "pi_1 succeeded", "actor": "someone-else"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let lines = audit_of(&s, "otto").await;
    let done: Vec<_> = lines.iter().filter(|e| e.action == "resolve").collect();
    assert_eq!(done.len(), 1, "{lines:?}");
    assert_eq!(done[0].result, "done");
    assert_eq!(done[0].target, "payments/paid-1");
    assert_eq!(done[0].origin, "127.0.0.1");
    assert_eq!(done[0].source, "account");
    assert!(done[0].detail.contains("pi_1 succeeded"));
    let c1 = s.get("payments", "", "paid-1").await.unwrap().unwrap();
    let history = s.events(c1.id).await.unwrap();
    assert!(history.iter().any(|e| e.actor == "api:otto"), "{history:?}");
    // The operator may not manage accounts or do what has no action of its own.
    let r = c
        .post(format!("{base}{claim}/resolve"))
        .bearer_auth(format!("otto:{OPERATOR_CRED}"))
        .json(&json!({"to": "completed", "note": "again", "version": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409, "stale version");
    let lines = audit_of(&s, "otto").await;
    assert!(
        lines
            .iter()
            .any(|e| e.action == "resolve" && e.result.starts_with("refused: 409")),
        "{lines:?}"
    );

    // The operator signs in on the page; disabling the account ends the session and the
    // credential at the next request.
    let otto = sign_in(&c, &base, "otto", OPERATOR_CRED).await.unwrap();
    let r = c
        .get(format!("{base}/v1/claims"))
        .header("Cookie", &otto)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    accounts::disable(s.as_ref(), "otto").await.unwrap();
    let r = c
        .get(format!("{base}/v1/claims"))
        .header("Cookie", &otto)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "a disabled account's session");
    let r = c
        .get(format!("{base}/"))
        .header("Cookie", &otto)
        .header("Accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/signin");
    let r = c
        .post(format!("{base}/v1/claims/payments/paid-2/redrive"))
        .bearer_auth(format!("otto:{OPERATOR_CRED}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "a disabled account's credential");
    assert_eq!(sign_in(&c, &base, "otto", OPERATOR_CRED).await, Err(401));

    // A role change applies at the next request.
    accounts::set_role(s.as_ref(), "vera", Role::Operator)
        .await
        .unwrap();
    let r = c
        .post(format!("{base}/v1/claims/payments/paid-2/redrive"))
        .header("Cookie", &cookie)
        .header("X-CSRF-Token", &csrf)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());

    // Five refused tries above spent this address's credential checks (one comes back every
    // 2 s): wait as a script obeying Retry-After would, so the first check of ada's credential
    // is not refused for the throttle.
    for _ in 0..10 {
        let r = c
            .get(format!("{base}/v1/audit?limit=1"))
            .bearer_auth(format!("ada:{generated}"))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() != 429 {
            break;
        }
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    }

    // The audit reads newest first over HTTP, a page at a time.
    let r = c
        .get(format!("{base}/v1/audit?limit=2"))
        .bearer_auth(format!("ada:{generated}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page: serde_json::Value = r.json().await.unwrap();
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(entries[0]["id"].as_i64() > entries[1]["id"].as_i64());
    assert_eq!(entries[0]["actor"], "vera");
    assert_eq!(entries[0]["action"], "redrive");
    let before = page["next_before"].as_i64().unwrap();
    let older: serde_json::Value = c
        .get(format!("{base}/v1/audit?limit=2&before={before}"))
        .bearer_auth(format!("ada:{generated}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(older["entries"][0]["id"].as_i64().unwrap() < before);
    let r = c
        .get(format!("{base}/v1/audit?since=yesterday"))
        .bearer_auth(format!("ada:{generated}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_roles_and_the_audit_on_sqlite() {
    roles_and_audit(TestStore::sqlite(), &format!("admin_token = \"{ADMIN}\"")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_roles_and_the_audit_on_postgres_with_a_session_secret() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    roles_and_audit(
        store,
        "session_secret = \"0123456789abcdef0123456789abcdef-secret\"",
    )
    .await;
}

/// The admin token is the break-glass admin: it acts, recorded as `admin-token` in the audit
/// (the name given at sign-in kept beside it), and signs in on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_acts_as_admin_token() {
    let (_store, _sandbox, running) =
        worker(TestStore::sqlite(), &format!("admin_token = \"{ADMIN}\"")).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(&s, "payments", "m1", "outcome unknown").await;
    let c = no_redirects();
    let r = c
        .post(format!("{base}/v1/claims/payments/m1/redrive"))
        .bearer_auth(ADMIN)
        .json(&json!({"actor": "oncall-script"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    sign_in(&c, &base, "ann", ADMIN).await.unwrap();
    let lines = audit_of(&s, "admin-token").await;
    assert!(
        lines
            .iter()
            .any(|e| e.action == "redrive" && e.result == "done" && e.source == "admin_token"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|e| e.action == "sign-in" && e.detail == "name given: ann"),
        "{lines:?}"
    );
}

/// SQLite: the audit table refuses `UPDATE` and `DELETE` of its rows.
#[tokio::test]
async fn audit_rows_cannot_be_changed_on_sqlite() {
    let t = TestStore::sqlite();
    let store = claimd::store::open(&t.url(), 2).await.unwrap();
    store.migrate().await.unwrap();
    record_one(&store).await;
    let url = t.url();
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for sql in [
        "UPDATE operator_audit SET result = 'done'",
        "DELETE FROM operator_audit",
    ] {
        let e = conn.execute(sql).await.expect_err(sql);
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    assert_eq!(audit_of(&store, "ann").await.len(), 1);
}

async fn record_one(store: &claimd::store::Store) {
    use claimd::domain::operator_role::Identity;
    use claimd::ops::audit::{AuditAction, AuditResult, Origin, Record, record};
    record(
        store.as_ref(),
        &Record {
            who: &Identity::account("ann", Role::Operator),
            action: AuditAction::SignIn,
            target: "ann",
            origin: &Origin::Cli("ann".into()),
            result: AuditResult::Refused("403 role viewer may not".into()),
            detail: "",
        },
    )
    .await
    .unwrap();
}

/// PostgreSQL, with the migration and runtime roles of docs/postgresql.md: the runtime role
/// may insert and read audit rows, never update, delete or truncate them; and even a role
/// granted those (or the owner) is refused by the table's triggers.
#[tokio::test]
async fn audit_rows_cannot_be_changed_by_the_runtime_role_on_postgres() {
    let Some(t) = PgDb::create().await else {
        return;
    };
    let roles = TwoRoles::create(&t).await;
    let app = roles.app.clone();
    let mut su = PgConnection::connect(&roles.admin_url).await.unwrap();
    let owned = claimd::store::open(&roles.owner_url, 2).await.unwrap();
    owned.migrate().await.unwrap();
    let runtime = claimd::store::open(&roles.app_url, 2).await.unwrap();
    record_one(&runtime).await;
    assert_eq!(
        audit_of(&runtime, "ann").await.len(),
        1,
        "INSERT and SELECT"
    );
    let mut c = PgConnection::connect(&roles.app_url).await.unwrap();
    for sql in [
        "UPDATE operator_audit SET result = 'done'",
        "DELETE FROM operator_audit",
        "TRUNCATE operator_audit",
    ] {
        let e = exec(&mut c, sql).await.expect_err(sql);
        assert!(e.to_string().contains("permission denied"), "{sql}: {e}");
    }
    // The runtime role may still change its other tables.
    exec(&mut c, "UPDATE ledger_runs SET summary = summary")
        .await
        .unwrap();
    // Granted UPDATE and DELETE by hand (the docs' "grant what exists" for an old database),
    // or as the owner: the triggers refuse.
    exec(
        &mut su,
        &format!("GRANT UPDATE, DELETE ON operator_audit TO {app}"),
    )
    .await
    .unwrap();
    let mut owner_c = PgConnection::connect(&roles.owner_url).await.unwrap();
    for conn in [&mut c, &mut owner_c] {
        for sql in [
            "UPDATE operator_audit SET result = 'done'",
            "DELETE FROM operator_audit",
        ] {
            let e = exec(conn, sql).await.expect_err(sql);
            assert!(e.to_string().contains("append-only"), "{sql}: {e}");
        }
    }
    let e = exec(&mut owner_c, "TRUNCATE operator_audit")
        .await
        .expect_err("truncate");
    assert!(e.to_string().contains("append-only"), "{e}");
    assert_eq!(audit_of(&runtime, "ann").await.len(), 1);
}

/// `claimd operators ...` and `claimd audit` from the command line: a generated credential is
/// printed once and signs in; one read from stdin too; list, set-role, disable; each change a
/// line of the audit from `cli:<OS user>`, by the named operator.
#[test]
fn operators_and_the_audit_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n",
            dir.path().join("claims.db").display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let env = [("CLAIMD_OPERATOR", "root-ann"), ("USER", "ann")];
    let run = |args: &[&str]| {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend_from_slice(args);
        cli_with_env(&all, &env)
    };
    assert_eq!(run(&["migrate"]).0, 0);
    let (code, out, err) = run(&["operators", "add", "ann.lee", "--role", "operator"]);
    assert_eq!(code, 0, "{err}");
    let cred = out.lines().nth(1).unwrap().trim().to_string();
    assert_eq!(cred.len(), 43, "{out}");
    assert!(out.contains("Bearer ann.lee:<credential>"), "{out}");

    let mut child = std::process::Command::new(claimd_bin())
        .args([
            "--config",
            &cfg,
            "operators",
            "add",
            "bot",
            "--role",
            "viewer",
            "--credential-stdin",
        ])
        .envs(env)
        .env("CLAIMD_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"bot-credential-0123456789\n")
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(done.status.success());
    assert!(!String::from_utf8_lossy(&done.stdout).contains("bot-credential"));

    let (code, _, err) = run(&["operators", "add", "ann.lee", "--role", "admin"]);
    assert_eq!(code, 2);
    assert!(err.contains("exists already"), "{err}");
    let (code, _, err) = run(&["operators", "add", "bad name", "--role", "admin"]);
    assert_eq!(code, 2);
    assert!(err.contains("letters, digits"), "{err}");
    let (code, _, err) = run(&["operators", "add", "x", "--role", "root"]);
    assert_eq!(code, 2, "{err}");

    assert_eq!(run(&["operators", "set-role", "ann.lee", "admin"]).0, 0);
    assert_eq!(run(&["operators", "disable", "bot"]).0, 0);
    let (code, _, err) = run(&["operators", "disable", "bot"]);
    assert_eq!(code, 2, "disabled already: {err}");
    let (code, out, _) = run(&["operators", "list", "--format", "json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["name"], "ann.lee");
    assert_eq!(list[0]["role"], "admin");
    assert!(list[0]["disabled_utc"].is_null());
    assert_eq!(list[1]["name"], "bot");
    assert!(list[1]["disabled_utc"].is_string());
    assert!(!out.contains("pbkdf2"), "no hash shown: {out}");

    let (code, out, err) = run(&["audit", "--actor", "root-ann", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let seen: Vec<String> = lines
        .iter()
        .map(|l| {
            format!(
                "{} {} {} {}",
                l["action"].as_str().unwrap(),
                l["target"].as_str().unwrap(),
                l["origin"].as_str().unwrap(),
                l["result"].as_str().unwrap().split(':').next().unwrap()
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            "account-disable bot cli:ann refused",
            "account-disable bot cli:ann done",
            "account-set-role ann.lee cli:ann done",
            "account-add bad name cli:ann refused",
            "account-add ann.lee cli:ann refused",
            "account-add bot cli:ann done",
            "account-add ann.lee cli:ann done",
        ],
        "newest first"
    );
    assert!(lines.iter().all(|l| l["source"] == "cli"));
    let (code, out, _) = run(&["audit", "--since", "1h", "--limit", "2"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 3, "a header and two lines: {out}");
    let (code, _, err) = run(&["audit", "--since", "yesterday"]);
    assert_eq!(code, 2);
    assert!(err.contains("neither a duration"), "{err}");
}

/// Sensitive fields are shown in full only to a person signed in with an admin's own account;
/// erasure is an admin's action: an operator's is refused `403`, an admin's is done, and both
/// are in the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_account_sees_card_numbers_and_erases() {
    let (_store, _sandbox, running) =
        worker(TestStore::sqlite(), &format!("admin_token = \"{ADMIN}\"")).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let ada = accounts::add(s.as_ref(), "ada", Role::Admin, None)
        .await
        .unwrap();
    accounts::add(
        s.as_ref(),
        "otto",
        Role::Operator,
        Some(OPERATOR_CRED.into()),
    )
    .await
    .unwrap();
    let c = no_redirects();
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "card-1")
        .header("Content-Type", "application/json")
        .body(r#"{"amount": 100, "card_number": "4242424242424242"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            s.get("payments", "", "card-1")
                .await
                .unwrap()
                .is_some_and(|c| c.state == claimd::domain::claim::ClaimState::Completed)
        })
        .await,
        "the payment completes"
    );
    let read = |bearer: String| {
        let c = c.clone();
        let url = format!("{base}/v1/claims/payments/card-1");
        async move {
            let r = c.get(url).bearer_auth(bearer).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.text().await.unwrap()
        }
    };
    let as_otto = read(format!("otto:{OPERATOR_CRED}")).await;
    assert!(!as_otto.contains("4242424242424242"), "{as_otto}");
    assert!(as_otto.contains("4242"), "the last four stay: {as_otto}");
    let as_token = read(ADMIN.to_string()).await;
    assert!(
        !as_token.contains("4242424242424242"),
        "the shared token is not a person"
    );
    let as_ada = read(format!("ada:{ada}")).await;
    assert!(as_ada.contains("4242424242424242"), "{as_ada}");

    let erase = |bearer: String| {
        let c = c.clone();
        let url = format!("{base}/v1/erasures");
        async move {
            c.post(url)
                .bearer_auth(bearer)
                .json(&json!({"consumer": "payments", "message_id": "card-1", "note": "DSR-7"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(erase(format!("otto:{OPERATOR_CRED}")).await, 403);
    assert_eq!(erase(format!("ada:{ada}")).await, 200);
    let claim = s.get("payments", "", "card-1").await.unwrap().unwrap();
    assert!(claim.payload.is_empty(), "erased");
    let refused = audit_of(&s, "otto").await;
    assert!(
        refused
            .iter()
            .any(|e| e.action == "erase" && e.result.starts_with("refused: 403")),
        "{refused:?}"
    );
    let done = audit_of(&s, "ada").await;
    assert!(
        done.iter().any(|e| e.action == "erase"
            && e.result == "done"
            && e.target == "payments/card-1"
            && e.detail.starts_with("1 erased")),
        "{done:?}"
    );
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
