//! What a tired operator meets on the command line and the operator page, with the real
//! binary on real SQLite (and PostgreSQL) stores: a mistyped consumer is exit 2 naming it in
//! every command; the read-only commands run on the Stripe example without its secrets, on
//! its own database file; the page's pasted commands carry the variable the store URL came
//! from; `claims redrive --note` is kept in the history; the sandbox remembers its effects
//! across a restart, so `reconcile` finds no mismatch; a bad `?since=` is an HTML page; a
//! store error names what failed and what to do.

use super::common::*;
use claimd::service::app::App;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A configuration with `payments` and `refunds` on the SQLite file `db` (nothing is called:
/// the provider URL is never reached by these commands).
fn two_consumers(db: &Path, extra: &str) -> String {
    let provider = "http://127.0.0.1:9";
    format!(
        "{}{extra}",
        config_toml(
            &format!("sqlite://{}", db.display()),
            &format!(
                "{}{}",
                consumer_toml("payments", provider, ""),
                consumer_toml("refunds", provider, "")
            ),
        )
    )
}

/// Writes `toml` to `dir/name` and returns its path as text.
fn write(dir: &Path, name: &str, toml: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path.to_string_lossy().into_owned()
}

/// Runs `claimd` in `cwd` with `set` added and `unset` removed from the environment.
fn claimd_in(
    cwd: &Path,
    args: &[&str],
    set: &[(&str, &str)],
    unset: &[&str],
) -> (i32, String, String) {
    let mut cmd = Command::new(claimd_bin());
    cmd.current_dir(cwd)
        .args(args)
        .env("CLAIMD_LOG", "warn")
        .env("CLAIMD_OPERATOR", "test");
    for k in unset {
        cmd.env_remove(k);
    }
    let out = cmd.envs(set.iter().copied()).output().expect("run claimd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_mistyped_consumer_is_exit_2_naming_it_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let toml = two_consumers(&db, "");
    let cfg = write(dir.path(), "c.toml", &toml);
    // A parked claim of a consumer since taken out of the configuration.
    let app = App::open(load(&toml), true).await.unwrap();
    parked_claim(&app.store, "old", "o-1", "attempts exhausted").await;
    parked_claim(&app.store, "payments", "order-1001", "attempts exhausted").await;

    let mistyped: [&[&str]; 10] = [
        &["report", "--check", "--consumer", "paymnts"],
        &["reconcile", "--consumer", "paymnts"],
        &["reconcile", "--ledger", "--consumer", "paymnts"],
        &["claims", "list", "--consumer", "paymnts"],
        &["claims", "show", "paymnts", "order-1001"],
        &[
            "claims",
            "resolve",
            "paymnts",
            "order-1001",
            "--as",
            "failed",
            "--note",
            "x",
        ],
        &["claims", "redrive", "paymnts", "order-1001"],
        &[
            "claims",
            "resolve",
            "--consumer",
            "paymnts",
            "--as",
            "failed",
            "--note",
            "x",
        ],
        &["claims", "redrive", "--consumer", "paymnts", "--yes"],
        &["claims", "redrive", "old", "o-1"],
    ];
    eprintln!("| command | exit | stderr |");
    for args in mistyped {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend_from_slice(args);
        let (code, out, err) = cli(&all);
        eprintln!("| {} | {code} | {} |", args.join(" "), err.trim());
        let typo = args.contains(&"paymnts");
        let name = if typo { "paymnts" } else { "old" };
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(
            err.contains(&format!("no consumer named \"{name}\" in {cfg}"))
                && err.contains("consumers: payments, refunds"),
            "{args:?}: {err}"
        );
        if typo {
            assert!(err.contains("did you mean \"payments\"?"), "{err}");
        }
        assert!(out.is_empty(), "{args:?} printed a result: {out}");
    }
    // Nothing was changed by any of them.
    let c = app
        .store
        .get("payments", "", "order-1001")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.state.as_str(), "needs_attention");

    // The removed consumer's claims can still be read and decided, with a note saying so.
    let (code, out, err) = cli(&["--config", &cfg, "claims", "list", "--consumer", "old"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("o-1"), "{out}");
    assert!(err.contains("note: no consumer named \"old\""), "{err}");
    let (code, out, err) = cli(&[
        "--config", &cfg, "claims", "resolve", "old", "o-1", "--as", "failed", "--note", "gone",
    ]);
    assert_eq!(code, 0, "{out}{err}");
}

#[tokio::test]
async fn read_only_commands_run_on_the_stripe_example_without_its_secrets_and_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let stripe = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/stripe.toml");
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml");
    let secrets = [
        "STRIPE_SECRET_KEY",
        "STRIPE_WEBHOOK_SECRET",
        "CLAIMD_STORE_URL",
    ];
    // The default configuration's claimd.db in the same folder, with a payment in it.
    let (code, _, err) = claimd_in(cwd, &["--config", default, "migrate"], &[], &secrets);
    assert_eq!(code, 0, "{err}");
    let default_db = load(&config_toml(
        &format!("sqlite://{}", cwd.join("claimd.db").display()),
        "",
    ));
    let app = App::open(default_db, false).await.unwrap();
    parked_claim(&app.store, "payments", "order-1", "r").await;

    let (code, _, err) = claimd_in(cwd, &["--config", stripe, "migrate"], &[], &secrets);
    assert_eq!(code, 0, "migrate needs no provider secret: {err}");
    assert!(
        cwd.join("claimd-stripe.db").exists(),
        "the example has its own database file"
    );
    let stripe_db = load(&config_toml(
        &format!("sqlite://{}", cwd.join("claimd-stripe.db").display()),
        "",
    ));
    let app = App::open(stripe_db, false).await.unwrap();
    parked_claim(&app.store, "stripe-payments", "order-1001", "r").await;

    for args in [
        &["report"][..],
        &["claims", "list"],
        &["claims", "show", "stripe-payments", "order-1001"],
    ] {
        let mut all = vec!["--config", stripe];
        all.extend_from_slice(args);
        let (code, out, err) = claimd_in(cwd, &all, &[], &secrets);
        eprintln!("claimd {}: exit {code}", args.join(" "));
        assert_eq!(code, 0, "{args:?} without secrets: {err}");
        assert!(out.contains("stripe-payments"), "{args:?}: {out}");
        // The default configuration's consumers live in claimd.db, not here.
        assert!(
            !out.lines()
                .any(|l| l.starts_with("payments ") || l.starts_with("refunds ")),
            "{args:?} shows another configuration's claims: {out}"
        );
    }
    // A command that calls the provider still refuses without the key.
    let (code, _, err) = claimd_in(cwd, &["--config", stripe, "reconcile"], &[], &secrets);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("STRIPE_SECRET_KEY"), "{err}");
}

