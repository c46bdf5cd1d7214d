//! Hostile input stays inert (issue 24): text that clients and providers wrote (a provider's
//! answer, a reason, a history line) reaches the operator's terminal with its control and bidi
//! characters written out, never as escape sequences; configuration errors show no secret and
//! read no endless file; a reconcile that could decide nothing fails; a payload field in the
//! provider URL works, and a payload with a key twice is refused at intake.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::store::{ClaimOutcome, NewEvent, Settlement};
use common::*;
use std::time::{Duration, Instant};

/// What a hostile provider answers: colours, a window title (OSC 0), a fake link (OSC 8),
/// a clipboard write (OSC 52), a forged row after CR/LF, cursor-up and erase-line, a C1 CSI,
/// DEL and a right-to-left override.
const HOSTILE: &str = "400 invalid value for name: \x1b[31mred\x1b[0m \x1b]0;pwned title\x07 \
\x1b]8;;https://evil.example/\x1b\\click here\x1b]8;;\x1b\\ \x1b]52;c;cm0gLXJmIH4=\x07\r\n\
payments  acme  forged-row  completed  1\x1b[1A\x1b[2K \u{9b}2K \u{7f} \u{202e}txt.exe\u{202c} \
\u{2066}isolate\u{2069}";

/// Characters that must never reach a terminal raw (line feeds are checked separately, by
/// counting lines): C0 and C1 controls, DEL, bidi controls, line and paragraph separators.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            c != '\n'
                && (c.is_control()
                    || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
        })
        .collect()
}

fn assert_inert(what: &str, text: &str) {
    let raw = raw_controls(text);
    assert!(raw.is_empty(), "{what} printed raw {raw:?}:\n{text}");
    assert!(
        !text.contains("\nforged-row") && !text.contains("\npayments  acme  forged-row"),
        "{what} forged a row:\n{text}"
    );
}

