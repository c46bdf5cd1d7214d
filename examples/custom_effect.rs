//! A Rust service that embeds claimd with an effect of its own.
//!
//! The effect writes an entry into the service's own ledger database (a SQLite file here; the
//! same shape fits a gRPC call or any write with a unique key). Its idempotency is the
//! ledger's: the claim's idempotency key is the entry's primary key, so a second write of the
//! same key changes nothing, and [`Effect::lookup`] reads the entry back when an answer was
//! lost. claimd runs inside this program's Tokio runtime: messages come in over claimd's HTTP
//! intake or from the program itself ([`Worker::submit`]).
//!
//! ```sh
//! cargo run --example custom_effect
//! ```
//!
//! It submits 20 orders (each twice), one over HTTP, one with a zero amount (refused by the
//! effect: `failed`), and loses the answer of one write (the effect says "unknown" after
//! writing, as a timeout would). Then it checks that every order was written exactly once and
//! exits 1 if not. `tests/suite/library.rs` runs [`demo`].

use claimd::{Effect, Lookup, Outcome, Worker, async_trait};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One ledger entry, as the message payload carries it.
#[derive(Debug, serde::Deserialize)]
struct Entry {
    account: String,
    amount_cents: i64,
}

/// The effect: one entry in the service's ledger per idempotency key.
#[derive(Clone)]
pub struct LedgerWrite {
    pool: SqlitePool,
    /// Keys whose next write answers "unknown" after it committed (a lost answer).
    lose_answer: Arc<Mutex<HashSet<String>>>,
    /// Writes that inserted an entry, and writes that found the key already there.
    inserted: Arc<AtomicUsize>,
    repeated: Arc<AtomicUsize>,
}

impl LedgerWrite {
    /// Opens (or creates) the ledger at `path`.
    pub async fn open(path: &Path) -> sqlx::Result<LedgerWrite> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS ledger_entries (
                idem_key TEXT PRIMARY KEY,
                account TEXT NOT NULL,
                amount_cents INTEGER NOT NULL
            )",
        )
        .execute(&pool)
        .await?;
        Ok(LedgerWrite {
            pool,
            lose_answer: Arc::default(),
            inserted: Arc::default(),
            repeated: Arc::default(),
        })
    }

    /// The next write for `key` commits, then answers as if it had timed out.
    pub fn lose_answer_for(&self, key: &str) {
        self.lose_answer.lock().unwrap().insert(key.to_string());
    }

    /// Entries per idempotency key.
    pub async fn entries(&self) -> sqlx::Result<BTreeMap<String, i64>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT idem_key, COUNT(*) FROM ledger_entries GROUP BY idem_key")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().collect())
    }

    async fn write(&self, key: &str, entry: &Entry) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO ledger_entries (idem_key, account, amount_cents) VALUES (?, ?, ?)
             ON CONFLICT (idem_key) DO NOTHING",
        )
        .bind(key)
        .bind(&entry.account)
        .bind(entry.amount_cents)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

#[async_trait]
impl Effect for LedgerWrite {
    async fn perform(&self, claim: &claimd::Claim) -> Outcome {
        let entry: Entry = match serde_json::from_slice(&claim.payload) {
            Ok(entry) => entry,
            // `validate` refused such payloads at intake; this is a permanent refusal.
            Err(e) => return rejected(format!("not a ledger entry: {e}")),
        };
        if entry.amount_cents <= 0 {
            return rejected("amount_cents must be positive".into());
        }
        // claimd does not cancel a call: the effect keeps within its configured timeout.
        match tokio::time::timeout(
            Duration::from_millis(800),
            self.write(&claim.idem_key, &entry),
        )
        .await
        {
            Ok(Ok(inserted)) => {
                let counter = if inserted {
                    &self.inserted
                } else {
                    &self.repeated
                };
                counter.fetch_add(1, Ordering::SeqCst);
                if self.lose_answer.lock().unwrap().remove(&claim.message_id) {
                    return Outcome::Unknown {
                        status: None,
                        error: "the ledger's answer was lost".into(),
                    };
                }
                Outcome::Applied {
                    status: 200,
                    response: format!("ledger entry {}", claim.idem_key),
                }
            }
            // The write may or may not have committed: never guessed, `lookup` decides.
            Ok(Err(e)) => Outcome::Unknown {
                status: None,
                error: format!("ledger write: {e}"),
            },
            Err(_) => Outcome::Unknown {
                status: None,
                error: "ledger write timed out".into(),
            },
        }
    }

    async fn lookup(&self, claim: &claimd::Claim) -> Option<Lookup> {
        let found: Result<Option<(String, i64)>, _> =
            sqlx::query_as("SELECT account, amount_cents FROM ledger_entries WHERE idem_key = ?")
                .bind(&claim.idem_key)
                .fetch_optional(&self.pool)
                .await;
        Some(match found {
            Ok(Some((account, amount))) => Lookup::Found {
                status: 200,
                response: format!("{account}: {amount}"),
                provider_id: Some(claim.idem_key.clone()),
            },
            Ok(None) => Lookup::NotFound {
                status: 404,
                detail: "no ledger entry under this key".into(),
            },
            Err(e) => Lookup::Unknown {
                error: e.to_string(),
            },
        })
    }

