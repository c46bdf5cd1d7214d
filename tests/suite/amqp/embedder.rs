//! The poison-message safety as an embedder gets it: the crate as `cargo package` makes it
//! (what crates.io would serve), unpacked, is the dependency of a small program with no
//! `[patch]` section; its worker takes a header nested 2,000 levels deep from RabbitMQ and a
//! header section that is not one from NATS JetStream, dead-letters both and performs the
//! messages behind them. Long: it builds that program (minutes).

use super::*;
use common::amqp_raw::{Nesting, RawPublisher, nested_headers};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The embedding program: a worker from the configuration file named on the command line,
/// until its standard input closes.
const MAIN_RS: &str = r#"
use std::io::Read;

#[tokio::main]
async fn main() {
    let path = std::env::args().nth(1).expect("the configuration file");
    let toml = std::fs::read_to_string(path).expect("read the configuration");
    let worker = claimd::Worker::from_toml(&toml)
        .expect("configuration")
        .start()
        .await
        .expect("start");
    tokio::task::spawn_blocking(|| {
        let mut rest = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut rest);
    })
    .await
    .expect("stdin");
    worker.shutdown(std::time::Duration::from_secs(5)).await;
}
"#;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Packages this crate, unpacks it under `dir` and builds the embedding program against it
/// (sharing this build's target directory, so dependencies built alike are reused).
fn build_embedder(dir: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = claimd_bin()
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo)
        .args(["package", "--no-verify", "--allow-dirty", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(manifest));
    let version = env!("CARGO_PKG_VERSION");
    let crate_file = target.join(format!("package/claimd-worker-{version}.crate"));
    run(Command::new("tar")
        .arg("xzf")
        .arg(&crate_file)
        .arg("-C")
        .arg(dir));
    let unpacked = dir.join(format!("claimd-worker-{version}"));
    let app = dir.join("app");
    std::fs::create_dir_all(app.join("src")).unwrap();
    std::fs::write(app.join("src/main.rs"), MAIN_RS).unwrap();
    // claimd's profile settings, so the dependencies claimd's own build compiled are reused.
    std::fs::write(
        app.join("Cargo.toml"),
        format!(
            r#"[package]
name = "claimd-embedder-check"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
claimd-worker = {{ path = {unpacked:?}, features = ["amqp", "nats"] }}
tokio = {{ version = "1", features = ["macros", "rt-multi-thread"] }}

[workspace]

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
opt-level = 1
"#
        ),
    )
    .unwrap();
    // The package's lock file: the versions claimd was tested with.
    std::fs::copy(unpacked.join("Cargo.lock"), app.join("Cargo.lock")).unwrap();
    assert!(
        !std::fs::read_to_string(unpacked.join("Cargo.toml"))
            .unwrap()
            .contains("[patch"),
        "the package carries a [patch] section"
    );
    run(Command::new(&cargo)
        .args(["build", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&app));
    target.join("debug/claimd-embedder-check")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: builds a program against the packaged crate (minutes): cargo test --features full --test suite amqp::embedder -- --ignored"]
async fn an_embedder_without_a_patch_section_dead_letters_poison_from_both_brokers() {
    let Some(q) = TestQueues::new("embed").await else {
        return;
    };
    let Some(s) = common::nats::TestStream::new("embed").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let program = tokio::task::spawn_blocking(move || build_embedder(&path))
        .await
        .unwrap();

    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let port = free_port();
    let consumers = format!(
        "{}{}",
        q.consumer_toml("payments", "", &http_effect(&provider)),
        s.consumer_toml("notify", "", &http_effect(&provider))
    );
    let toml =
        config_toml(&store.url(), &consumers).replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let config = dir.path().join("embedded.toml");
    std::fs::write(&config, toml).unwrap();
    let log = std::fs::File::create(dir.path().join("embedded.log")).unwrap();
    let child = Command::new(&program)
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn the embedder");
    let w = Worker::attach(child, port).await;
    let ready = w.ready_within(Duration::from_secs(15)).await;
    assert!(ready, "the embedded worker did not become ready");

    // 2,000 levels overflowed lapin's I/O thread and aborted the process without the fix.
    let queue = q.queue.clone();
    tokio::task::spawn_blocking(move || {
        let mut p = RawPublisher::connect().expect("raw AMQP connection");
        p.publish(
            &queue,
            b"deep-1",
            Some(&nested_headers(2000, Nesting::Tables)),
            b"{}",
        )
        .unwrap();
    })
    .await
    .unwrap();
    q.publish_json("good-after-deep", r#"{"amount":1}"#).await;

    // A header section with a line that is not `Name: value` closed async-nats' connection
    // (JetStream redelivered it for ever) without the fix.
    let subject = s.subject.clone();
    tokio::task::spawn_blocking(move || {
        crate::nats::poison::publish_raw(
            &subject,
            &[(
                b"no colon here\r\n".to_vec(),
                b"{\"case\":\"no-colon\"}".to_vec(),
            )],
        )
    })
    .await
    .unwrap();
    s.publish_json("good-after-unreadable", r#"{"amount":2}"#)
        .await;

    let completed = |consumer: &str, id: &str| {
        let url = format!("{}/v1/messages/{consumer}/{id}", w.base);
        eventually(Duration::from_secs(20), move || {
            let url = url.clone();
            async move {
                match client().get(url).send().await {
                    Ok(r) if r.status() == 200 => r
                        .json::<serde_json::Value>()
                        .await
                        .is_ok_and(|v| v["state"] == "completed"),
                    _ => false,
                }
            }
        })
    };
    let done = completed("payments", "good-after-deep").await;
    let nats_done = completed("notify", "good-after-unreadable").await;
    assert!(
        nats_done,
        "the good NATS message after the unreadable one was not completed"
    );
    let nats_dead = s.dead_letters().await;
    assert_eq!(nats_dead.len(), 1, "one NATS dead letter");
    assert_eq!(
        common::nats::header(&nats_dead[0], "Claimd-Reason-Code").as_deref(),
        Some("unreadable_headers")
    );
    let mut w = w;
    let exited = w.child.try_wait().unwrap();
    assert!(exited.is_none(), "the embedded worker exited: {exited:?}");
    assert!(
        done,
        "the good message after the deep one was not completed"
    );
    let mut dead = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while dead.is_empty() && tokio::time::Instant::now() < end {
        dead.extend(q.take_dead().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1);
    let reason = header(&dead[0].delivery.properties, "claimd-reason").unwrap();
    assert!(
        reason.contains("deeper than 32 levels") && reason.contains("\"deep\""),
        "{reason}"
    );
    drop(w.child.stdin.take());
}
