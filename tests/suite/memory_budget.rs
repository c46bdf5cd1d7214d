//! The byte budget for request bodies (issue 12): when bodies being read already hold
//! `body_budget_bytes`, intake answers `503` + `Retry-After` without reading the body (and
//! without `100 Continue`), records nothing, and admits again once the budget frees.

use crate::common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn answer(s: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_body_budget_answers_503_before_reading_and_frees_again() {
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(Default::default()).await;
    // Room for one 1 MiB body at a time.
    let running = start(&config_toml_with(
        &store.url(),
        "body_budget_bytes = 1048576\nintake_wait = \"500ms\"",
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let addr = running.http_addr;

    // A client that sends all but the last byte of a 1 MiB body holds the whole budget
    // meanwhile (a body holds the memory it has filled, not what it declares).
    let mut holder = TcpStream::connect(addr).await.unwrap();
    holder
        .write_all(b"POST /v1/messages/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: holder\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n")
        .await
        .unwrap();
    holder.write_all(&vec![b'x'; 1_048_575]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Another body, announced with Expect: 100-continue: refused, nothing read.
    let mut other = TcpStream::connect(addr).await.unwrap();
    other
        .write_all(b"POST /v1/messages/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: refused\r\nContent-Type: application/json\r\nContent-Length: 600000\r\nExpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let got = answer(&mut other).await;
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(!got.contains("100 Continue"), "{got}");
    assert!(got.to_ascii_lowercase().contains("retry-after: 1"), "{got}");
    assert!(got.contains("body_budget_bytes"), "{got}");

    // The holder finishes: accepted; the budget is free again.
    holder.write_all(b"x").await.unwrap();
    let got = answer(&mut holder).await;
    assert!(got.starts_with("HTTP/1.1 202"), "{got}");
    let r = client()
        .post(format!("http://{addr}/v1/messages/payments"))
        .header("Idempotency-Key", "after")
        .header("Content-Type", "application/json")
        // 600,000 bytes of JSON: an object after whitespace.
        .body([vec![b' '; 599_998], b"{}".to_vec()].concat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);

    let s = running.app().store.clone();
    assert!(s.get("payments", "", "refused").await.unwrap().is_none());
    let metrics = client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "claimd_messages_refused_total{consumer=\"payments\",reason=\"body_budget\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            sandbox.effects().len() == 2
        })
        .await,
        "both accepted posts applied"
    );
    running.shutdown(Duration::from_secs(2)).await;
}

#[test]
fn a_budget_smaller_than_the_largest_body_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        config_toml_with(
            &store,
            "max_body_bytes = 1048576\nbody_budget_bytes = 1000",
            &consumer_toml("payments", "http://127.0.0.1:1", ""),
        ),
    )
    .unwrap();
    let (code, _, err) = cli(&["report", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("http.body_budget_bytes"), "{err}");
}