#[tokio::test]
async fn redrive_keeps_its_note_in_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let toml = two_consumers(&db, "");
    let cfg = write(dir.path(), "c.toml", &toml);
    let app = App::open(load(&toml), true).await.unwrap();
    parked_claim(&app.store, "payments", "p1", "outcome unknown").await;
    parked_claim(&app.store, "payments", "p2", "outcome unknown").await;
    let (code, out, err) = cli(&[
        "--config",
        &cfg,
        "claims",
        "redrive",
        "payments",
        "p1",
        "--note",
        "provider confirmed: never received",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&[
        "--config",
        &cfg,
        "claims",
        "redrive",
        "--consumer",
        "payments",
        "--note",
        "outage of 12 May",
        "--yes",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    for (id, note) in [
        ("p1", "provider confirmed: never received"),
        ("p2", "outage of 12 May"),
    ] {
        let (code, out, err) = cli(&["--config", &cfg, "claims", "show", "payments", id]);
        assert_eq!(code, 0, "{err}");
        let line = out
            .lines()
            .find(|l| l.contains("operator:test") && l.contains("redrive"))
            .unwrap_or_else(|| panic!("no redrive line: {out}"));
        assert!(
            line.contains(&format!("was needs_attention: {note}")),
            "{line}"
        );
    }
}

/// The text of the first `<code>` on the page that starts with `start` (the page escapes it).
fn pasted(html: &str, start: &str) -> Option<String> {
    let at = html.find(start)?;
    let end = html[at..].find("</code>")? + at;
    Some(unescape(&html[at..end]))
}

/// HTML text as the page escapes it, unescaped.
fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[tokio::test]
async fn the_pages_commands_carry_the_variable_the_store_url_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let port = free_port();
    // The file names another database; the environment names the worker's.
    let toml = two_consumers(&dir.path().join("other.db"), "")
        .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let cfg = write(dir.path(), "c.toml", &toml);
    let real_url = format!("sqlite://{}", real.display());
    let app = App::open(
        load(&toml.replace(
            &format!("sqlite://{}", dir.path().join("other.db").display()),
            &real_url,
        )),
        true,
    )
    .await
    .unwrap();
    parked_claim(&app.store, "payments", "order-1001", "attempts exhausted").await;
    drop(app);

    let log = std::fs::File::create(dir.path().join("worker.log")).unwrap();
    let child = Command::new(claimd_bin())
        .args(["run", "--config", &cfg])
        .env("CLAIMD__STORE__URL", &real_url)
        .env("CLAIMD_LOG", "warn")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let worker = Worker::attach(child, port).await;
    let html = client()
        .get(format!("{}/", worker.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cmd = pasted(&html, "CLAIMD__STORE__URL=")
        .unwrap_or_else(|| panic!("no command carries CLAIMD__STORE__URL: {html}"));
    eprintln!("pasted: {cmd}");
    assert!(
        cmd.contains("claimd claims show payments order-1001"),
        "{cmd}"
    );
    assert!(!cmd.contains(&real_url), "the value is never shown: {cmd}");

    // Pasted in a shell that has the variable: the worker's store, the claim found.
    let bin_dir = claimd_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sh_run = |cmd: &str, with: bool| {
        let mut c = Command::new("sh");
        c.args(["-c", cmd])
            .env("PATH", &path)
            .env_remove("CLAIMD__STORE__URL");
        if with {
            c.env("CLAIMD__STORE__URL", &real_url);
        }
        c.output().unwrap()
    };
    let sh = |with: bool| sh_run(&cmd, with);
    let out = sh(true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("attempts exhausted"), "{stdout}");
    // The footer's `claimd report --format json` names the same store: pasted, it reads the
    // worker's claims (the parked one counted), not a new database.
    let report = html
        .split("<code>")
        .filter_map(|c| c.split("</code>").next())
        .find(|c| c.contains("claimd report"))
        .map(unescape)
        .unwrap_or_else(|| panic!("no report command on the page: {html}"));
    eprintln!("pasted: {report}");
    assert!(
        report.starts_with("CLAIMD__STORE__URL=") && report.contains("--config"),
        "the report command names the worker's store: {report}"
    );
    let out = sh_run(&report, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(
        stdout.contains("order-1001"),
        "the worker's parked claim: {v}"
    );
    // In a shell without it, the command refuses to run instead of opening other.db.
    let out = sh(false);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CLAIMD__STORE__URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.path().join("other.db").exists(),
        "another store was opened"
    );

    // A bad window is an HTML page with the error, as the page's other refusals.
    let r = client()
        .get(format!("{}/?since=garbage", worker.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    let body = r.text().await.unwrap();
    assert!(ct.starts_with("text/html"), "{ct}: {body}");
    assert!(body.contains("garbage") && body.contains("<html"), "{body}");
    worker.kill();
}

#[tokio::test]
async fn the_sandbox_remembers_its_effects_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claimd.db");
    let (port, sandbox_port) = (free_port(), free_port());
    let provider = format!("http://127.0.0.1:{sandbox_port}");
    let toml = config_toml(
        &format!("sqlite://{}", db.display()),
        &consumer_toml("payments", &provider, ""),
    )
    .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
        + &format!("[sandbox]\nenabled = true\nlisten = \"127.0.0.1:{sandbox_port}\"\n");
    let cfg = write(dir.path(), "c.toml", &toml);
    let log = dir.path().join("worker.log");
    let worker = Worker::spawn(Path::new(&cfg), port, &log).await;
    let r = client()
        .post(format!("{}/v1/messages/payments", worker.base))
        .header("Idempotency-Key", "order-1")
        .header("Content-Type", "application/json")
        .header("Prefer", "wait=10")
        .body(r#"{"amount": 100}"#)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let done = eventually(Duration::from_secs(10), || async {
        let (_, out, _) = cli(&["--config", &cfg, "claims", "show", "payments", "order-1"]);
        out.contains("completed")
    })
    .await;
    assert!(done, "the payment did not complete");
    assert!(worker.terminate().success());

    // The README's restart step, then a reconcile against the restarted sandbox.
    let worker = Worker::spawn(Path::new(&cfg), port, &log).await;
    let (code, out, err) = cli(&["--config", &cfg, "reconcile"]);
    eprintln!("reconcile after restart: exit {code}\n{out}{err}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("completed_unknown_to_provider"), "{out}");
    assert!(out.contains("0 mismatches"), "{out}");
    assert!(
        dir.path().join("claimd.db.sandbox.jsonl").exists(),
        "the effects are kept beside the store"
    );
    worker.kill();
}

#[tokio::test]
async fn a_store_error_says_what_failed_and_what_to_do_not_a_source_line() {
    // A server must answer (under CI=true its absence fails here); the database it is asked
    // for does not exist.
    let Some(pg) = PgDb::create().await else {
        return;
    };
    let missing = format!("{}_missing", pg.url);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "c.toml", &config_toml(&missing, ""));
    let (code, _, err) = cli(&["--config", &cfg, "claims", "list"]);
    eprintln!(
        "claims list on a missing database: exit {code}: {}",
        err.trim()
    );
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("at line"), "{err}");
    assert!(
        err.contains("does not exist") && err.contains("createdb"),
        "{err}"
    );
}
