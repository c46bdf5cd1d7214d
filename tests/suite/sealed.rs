//! Encryption at rest (`[encryption]`): with it on, no payload, provider answer or personal
//! field is in the database files in clear (SQLite's file after a checkpoint, PostgreSQL's
//! table, TOAST and outbox files after `CHECKPOINT`); a rotation run while messages flow and
//! workers are killed leaves every claim readable and none sent twice; a claim whose key was
//! retired is parked, never sent; bad keys stop `claimd` with exit code 2 naming the key.

use crate::common;

use claimd::domain::claim::ClaimState;
use common::provider::{Script, TestProvider};
use common::*;
use sqlx::Row;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Three keys (32 bytes each, base64): two to seal with, one for fingerprints.
const K1: &str = "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "k2=HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=";
const FP: &str = "fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

/// The personal fields every message carries (`{i}` numbered).
fn payload(i: usize) -> String {
    format!(
        r#"{{"card":"tok_secretcard_{i:05}","email":"holder{i:05}@example.org","amount":{}}}"#,
        1000 + i
    )
}

/// What must not be found in clear in any database file.
const SECRETS: [&str; 3] = ["tok_secretcard_", "@example.org", "\"echo\""];

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    keys: PathBuf,
    port: u16,
}

/// A configuration with encryption on, its keys file holding `keys`, sealing with `active`;
/// `extra` goes at the end (an outcome destination).
fn setup(store: &TestStore, provider_url: &str, keys: &[&str], active: &str, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let keys_path = dir.path().join("keys");
    std::fs::write(&keys_path, keys.join("\n")).unwrap();
    let consumer = consumer_toml(
        "payments",
        provider_url,
        "lease = \"4s\"\nkey = \"{message_id}\"\n",
    )
    .replace("timeout = \"1s\"", "timeout = \"3s\"");
    let toml = format!(
        "{}\n{extra}\n",
        config_toml(&store.url(), &consumer).replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        )
    )
    .replace(
        "[retention]",
        &format!(
            "[encryption]\nenabled = true\nkeys_file = {:?}\nactive = \"{active}\"\nfingerprint_key = \"fp\"\n[retention]",
            keys_path.display().to_string()
        ),
    );
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, toml).unwrap();
    Setup {
        dir,
        config,
        keys: keys_path,
        port,
    }
}

impl Setup {
    /// Seal with `active` from now on, the keys file holding `keys`.
    fn rekey(&self, keys: &[&str], active: &str) {
        std::fs::write(&self.keys, keys.join("\n")).unwrap();
        let toml = std::fs::read_to_string(&self.config).unwrap();
        let at = toml.find("active = \"").unwrap();
        let end = at + toml[at..].find('\n').unwrap();
        let toml = format!("{}active = \"{active}\"{}", &toml[..at], &toml[end..]);
        std::fs::write(&self.config, toml).unwrap();
    }

    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let config = self.config.display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        cli(&all)
    }

    async fn spawn(&self) -> Worker {
        Worker::spawn(&self.config, self.port, &self.dir.path().join("worker.log")).await
    }
}

