//! The command line where people look first (issue 15): `--state` and `--as` list their
//! allowed values, `report --since` defaults to `24h` as README says, and a database that was
//! never migrated is answered with what to run; `[log] format` chooses the log lines;
//! `claimd sandbox --config` applies `[sandbox]`; a refused status probe is exit 2; `--version`
//! names the release and the commit.

use crate::common;

use common::*;

#[test]
fn choices_are_listed_and_an_unmigrated_database_says_to_migrate() {
    let (code, _, err) = cli(&["claims", "list", "--state", "parked"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("started, pending, completed, failed, needs_attention"),
        "{err}"
    );
    let (code, _, err) = cli(&["claims", "resolve", "p", "m", "--as", "done", "--note", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("completed, failed"), "{err}");
    let (_, help, _) = cli(&["report", "--help"]);
    assert!(help.contains("[default: 24h]"), "{help}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n",
            dir.path().join("empty.db").display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let (code, _, err) = cli(&["--config", &cfg, "report"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no claimd tables yet") && err.contains(&format!("--config {cfg} migrate")),
        "{err}"
    );
    let (code, _, err) = cli(&["--config", &cfg, "migrate"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["--config", &cfg, "report"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty());
}

/// A SQLite configuration file in `dir` with `extra` appended (sections of its own).
fn config_file(dir: &std::path::Path, extra: &str) -> String {
    let cfg = dir.join(format!("c{}.toml", fastrand::u32(..)));
    std::fs::write(
        &cfg,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n{extra}",
            dir.join("claims.db").display()
        ),
    )
    .unwrap();
    cfg.to_string_lossy().into_owned()
}

/// `[log] format` chooses the log lines (`--log-format` wins over it; `auto` gives JSON when
/// stderr is not a terminal, as here); an unknown value is refused naming the key. The warning
/// logged is the one for an unset `${VAR}` in the admin token.
#[test]
fn log_format_comes_from_the_configuration_unless_the_command_line_says() {
    let dir = tempfile::tempdir().unwrap();
    let warn = "[http]\nadmin_token = \"${CLAIMD_TEST_NEVER_SET_TOKEN}\"\n";
    let warnings = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains("CLAIMD_TEST_NEVER_SET_TOKEN"))
            .map(str::to_string)
            .collect()
    };

    let pretty = config_file(dir.path(), &format!("{warn}[log]\nformat = \"pretty\"\n"));
    let (code, _, err) = cli(&["--config", &pretty, "migrate"]);
    assert_eq!(code, 0, "{err}");
    let lines = warnings(&err);
    assert!(!lines.is_empty(), "a warning is logged: {err}");
    assert!(
        lines
            .iter()
            .all(|l| !l.starts_with('{') && l.contains("WARN")),
        "pretty lines: {err}"
    );

    let (code, _, err) = cli(&["--config", &pretty, "--log-format", "json", "migrate"]);
    assert_eq!(code, 0, "{err}");
    let lines = warnings(&err);
    assert!(!lines.is_empty(), "{err}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["level"], "WARN", "{l}");
    }

    let auto = config_file(dir.path(), warn);
    let (code, _, err) = cli(&["--config", &auto, "migrate"]);
    assert_eq!(code, 0, "{err}");
    let lines = warnings(&err);
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.starts_with('{')),
        "{err}"
    );

    let wrong = config_file(dir.path(), "[log]\nformat = \"loud\"\n");
    let (code, _, err) = cli(&["--config", &wrong, "report"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("log.format") && err.contains("pretty"),
        "{err}"
    );
}

/// A `claimd` process killed when the test ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status of an effect posted to a sandbox on `port` (waiting for it to listen).
fn post_effect(port: u16, key: &str) -> u16 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = rt.block_on(async {
            client()
                .post(format!("http://127.0.0.1:{port}/v1/payments"))
                .header("Idempotency-Key", key)
                .body("{}")
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        match answer {
            Ok(status) => return status,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(e) => panic!("no sandbox on {port}: {e}"),
        }
    }
}

/// `claimd sandbox --config` applies the file's `[sandbox]` section; flags given on the
/// command line win over it.
#[test]
fn sandbox_reads_its_section_of_the_configuration_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config_file(
        dir.path(),
        &format!("[sandbox]\nlisten = \"127.0.0.1:{port}\"\nfail_rate = 1.0\n"),
    );
    let spawn = |args: &[&str]| {
        Child(
            std::process::Command::new(claimd_bin())
                .args(args)
                .env("CLAIMD_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let from_file = spawn(&["sandbox", "--config", &cfg]);
    // fail_rate = 1.0 from the file: every effect is refused with 503, on the file's port.
    assert_eq!(post_effect(port, "k1"), 503);
    drop(from_file);

    let other = free_port();
    let listen = format!("127.0.0.1:{other}");
    let _flags = spawn(&[
        "sandbox",
        "--config",
        &cfg,
        "--fail-rate",
        "0",
        "--listen",
        &listen,
    ]);
    let status = post_effect(other, "k2");
    assert!((200..300).contains(&status), "{status}");

    let bad = config_file(dir.path(), "[sandbox]\nfail_rate = 2.0\n");
    let (code, _, err) = cli(&["sandbox", "--config", &bad]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("sandbox.fail_rate"), "{err}");
}

/// A status endpoint that answers "found" for a key that cannot exist is a configuration
/// problem: `claimd run` refuses to start with exit code 2 and says which consumer and key.
#[test]
fn a_refused_status_probe_exits_2() {
    // Answers 200 with `{}` to everything: every lookup would read as "found".
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let provider = format!("http://{}", server.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in server.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            );
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    std::fs::write(
        &cfg,
        config_toml(&store, &consumer_toml("payments", &provider, "")),
    )
    .unwrap();
    let (code, _, err) = cli(&["--config", &cfg.to_string_lossy(), "run"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("consumer payments: effect.status_url"),
        "{err}"
    );
}

/// A loopback provider answering every request with `status` (no body worth reading).
fn provider_answering(status: &'static str) -> String {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let provider = format!("http://{}", server.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in server.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    provider
}

/// A worker restarted during its provider's outage starts (the status probe's 503 is the
/// provider's trouble, logged as a warning) and takes messages; a 401 from the status route
/// is a configuration mistake: `claimd run` refuses with exit 2, naming the consumer and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_outage_does_not_stop_the_start_but_a_refused_key_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    let port = free_port();
    let down = provider_answering("503 Service Unavailable");
    let cfg = dir.path().join("down.toml");
    std::fs::write(
        &cfg,
        config_toml(&store, &consumer_toml("payments", &down, ""))
            .replace("127.0.0.1:0", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let log = dir.path().join("down.log");
    let worker = Worker::spawn(&cfg, port, &log).await;
    let r = client()
        .post(format!("{}/v1/messages/payments", worker.base))
        .header("Idempotency-Key", "m1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        202,
        "the worker takes messages while its provider is down"
    );
    drop(worker);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("could not probe effect.status_url at start") && logged.contains("503"),
        "the probe's 503 is a warning: {logged}"
    );

    let refused = provider_answering("401 Unauthorized");
    let cfg = dir.path().join("refused.toml");
    std::fs::write(
        &cfg,
        config_toml(&store, &consumer_toml("payments", &refused, "")),
    )
    .unwrap();
    let (code, _, err) = cli(&["--config", &cfg.to_string_lossy(), "run"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("consumer payments: effect.status_url") && err.contains("401"),
        "{err}"
    );
}

/// `claimd --version`: the package's version, and what it says of the commit (a release
/// build records it; this test runs a development build).
#[test]
fn the_version_names_the_release_and_the_commit_or_why_not() {
    let (code, out, err) = cli(&["--version"]);
    assert_eq!(code, 0, "{err}");
    let expected = format!("claimd {} (", env!("CARGO_PKG_VERSION"));
    assert!(out.starts_with(&expected), "{out}");
    assert!(
        out.contains("(commit ") || out.contains("(development build: commit not recorded)"),
        "{out}"
    );
}
