//! A NATS server that requires TLS, through the broker guard: the guard reads the server's
//! `INFO` in the clear, then speaks TLS to it, verifying it against the platform's roots (here
//! a test CA named by `SSL_CERT_FILE`); the client speaks plain NATS to the guard. A private
//! `nats-server` (skipped when it or `openssl` is not installed).

use super::*;
use common::tls::certificates;
use std::process::{Command, Stdio};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_tls_is_reached_through_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    if certificates(dir.path()).is_none() {
        return;
    }
    let nats_port = free_port();
    let server = Command::new(if std::path::Path::new("/usr/sbin/nats-server").exists() {
        "/usr/sbin/nats-server"
    } else {
        "nats-server"
    })
    .args([
        "-a",
        "127.0.0.1",
        "-p",
        &nats_port.to_string(),
        "-js",
        "-sd",
    ])
    .arg(dir.path().join("js"))
    .arg("--tls")
    .arg("--tlscert")
    .arg(dir.path().join("server.pem"))
    .arg("--tlskey")
    .arg(dir.path().join("server.key"))
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn();
    let Ok(server) = server else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "nats-server is not installed"
        );
        eprintln!("SKIPPED: nats-server is not installed");
        return;
    };
    // Killed when the test ends, however it ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Killed(server);
    let listening = eventually(Duration::from_secs(5), || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", nats_port))
            .await
            .is_ok()
    })
    .await;
    assert!(listening, "nats-server did not listen");

    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let port = free_port();
    // `nats://`: the server's INFO asks for TLS, and the guard follows it.
    let consumer = consumer_section(
        "payments",
        "nats",
        vec![
            ("nats_url", format!("\"nats://localhost:{nats_port}\"")),
            ("stream", "\"TLSCHECK\"".into()),
            ("subject", "\"tlscheck.in\"".into()),
            ("dead_letter_subject", "\"tlscheck.dead\"".into()),
            ("redrive_within", "\"1h\"".into()),
        ],
        "",
        &http_effect(&provider),
    );
    let toml =
        config_toml(&store.url(), &consumer).replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let config = dir.path().join("worker.toml");
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("worker.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(claimd_bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("CLAIMD_LOG", "info")
        .env("SSL_CERT_FILE", dir.path().join("ca.pem"))
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn claimd");
    let w = Worker::attach(child, port).await;
    // Ready: the stream and the durable consumer were made over TLS and it is pulling.
    let ready = w.ready_within(Duration::from_secs(15)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ready && text.contains("\"pulling\""),
        "not pulling from a TLS server; log:\n{}",
        &text[text.len().saturating_sub(3000)..]
    );
}
