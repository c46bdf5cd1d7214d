//! Poison messages against a `claimd` process of its own: header bytes that are not UTF-8, a
//! header section that is not one, a thousand headers. Published raw (HPUB), as a producer
//! with another client could. The process must stay up, take the good message after them, and
//! leave nothing redelivered for ever.

use super::*;
use std::io::{Read, Write};

/// Publishes raw HPUB frames to `subject` on the shared server (the stream stores them as
/// they are). `frames`: (header section after the `NATS/1.0` line, body).
pub(crate) fn publish_raw(subject: &str, frames: &[(Vec<u8>, Vec<u8>)]) {
    let addr = common::nats::nats_url()
        .trim_start_matches("nats://")
        .to_string();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut info = [0u8; 4096];
    let _ = c.read(&mut info).unwrap();
    c.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n")
        .unwrap();
    for (headers, body) in frames {
        let mut h = b"NATS/1.0\r\n".to_vec();
        h.extend_from_slice(headers);
        h.extend_from_slice(b"\r\n");
        let head = format!("HPUB {subject} {} {}\r\n", h.len(), h.len() + body.len());
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&h).unwrap();
        c.write_all(body).unwrap();
        c.write_all(b"\r\n").unwrap();
    }
    c.write_all(b"PING\r\n").unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&answer).contains("PONG") {
        let n = c.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the server closed the connection: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(
        !String::from_utf8_lossy(&answer).contains("-ERR"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raw_headers_that_are_not_text_or_not_headers_do_not_stop_the_worker() {
    let Some(s) = TestStream::new("poison").await else {
        return;
    };
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let toml = config_toml(
        &store.url(),
        &s.consumer_toml("payments", "", &http_effect(&provider)),
    );
    let mut w = ready_worker(&toml, dir.path(), "worker").await;

    // 1,000 headers, 37 KB (5,000, 275 KB, were not stored by the server here).
    let many: Vec<u8> = (0..1000)
        .flat_map(|i| format!("X-Filler-{i}: {}\r\n", "v".repeat(20)).into_bytes())
        .collect();
    let mut many_with_id = b"Nats-Msg-Id: many-1\r\n".to_vec();
    many_with_id.extend_from_slice(&many);
    let subject = s.subject.clone();
    tokio::task::spawn_blocking(move || {
        publish_raw(
            &subject,
            &[
                (
                    b"Nats-Msg-Id: id-\xff\xfe\r\n".to_vec(),
                    b"{\"case\":\"utf8\"}".to_vec(),
                ),
                (b"\xff\xfe: v\r\n".to_vec(), b"{\"case\":\"name\"}".to_vec()),
                (
                    b"no colon here\r\n".to_vec(),
                    b"{\"case\":\"no-colon\"}".to_vec(),
                ),
                (many_with_id, b"{\"case\":\"many\"}".to_vec()),
            ],
        )
    })
    .await
    .unwrap();
    s.publish_json("good-after-poison", r#"{"amount":1}"#).await;

    let st = claimd::store::open(&store.url(), 1).await.unwrap();
    let good = eventually(Duration::from_secs(20), || {
        let st = st.clone();
        async move {
            st.get("payments", "", "good-after-poison")
                .await
                .unwrap()
                .is_some()
        }
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        good,
        "the good message was not claimed; log:\n{}",
        &text[text.len().saturating_sub(3000)..]
    );
    let exited = w.child.try_wait().unwrap();
    assert!(exited.is_none(), "claimd exited ({exited:?})");
    let drained = eventually(Duration::from_secs(20), || async {
        s.unacknowledged("claimd-payments").await == 0
    })
    .await;
    let dead = s.dead_letters().await;
    let reasons: Vec<String> = dead
        .iter()
        .map(|m| header(m, "Claimd-Reason").unwrap_or_default())
        .collect();
    assert!(
        drained,
        "poison left unacknowledged; dead letters: {reasons:?}"
    );
    // The three whose headers could not be read are set aside, saying what was wrong; the
    // one with 1,000 headers is an ordinary message.
    assert_eq!(dead.len(), 3, "{reasons:?}");
    for (body, what) in [
        (&br#"{"case":"utf8"}"#[..], "(bytes that are not UTF-8)"),
        (
            br#"{"case":"name"}"#,
            "a name with characters a header name cannot have",
        ),
        (br#"{"case":"no-colon"}"#, "(a line without a colon)"),
    ] {
        let m = dead
            .iter()
            .find(|m| m.payload == body)
            .expect("dead letter");
        let reason = header(m, "Claimd-Reason").unwrap();
        assert!(reason.contains(what), "{reason}");
        assert_eq!(
            header(m, "Claimd-Reason-Code").as_deref(),
            Some("unreadable_headers")
        );
    }
    let many = eventually(Duration::from_secs(10), || {
        let st = st.clone();
        async move { st.get("payments", "", "many-1").await.unwrap().is_some() }
    })
    .await;
    assert!(many, "the message with 1,000 headers was not claimed");
    assert!(
        eventually(Duration::from_secs(10), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    // One connection all along: no poison cost a reconnection.
    let exited = w.child.try_wait().unwrap();
    assert!(exited.is_none(), "claimd exited ({exited:?})");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("lost the broker connection"), "{text}");
    assert_eq!(
        text.matches("\"pulling\"").count(),
        1,
        "reconnected: {text}"
    );
    s.delete().await;
}