    fn can_reconcile(&self) -> bool {
        true
    }

    fn validate(&self, payload: &[u8], _content_type: &str) -> Result<(), String> {
        serde_json::from_slice::<Entry>(payload)
            .map(|_| ())
            .map_err(|e| format!("not a ledger entry ({{\"account\", \"amount_cents\"}}): {e}"))
    }
}

fn rejected(why: String) -> Outcome {
    Outcome::Rejected {
        status: 422,
        response: why,
    }
}

/// What [`demo`] saw.
#[derive(Debug)]
pub struct Summary {
    /// Ledger entries per message id that was meant to be written.
    pub entries: BTreeMap<String, i64>,
    /// Writes that inserted an entry.
    pub inserted: usize,
    /// Writes that found their key already written.
    pub repeated: usize,
    /// Each message id's final claim state.
    pub states: BTreeMap<String, String>,
    /// Duplicates claimd recognised without calling the effect.
    pub duplicates: i64,
}

/// Runs claimd with the ledger effect in this runtime, on files under `dir`: `orders` orders
/// (each submitted twice in process, `order-0` also over HTTP), one refused order
/// (`order-zero`), and the answer of `order-3`'s first write lost.
pub async fn demo(dir: &Path, orders: usize) -> Result<Summary, Box<dyn std::error::Error>> {
    let ledger = LedgerWrite::open(&dir.join("ledger.db")).await?;
    ledger.lose_answer_for("order-3");
    let config = format!(
        r#"
[store]
url = "sqlite://{claims}"
[http]
listen = "127.0.0.1:0"
[sweeper]
schedule = "* * * * * *"
[[consumers]]
name = "ledger"
source = "http"
concurrency = 8
lease = "2s"
on_unknown = "reconcile"
[consumers.effect]
kind = "custom"
timeout = "1s"
"#,
        claims = dir.join("claims.db").display()
    );
    let worker = Worker::from_toml(&config)?
        .effect("ledger", ledger.clone())
        .start()
        .await?;

    let mut ids: Vec<String> = (0..orders).map(|i| format!("order-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let body = format!(
            r#"{{"account": "acct-{}", "amount_cents": {}}}"#,
            i % 3,
            100 + i
        );
        worker.submit("ledger", id, body.clone()).await?;
        worker.submit("ledger", id, body).await?; // a redelivery: a duplicate
    }
    let http = claimd::provider::tls::http_client_builder()
        .build()
        .expect("HTTP client")
        .post(format!("http://{}/v1/messages/ledger", worker.http_addr()))
        .header("Idempotency-Key", "order-0")
        .header("Content-Type", "application/json")
        .body(r#"{"account": "acct-0", "amount_cents": 100}"#)
        .send()
        .await?;
    if !http.status().is_success() {
        return Err(format!("HTTP intake answered {}", http.status()).into());
    }
    worker
        .submit(
            "ledger",
            "order-zero",
            r#"{"account": "acct-0", "amount_cents": 0}"#,
        )
        .await?;
    ids.push("order-zero".into());

    // Settled claims: completed or failed. The lost answer waits out its lease (2 s) and the
    // sweeper's lookup finds the entry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut states = BTreeMap::new();
    let mut keys = BTreeMap::new();
    let mut duplicates;
    loop {
        duplicates = 0;
        for id in &ids {
            let claim = worker.claim("ledger", "", id).await?;
            let state = claim.as_ref().map_or("missing", |c| c.state.as_str());
            duplicates += claim.as_ref().map_or(0, |c| c.duplicate_count);
            states.insert(id.clone(), state.to_string());
            if let Some(c) = claim {
                keys.insert(id.clone(), c.idem_key);
            }
        }
        let open = states.values().any(|s| s == "started" || s == "missing");
        if !open || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;

    let written = ledger.entries().await?;
    let entries = ids
        .iter()
        .map(|id| {
            let n = keys.get(id).and_then(|k| written.get(k)).copied();
            (id.clone(), n.unwrap_or(0))
        })
        .collect();
    Ok(Summary {
        entries,
        inserted: ledger.inserted.load(Ordering::SeqCst),
        repeated: ledger.repeated.load(Ordering::SeqCst),
        states,
        duplicates,
    })
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("claimd-custom-effect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let summary = demo(&dir, 20).await;
    let _ = std::fs::remove_dir_all(&dir);
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            eprintln!("custom_effect: {e}");
            std::process::exit(1);
        }
    };
    for (id, state) in &summary.states {
        println!(
            "{id:<12} {state:<10} ledger entries: {}",
            summary.entries[id]
        );
    }
    println!(
        "writes: {} inserted, {} found already written; duplicates recognised: {}",
        summary.inserted, summary.repeated, summary.duplicates
    );
    let once = summary
        .entries
        .iter()
        .all(|(id, n)| *n == if id == "order-zero" { 0 } else { 1 });
    if !once {
        eprintln!("custom_effect: an order was not written exactly once");
        std::process::exit(1);
    }
}