/// A SQLite store with one parked claim (`hostile-1`) whose reason and provider answer are
/// [`HOSTILE`], and one completed claim with a hostile history line; the configuration file
/// points its consumer at `provider`.
async fn hostile_store(dir: &std::path::Path, provider: &str) -> String {
    let store_url = format!("sqlite://{}", dir.join("claims.db").display());
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        config_toml(&store_url, &consumer_toml("payments", provider, "")),
    )
    .unwrap();
    let s = claimd::store::open(&store_url, 2).await.unwrap();
    s.migrate().await.unwrap();
    for (id, state) in [
        ("hostile-1", ClaimState::NeedsAttention),
        ("hostile-2", ClaimState::Completed),
    ] {
        let n = orphan_claim("payments", "acme", id, &format!("payments:acme:{id}"));
        let ClaimOutcome::Created(c) = s.claim(&n).await.unwrap() else {
            panic!("new claim")
        };
        let ev = NewEvent {
            actor: "worker-1",
            action: "perform",
            outcome: "rejected",
            provider_status: Some(400),
            detail: Some(HOSTILE),
        };
        let settled = Settlement {
            state: Some(state),
            provider_status: Some(400),
            provider_response: Some(HOSTILE.into()),
            error: Some(HOSTILE.into()),
            ..Default::default()
        };
        assert!(s.settle(c.id, 1, &settled, &ev).await.unwrap());
    }
    cfg.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_text_reaches_the_terminal_inert_in_every_text_output() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hostile_store(dir.path(), "http://127.0.0.1:1").await;

    let (code, out, err) = cli(&["claims", "list", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert_inert("claims list", &out);
    assert_eq!(out.lines().count(), 3, "a header and two rows:\n{out}");
    assert!(
        out.contains("\\u001b]0;pwned title\\u0007") && out.contains("\\r\\n"),
        "shown, escaped:\n{out}"
    );

    let (code, out, err) = cli(&[
        "claims",
        "show",
        "payments",
        "hostile-1",
        "--tenant",
        "acme",
        "--config",
        &cfg,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_inert("claims show", &out);
    let answer = out
        .lines()
        .find(|l| l.starts_with("provider answer"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        answer.contains("\\u001b]8;;https://evil.example/") && answer.contains("\\u202etxt.exe"),
        "the answer on one line, escaped: {answer}"
    );
    let history: Vec<&str> = out.lines().skip_while(|l| *l != "history:").collect();
    assert_eq!(history.len(), 3, "history:, a header and one line:\n{out}");

    let (code, out, err) = cli(&["report", "--config", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert_inert("report", &out);
    assert!(out.contains("needs a look"), "{out}");

    for format in ["csv", "json"] {
        for args in [
            &["claims", "list", "--format", format][..],
            &[
                "claims",
                "show",
                "payments",
                "hostile-1",
                "--tenant",
                "acme",
                "--format",
                format,
            ][..],
            &["report", "--format", format][..],
        ] {
            let mut args = args.to_vec();
            args.extend(["--config", &cfg]);
            let (code, out, err) = cli(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
            assert_inert(&format!("{args:?}"), &out);
            if format == "json" {
                // Escaped with JSON's own escapes: the value is unchanged.
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                if args[1] == "show" {
                    assert_eq!(v["claim"]["provider_response"], HOSTILE);
                }
            }
        }
    }

    // Input echoed in an error is escaped too.
    let (code, out, err) = cli(&[
        "claims",
        "show",
        "payments",
        "no\x1b]0;x\x07pe",
        "--config",
        &cfg,
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert_inert("an error", &err);
    assert!(err.contains("no\\u001b]0;x\\u0007pe"), "{err}");
}

/// With the provider down every lookup is undecided: `reconcile` says so and exits 1, so a
/// cron check does not stay green.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_could_decide_nothing_exits_1_and_says_how_many() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hostile_store(dir.path(), "http://127.0.0.1:1").await;
    let (code, out, err) = cli(&["reconcile", "--config", &cfg]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("checked 0 claims, 2 undecided"), "{out}");
    assert!(
        err.contains("could not check any claim: 2 undecided"),
        "{err}"
    );
    let (code, out, _) = cli(&["reconcile", "--format", "json", "--config", &cfg]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["checked"].as_u64(), v["undecided"].as_u64()),
        (Some(0), Some(2))
    );
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn configuration_errors_show_no_secret_and_read_no_endless_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());

    // An endless device is refused at once, not read until memory runs out.
    let t = Instant::now();
    let (code, _, err) = cli(&["report", "--config", "/dev/zero"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // The process environment is not printed.
    let (code, _, err) = cli_with_env(
        &["report", "--config", "/proc/self/environ"],
        &[("CLAIMD_T_SECRET", "hunter2")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("hunter2") && !err.contains("PATH="), "{err}");

    // A syntax error names line, column and key, not the line.
    let cfg = write(
        dir.path(),
        "syntax.toml",
        &format!("[store]\nurl = \"{store}\"\n[http]\nadmin_token = \"SuperSecretAdminToken\n"),
    );
    let (code, _, err) = cli(&["report", "--config", &cfg]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("SuperSecret"), "{err}");
    assert!(
        err.contains("line 4") && err.contains("http.admin_token"),
        "{err}"
    );

    // A mistyped connection parameter is refused by name, before the driver logs its value.
    let cfg = write(
        dir.path(),
        "passwd.toml",
        &config_toml(
            "postgres://claimd@127.0.0.1:1/claims?passwd=hunter2",
            &consumer_toml("payments", "http://127.0.0.1:1", ""),
        ),
    );
    let (code, out, err) = cli_with_env(&["report", "--config", &cfg], &[("CLAIMD_LOG", "debug")]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("\"passwd\"") && !err.contains("hunter2"),
        "{err}"
    );

    // A password with `?` or `#` is still redacted.
    for url in [
        "postgres://claimd:hunt?er2@127.0.0.1:notaport/claims",
        "postgres://claimd:hunt#er2@127.0.0.1:notaport/claims",
    ] {
        let cfg = write(
            dir.path(),
            "pw.toml",
            &config_toml(url, &consumer_toml("payments", "http://127.0.0.1:1", "")),
        );
        let (code, out, err) = cli(&["report", "--config", &cfg]);
        assert_eq!(code, 2, "{url}: {out}{err}");
        assert!(!err.contains("er2") && err.contains("claimd:***@"), "{err}");
    }
}

#[test]
fn tokens_shorter_than_16_characters_or_shared_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let consumers = consumer_toml("payments", "http://127.0.0.1:1", "");
    for (http, key) in [
        ("admin_token = \"adm1n\"", "http.admin_token"),
        ("intake_token = \"1ntake\"", "http.intake_token"),
        (
            "admin_token = \"one-token-for-both-1234\"\nintake_token = \"one-token-for-both-1234\"",
            "http.intake_token",
        ),
    ] {
        let cfg = write(
            dir.path(),
            "t.toml",
            &config_toml_with(&store, http, &consumers),
        );
        let (code, out, err) = cli(&["report", "--config", &cfg]);
        assert_eq!(code, 2, "{http}: {out}{err}");
        assert!(err.contains(key), "{err}");
        assert!(
            !err.contains("adm1n") && !err.contains("1ntake") && !err.contains("one-token"),
            "no token shown: {err}"
        );
    }
}

/// `effect.url` may name payload fields (docs/providers.md); a payload with a key twice is
/// refused at intake with 422 naming the key, and nothing is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_fields_in_the_url_work_and_duplicate_keys_are_refused_at_intake() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(Default::default()).await;
    // The sandbox applies any POST under /v1/.
    let consumers = consumer_toml("payments", &provider, "").replace(
        &format!("url = \"{provider}/v1/payments\""),
        &format!("url = \"{provider}/v1/payments?customer={{customer_id}}\""),
    );
    assert!(consumers.contains("{customer_id}"), "{consumers}");
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let post = |id: &'static str, body: &'static str| {
        c.post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", id)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let r = post(
        "dup-1",
        r#"{"customer_id":"cus_1","amount":5,"amount":999999}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let text = r.text().await.unwrap();
    assert!(text.contains("amount") && text.contains("twice"), "{text}");
    let s = claimd::store::open(&store.url(), 1).await.unwrap();
    assert!(
        s.get("payments", "", "dup-1").await.unwrap().is_none(),
        "nothing claimed"
    );

    let r = post("ok-1", r#"{"customer_id":"cus_1","amount":5}"#)
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let done = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "ok-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "the claim completes");
    running.shutdown(Duration::from_secs(5)).await;
}
