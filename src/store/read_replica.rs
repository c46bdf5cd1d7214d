//! Operators' reads from a read replica (`[store] read_url`, PostgreSQL): the claim searches
//! (the page, `GET /v1/claims`, `claimd claims list`), the reports and the ledger's claims run
//! on a standby, so that operators searching never load the primary that takes the payments.
//! Every write and every read a decision is taken on (claims, settles, an operator's resolve or
//! redrive, a claim's own page) stays on the primary.
//!
//! [`Reads::reader`] reads the replica's state first (one statement on the replica): its lag
//! goes with the answer, so the operator sees how old what they read may be. When the replica
//! cannot be read, [`ReadFallback`] decides: `primary` (the default) runs the read on the
//! primary, one at a time per instance ([`FALLBACK_TURNS`], waiting at most
//! [`FALLBACK_WAIT`]), with the notice carried in the answer; `refuse` answers busy. A person
//! in an incident can still find a claim, and a crowd of searches cannot reach the primary at
//! once.

pub use crate::store::replication::ReplicaReading;
use crate::store::{Store, StoreError, StoreResult};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Reads on the primary at once, per instance, while the replica cannot be read.
pub const FALLBACK_TURNS: usize = 1;

/// How long a read waits for its turn on the primary before it is answered busy.
pub const FALLBACK_WAIT: Duration = Duration::from_secs(5);

/// How long reading the replica's state may take before the replica counts as down.
pub const READING_WAIT: Duration = Duration::from_secs(3);

/// How long a reading of the replica's state is used again: many operators searching at once
/// cost the replica one reading a second, not one per search.
pub const READING_REUSED: Duration = Duration::from_secs(1);

/// What to do with an operator's read when the replica cannot be read (`[store]
/// read_fallback`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadFallback {
    /// Run it on the primary, one at a time per instance, saying so.
    #[default]
    Primary,
    /// Answer busy: nothing of an operator's reads ever reaches the primary.
    Refuse,
}

/// Where a read ran, with the replica's state: what the page, the JSON and the CLI show.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadFrom {
    /// `primary` (no replica configured), `replica`, or `primary_fallback` (the replica could
    /// not be read; the read ran on the primary).
    pub source: &'static str,
    /// The replica's state, when it was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaReading>,
    /// Why the replica was not used, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_error: Option<String>,
}

impl ReadFrom {
    /// Read from a standby that had replayed everything (under half a second behind).
    pub fn up_to_date(&self) -> bool {
        matches!(self.replica, Some(r) if r.in_recovery && r.lag_s.is_some_and(|l| l < 0.5))
    }

    /// One line for a person: where the read ran and how old it may be; `None` when there is
    /// no replica.
    pub fn notice(&self) -> Option<String> {
        match (self.source, &self.replica) {
            ("replica", Some(r)) if !r.in_recovery => Some(
                "read from the read replica, which is not a standby (pg_is_in_recovery() is false): it may have been promoted, and these reads load a primary".into(),
            ),
            ("replica", Some(_)) if self.up_to_date() => {
                Some("read from the read replica, up to date".into())
            }
            ("replica", Some(r)) => Some(match r.lag_s {
                Some(lag) => format!(
                    "read from the read replica, up to {lag:.1} s behind the primary: claims received since may be missing, and states may have moved"
                ),
                None => "read from the read replica; its lag is unknown".into(),
            }),
            ("primary_fallback", _) => Some(format!(
                "the read replica cannot be read ({}): this read ran on the primary, one at a time",
                self.replica_error.as_deref().unwrap_or("no answer")
            )),
            _ => None,
        }
    }
}

/// A store to read from, and where it is.
pub struct Reader {
    /// The store to run the reads on.
    pub store: Store,
    /// Where it is.
    pub from: ReadFrom,
    /// The turn on the primary, held until the reads end.
    _turn: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// The replica's latest state, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaStatus {
    /// The replica, its URL redacted.
    pub url: String,
    /// The latest reading; `Err`: why it could not be read.
    pub reading: Result<ReplicaReading, String>,
    /// Reads run on the primary because the replica could not be read, since start.
    pub fallbacks: u64,
    /// Reads refused because the replica could not be read, since start.
    pub refused: u64,
}

struct Replica {
    #[cfg(feature = "postgres")]
    pg: crate::store::postgres::PgStore,
    store: Store,
    url: String,
    fallback: ReadFallback,
    turns: Arc<Semaphore>,
    /// The latest reading, and when it was taken.
    last: Mutex<Option<(Instant, Result<ReplicaReading, String>)>>,
    fallbacks: AtomicU64,
    refused: AtomicU64,
}

/// Where operators' reads go: the primary, or a read replica.
#[derive(Clone)]
pub struct Reads {
    primary: Store,
    replica: Option<Arc<Replica>>,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads")
            .field("replica", &self.replica.as_ref().map(|r| &r.url))
            .finish_non_exhaustive()
    }
}

impl Reads {
    /// Every read on the primary (no `read_url`).
    pub fn primary(primary: Store) -> Reads {
        Reads {
            primary,
            replica: None,
        }
    }

