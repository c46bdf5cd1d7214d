//! `amqps://` through the broker guard: the guard, not lapin, speaks TLS to the broker and
//! verifies it against the platform's roots (here a test CA named by `SSL_CERT_FILE`). The
//! broker is the test RabbitMQ behind a TLS terminator in this test; the certificates are made
//! with the `openssl` command (skipped when it is not installed).

use super::*;
use common::tls::certificates;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// A TLS terminator on a free port in front of the test broker (127.0.0.1:5672).
async fn terminator(dir: &Path) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut broker) = tokio::net::TcpStream::connect("127.0.0.1:5672").await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqps_url_is_guarded_with_tls_to_the_broker() {
    let Some(q) = TestQueues::new("tls").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    if certificates(dir.path()).is_none() {
        return;
    }
    let tls_port = terminator(dir.path()).await;
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let port = free_port();
    let url = format!("amqps://guest:guest@localhost:{tls_port}/%2f");
    let toml = config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    )
    .replace(
        &format!("{:?}", common::amqp::amqp_url()),
        &format!("{url:?}"),
    )
    .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    assert!(toml.contains("amqps://"), "{toml}");
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
    let ready = w.ready_within(Duration::from_secs(15)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ready,
        "not consuming over amqps://; log:\n{}",
        &text[text.len().saturating_sub(3000)..]
    );

    q.publish_json("over-tls", r#"{"amount":1}"#).await;
    let url = format!("{}/v1/messages/payments/over-tls", w.base);
    let claimed = eventually(Duration::from_secs(20), || {
        let url = url.clone();
        async move {
            client()
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        claimed,
        "the message was not claimed over amqps://; log:\n{}",
        &text[text.len().saturating_sub(3000)..]
    );
}