/// Posts messages `from..to` (`m{i}`, payload `payload(i)`), 16 at a time.
async fn post_range(base: &str, from: usize, to: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..16 {
        let base = base.to_string();
        tasks.spawn(async move {
            for i in (from + lane..to).step_by(16) {
                let r = client()
                    .post(format!("{base}/v1/messages/payments"))
                    .header("Idempotency-Key", format!("m{i}"))
                    .header("Content-Type", "application/json")
                    .body(payload(i))
                    .send()
                    .await;
                // A worker killed meanwhile refuses the connection: the caller sends again.
                if let Ok(r) = r {
                    assert!(
                        [200, 202].contains(&r.status().as_u16()),
                        "m{i}: {}",
                        r.status()
                    );
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// The states of claims `m{from}..m{to}` (states are stored in clear).
async fn states(url: &str, from: usize, to: usize) -> Vec<ClaimState> {
    let s = claimd::store::open(url, 2).await.unwrap();
    let mut out = Vec::new();
    for i in from..to {
        out.push(
            s.get("payments", "", &format!("m{i}"))
                .await
                .unwrap()
                .map_or(ClaimState::Started, |c| c.state),
        );
    }
    out
}

async fn all_completed(url: &str, from: usize, to: usize, within: Duration) -> bool {
    eventually(within, || async {
        states(url, from, to)
            .await
            .iter()
            .all(|s| *s == ClaimState::Completed)
    })
    .await
}

/// Where the secrets are found in `bytes`, if anywhere.
fn found_in(bytes: &[u8], what: &str) -> Vec<String> {
    let mut out = Vec::new();
    for secret in SECRETS {
        if let Some(at) = bytes
            .windows(secret.len())
            .position(|w| w == secret.as_bytes())
        {
            let from = at.saturating_sub(40);
            let to = (at + 60).min(bytes.len());
            out.push(format!(
                "{what}: {secret:?} at byte {at}: {:?}",
                String::from_utf8_lossy(&bytes[from..to])
            ));
        }
    }
    out
}

/// An outcome destination that never answers (a closed port): the outbox keeps every event.
fn unreachable_outcomes() -> String {
    format!(
        "[[consumers.outcomes]]\nkind = \"http\"\nname = \"hooks\"\nurl = \"http://127.0.0.1:{}/hook\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\ntimeout = \"1s\"\npoll = \"5s\"\n",
        free_port()
    )
}

/// What `claims show m{i}` says (it opens the payload with the configured keys).
fn shown(s: &Setup, i: usize) -> String {
    // `--reveal`: the card token is a sensitive field, masked otherwise.
    let (code, out, err) = s.cli(&["claims", "show", "payments", &format!("m{i}"), "--reveal"]);
    assert_eq!(code, 0, "claims show m{i}: {err}");
    out
}

const MANY: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_personal_is_in_the_sqlite_file_in_clear() {
    let store = TestStore::sqlite();
    let url = store.url();
    let provider = TestProvider::start(Script {
        echo_body: true,
        ..Default::default()
    })
    .await;
    let s = setup(
        &store,
        &provider.url,
        &[K1, FP],
        "k1",
        &unreachable_outcomes(),
    );
    let w = s.spawn().await;
    post_range(&w.base, 0, MANY).await;
    assert!(all_completed(&url, 0, MANY, Duration::from_secs(120)).await);
    // A repeat of a message is a duplicate, another payload under its id a mismatch: the
    // keyed fingerprint tells them apart.
    let repeat = |body: String| {
        client()
            .post(format!("{}/v1/messages/payments", w.base))
            .header("Idempotency-Key", "m7")
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(repeat(payload(7)).await.unwrap().status().as_u16(), 200);
    assert_eq!(repeat(payload(8)).await.unwrap().status().as_u16(), 422);
    w.terminate();
    // Operators still read everything (revealed), opened with the keys.
    let page = shown(&s, 7);
    assert!(page.contains("tok_secretcard_00007"), "{page}");
    assert!(page.contains("hmac-sha256:"), "keyed fingerprint: {page}");
    let file = PathBuf::from(url.trim_start_matches("sqlite://"));
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let events: i64 = sqlx::query("SELECT COUNT(*) FROM outcome_events")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert!(
        events >= MANY as i64,
        "the outbox holds the events: {events}"
    );
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let mut found = Vec::new();
    for f in [file.clone(), file.with_extension("db-wal")] {
        if let Ok(bytes) = std::fs::read(&f) {
            found.extend(found_in(&bytes, &f.display().to_string()));
        }
    }
    assert!(found.is_empty(), "in clear: {found:#?}");
    // The plain SHA-256 of a payload is not stored either.
    let plain_print = claimd::domain::claim::fingerprint(payload(7).as_bytes());
    let bytes = std::fs::read(&file).unwrap();
    assert!(
        !bytes
            .windows(plain_print.len())
            .any(|w| w == plain_print.as_bytes())
    );
    let (code, out, err) = s.cli(&["keys", "status", "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["counts"]["claims.payload"]["k1"], MANY as u64);
    assert_eq!(status["to_rotate"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_personal_is_in_the_postgres_files_in_clear() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let url = store.url();
    let provider = TestProvider::start(Script {
        echo_body: true,
        ..Default::default()
    })
    .await;
    let s = setup(
        &store,
        &provider.url,
        &[K1, FP],
        "k1",
        &unreachable_outcomes(),
    );
    let w = s.spawn().await;
    post_range(&w.base, 0, MANY).await;
    assert!(all_completed(&url, 0, MANY, Duration::from_secs(120)).await);
    w.terminate();
    assert!(shown(&s, 11).contains("tok_secretcard_00011"));
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("CHECKPOINT").execute(&pool).await.unwrap();
    let data: String = sqlx::query("SHOW data_directory")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    let mut files: Vec<PathBuf> = Vec::new();
    for rel in ["claims", "outcome_events", "claim_events"] {
        let row = sqlx::query(
            "SELECT pg_relation_filepath(c.oid), pg_relation_filepath(NULLIF(c.reltoastrelid, 0)) \
             FROM pg_class c WHERE c.relname = $1 AND c.relkind = 'r'",
        )
        .bind(rel)
        .fetch_one(&pool)
        .await
        .unwrap();
        for col in 0..2 {
            if let Some(p) = row.get::<Option<String>, _>(col) {
                files.push(Path::new(&data).join(p));
            }
        }
    }
    let events: i64 = sqlx::query("SELECT COUNT(*) FROM outcome_events")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert!(
        events >= MANY as i64,
        "the outbox holds the events: {events}"
    );
    pool.close().await;
    let mut found = Vec::new();
    let mut read = 0;
    for f in &files {
        // A relation's file and its 1 GB segments (`.1`, `.2`, ...).
        for seg in 0.. {
            let path = match seg {
                0 => f.clone(),
                n => PathBuf::from(format!("{}.{n}", f.display())),
            };
            let Ok(bytes) = std::fs::read(&path) else {
                break;
            };
            read += bytes.len();
            found.extend(found_in(&bytes, &path.display().to_string()));
        }
    }
    assert!(read > 100_000, "read the table files: {files:?}");
    assert!(found.is_empty(), "in clear: {found:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_while_messages_flow_and_workers_die_leaves_every_claim_readable_and_sent_once()
{
    let store = TestStore::sqlite();
    let url = store.url();
    let provider = TestProvider::start(Script {
        delay_before_apply_ms: 300,
        ..Default::default()
    })
    .await;
    let s = setup(&store, &provider.url, &[K1, FP], "k1", "");
    let w = s.spawn().await;
    post_range(&w.base, 0, 200).await;
    // The new key: the running worker still seals with k1, the next ones with k2.
    s.rekey(&[K1, K2, FP], "k2");
    let rotate = |s: &Setup| {
        let config = s.config.clone();
        std::thread::spawn(move || {
            cli(&["--config", &config.display().to_string(), "keys", "rotate"])
        })
    };
    let first = rotate(&s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    w.kill();
    let w = s.spawn().await;
    let more = tokio::spawn({
        let base = w.base.clone();
        async move { post_range(&base, 200, 400).await }
    });
    let second = rotate(&s);
    tokio::time::sleep(Duration::from_millis(700)).await;
    w.kill();
    let _ = more.await;
    let w = s.spawn().await;
    // Messages a killed worker's caller never saw accepted are sent again, as callers do.
    post_range(&w.base, 0, 400).await;
    for r in [first, second] {
        let (code, out, err) = r.join().unwrap();
        assert_eq!(code, 0, "keys rotate: {out}{err}");
    }
    assert!(all_completed(&url, 0, 400, Duration::from_secs(120)).await);
    let (code, out, err) = s.cli(&["keys", "rotate"]);
    assert_eq!(code, 0, "{out}{err}");
    for i in 0..400 {
        assert_eq!(provider.applied(&format!("m{i}")), 1, "m{i} applied once");
    }
    let (code, out, err) = s.cli(&["keys", "status", "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["to_rotate"], 0, "{status}");
    // Each rotation is an admin's act in the operator audit.
    let (code, out, err) = s.cli(&["audit", "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.matches("\"rotate-keys\"").count() >= 3,
        "every rotation is audited: {out}"
    );
    assert_eq!(status["counts"]["claims.payload"]["k2"], 400, "{status}");
    // With k1 retired, every claim still reads.
    s.rekey(&[K2, FP], "k2");
    for i in [0, 133, 250, 399] {
        // Opened: the payload's own length (sealed, it is longer), the answer in clear.
        let page = shown(&s, i);
        let bytes = format!("payload bytes    {}\n", payload(i).len());
        assert!(page.contains(&bytes), "{page}");
        // The provider's answer, opened: the echo of the call, or, for a claim a worker died
        // with and the sweeper settled from the provider's status record, that record.
        assert!(
            page.contains(&format!("{{\"key\":\"m{i}\"}}"))
                || page.contains("reconciled       true"),
            "{page}"
        );
    }
    let (code, _, err) = s.cli(&["keys", "status"]);
    assert_eq!(code, 0, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_key_was_retired_is_parked_and_never_sent() {
    let store = TestStore::sqlite();
    let url = store.url();
    // First nothing answers: the claims are sealed under k1 and wait.
    let s = setup(
        &store,
        &format!("http://127.0.0.1:{}", free_port()),
        &[K1, FP],
        "k1",
        "",
    );
    let w = s.spawn().await;
    post_range(&w.base, 0, 5).await;
    w.terminate();
    // k1 is retired before they could go; the provider now answers.
    let provider = TestProvider::start(Script::default()).await;
    let toml = std::fs::read_to_string(&s.config).unwrap();
    let at = toml.find("url = \"http://127.0.0.1:").unwrap();
    let toml = toml.replace(
        &toml[at..at + toml[at..].find("/v1").unwrap()].to_string(),
        &format!("url = \"{}", provider.url),
    );
    std::fs::write(&s.config, toml).unwrap();
    s.rekey(&[K2, FP], "k2");
    let _w = s.spawn().await;
    let parked = eventually(Duration::from_secs(30), || async {
        states(&url, 0, 5)
            .await
            .iter()
            .all(|s| *s == ClaimState::NeedsAttention)
    })
    .await;
    assert!(parked, "{:?}", states(&url, 0, 5).await);
    for i in 0..5 {
        assert_eq!(provider.requests(&format!("m{i}")), 0, "m{i} never sent");
        let page = shown(&s, i);
        assert!(
            page.contains("sealed with key \\\"k1\\\"") || page.contains("sealed with key \"k1\""),
            "{page}"
        );
    }
    let (code, out, _) = s.cli(&["keys", "status"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("KEY MISSING"), "{out}");
    let metrics = get_text(&format!("{}/metrics", _w.base)).await;
    assert!(
        metrics.contains("claims_sealed_unreadable_total{consumer=\"payments\"} 5"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_stop_claimd_naming_the_key() {
    let store = TestStore::sqlite();
    let s = setup(&store, "http://127.0.0.1:9", &[K1, FP], "k1", "");
    std::fs::remove_file(&s.keys).unwrap();
    let (code, _, err) = s.cli(&["keys", "status"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("encryption.keys_file") && err.contains("cannot read the keys"),
        "{err}"
    );
    std::fs::write(&s.keys, format!("k1=AAECAwQ=\n{FP}")).unwrap();
    let (code, _, err) = s.cli(&["migrate"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"k1\"") && err.contains("5 bytes"), "{err}");
    s.rekey(&[K1, FP], "k9");
    let (code, _, err) = s.cli(&["migrate"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("active key \"k9\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_enqueued_in_clear_is_sealed_when_a_worker_takes_it() {
    let store = TestStore::sqlite();
    let url = store.url();
    let provider = TestProvider::start(Script::default()).await;
    let s = setup(&store, &provider.url, &[K1, FP], "k1", "");
    let w = s.spawn().await;
    // The producer's transaction has no key: the row is written in clear.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for i in 0..5 {
        let body = payload(i);
        let mut tx = pool.begin().await.unwrap();
        let id = format!("m{i}");
        claimd::enqueue(
            &mut *tx,
            &claimd::Enqueue::new("payments", &id, body.as_bytes())
                .content_type("application/json"),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    assert!(all_completed(&url, 0, 5, Duration::from_secs(30)).await);
    for i in 0..5 {
        assert_eq!(provider.applied(&format!("m{i}")), 1);
        let stored: Vec<u8> = sqlx::query("SELECT payload FROM claims WHERE message_id = ?1")
            .bind(format!("m{i}"))
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        assert!(
            stored.starts_with(b"$claimd$v1$k1$"),
            "m{i}: {}",
            String::from_utf8_lossy(&stored)
        );
        let page = shown(&s, i);
        assert!(
            page.contains(&format!("payload bytes    {}\n", payload(i).len())),
            "{page}"
        );
    }
    // Enqueuing the same message again is still recognised (the fingerprint stays plain).
    let mut tx = pool.begin().await.unwrap();
    let again = claimd::enqueue(
        &mut *tx,
        &claimd::Enqueue::new("payments", "m0", payload(0).as_bytes())
            .content_type("application/json"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(
        matches!(again, claimd::Enqueued::Duplicate(_)),
        "a repeat, not a new claim"
    );
    w.terminate();
}