    /// Reads on the replica at `url` (a pool of at most `max_connections`, connected lazily,
    /// through `pooler` as the primary is),
    /// falling back as `fallback` says. Only PostgreSQL has replicas. Must be called inside a
    /// Tokio runtime.
    pub fn with_replica(
        primary: Store,
        url: &str,
        max_connections: u32,
        fallback: ReadFallback,
        pooler: crate::store::pooler::Pooler,
    ) -> StoreResult<Reads> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::BadUrl(url.to_string()));
        }
        #[cfg(feature = "postgres")]
        {
            let pg =
                crate::store::postgres::PgStore::connect_replica(url, max_connections, pooler)?;
            Ok(Reads {
                primary,
                replica: Some(Arc::new(Replica {
                    store: Arc::new(pg.clone()),
                    pg,
                    url: crate::store::redact_url(url),
                    fallback,
                    turns: Arc::new(Semaphore::new(FALLBACK_TURNS)),
                    last: Mutex::new(None),
                    fallbacks: AtomicU64::new(0),
                    refused: AtomicU64::new(0),
                })),
            })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (primary, max_connections, fallback, pooler);
            Err(StoreError::NotBuiltIn(url.to_string(), "postgres"))
        }
    }

    /// Whether a replica is configured.
    pub fn has_replica(&self) -> bool {
        self.replica.is_some()
    }

    /// A store for an operator's reads: the replica, with its state read just now; else, as
    /// `read_fallback` says, the primary (one read at a time) or [`StoreError::Busy`].
    pub async fn reader(&self) -> StoreResult<Reader> {
        let Some(r) = &self.replica else {
            return Ok(Reader {
                store: self.primary.clone(),
                from: ReadFrom {
                    source: "primary",
                    replica: None,
                    replica_error: None,
                },
                _turn: None,
            });
        };
        let why = match r.recent().await {
            Ok(reading) => {
                return Ok(Reader {
                    store: r.store.clone(),
                    from: ReadFrom {
                        source: "replica",
                        replica: Some(reading),
                        replica_error: None,
                    },
                    _turn: None,
                });
            }
            Err(why) => why,
        };
        if r.fallback == ReadFallback::Refuse {
            r.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Busy(format!(
                "the read replica cannot be read ({why}), and [store] read_fallback = \"refuse\" keeps operators' reads off the primary"
            )));
        }
        let turn = tokio::time::timeout(FALLBACK_WAIT, r.turns.clone().acquire_owned()).await;
        let Ok(Ok(turn)) = turn else {
            r.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Busy(format!(
                "the read replica cannot be read ({why}), and another operator's read is running on the primary (one at a time) for over {} s",
                FALLBACK_WAIT.as_secs()
            )));
        };
        r.fallbacks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(replica = %r.url, error = %why, "the read replica cannot be read: an operator's read runs on the primary, one at a time");
        Ok(Reader {
            store: self.primary.clone(),
            from: ReadFrom {
                source: "primary_fallback",
                replica: None,
                replica_error: Some(why),
            },
            _turn: Some(turn),
        })
    }

    /// The replica's state read now, with the counts of reads that fell back or were
    /// refused; `None` without a replica.
    pub async fn status(&self) -> Option<ReplicaStatus> {
        let r = self.replica.as_ref()?;
        let reading = r.read().await;
        Some(ReplicaStatus {
            url: r.url.clone(),
            reading,
            fallbacks: r.fallbacks.load(Ordering::Relaxed),
            refused: r.refused.load(Ordering::Relaxed),
        })
    }
}

impl Replica {
    /// A reading younger than [`READING_REUSED`] when the last one succeeded, else one read
    /// now: a replica that could not be read is asked again at every read, so that reads
    /// return to it as soon as it answers.
    async fn recent(&self) -> Result<ReplicaReading, String> {
        let fresh = self.last.lock().ok().and_then(|l| match &*l {
            Some((at, Ok(r))) if at.elapsed() < READING_REUSED => Some(*r),
            _ => None,
        });
        match fresh {
            Some(r) => Ok(r),
            None => self.read().await,
        }
    }

    /// The replica's state, read now (at most [`READING_WAIT`]); `Err`: why not.
    async fn read(&self) -> Result<ReplicaReading, String> {
        #[cfg(feature = "postgres")]
        let reading = match tokio::time::timeout(READING_WAIT, self.pg.replica_reading()).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} s", READING_WAIT.as_secs())),
        };
        #[cfg(not(feature = "postgres"))]
        let reading = Err::<ReplicaReading, String>("PostgreSQL is not built in".into());
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), reading.clone()));
        }
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(source: &'static str, replica: Option<ReplicaReading>) -> ReadFrom {
        ReadFrom {
            source,
            replica,
            replica_error: Some("connection refused".into()),
        }
    }

    #[test]
    fn the_notice_says_where_a_read_ran_and_how_old_it_may_be() {
        let standby = |lag_s| ReplicaReading {
            in_recovery: true,
            streaming: true,
            lag_s,
        };
        assert_eq!(from("primary", None).notice(), None);
        let up = from("replica", Some(standby(Some(0.0)))).notice().unwrap();
        assert!(up.contains("up to date"), "{up}");
        let behind = from("replica", Some(standby(Some(12.34))))
            .notice()
            .unwrap();
        assert!(behind.contains("12.3 s behind"), "{behind}");
        let promoted = ReplicaReading {
            in_recovery: false,
            streaming: false,
            lag_s: None,
        };
        let p = from("replica", Some(promoted)).notice().unwrap();
        assert!(p.contains("not a standby"), "{p}");
        let f = from("primary_fallback", None).notice().unwrap();
        assert!(
            f.contains("connection refused") && f.contains("on the primary"),
            "{f}"
        );
    }
}
