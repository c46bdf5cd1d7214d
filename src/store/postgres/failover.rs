//! Finding the primary again after a failover, without a restart. The pool connects to one
//! server at a time (sqlx reads one host); claimd checks every new connection takes writes
//! (a standby, or a server in recovery, is refused), closes pooled connections made before a
//! switch, and a monitor task, once a second, checks the server the pool uses and, when it
//! does not answer or answers as a standby, tries the URL's other hosts in order and points
//! the pool at the first that takes writes. With one host (a proxy or a DNS name that moves)
//! the same checks keep a standby's connections out of the pool.

use crate::store::hosts::{HostTargets, SessionAttrs};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Row};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often the monitor checks the server in use.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long one check (a connection and a statement) may take.
const CHECK_WAIT: Duration = Duration::from_secs(2);

/// Whether the session may be used: the one statement claimd runs on each new connection.
const ROLE_CHECK: &str =
    "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";

/// The servers of the store URL and which one the pool uses.
#[derive(Debug)]
pub(super) struct Primary {
    options: Vec<PgConnectOptions>,
    labels: Vec<String>,
    attrs: SessionAttrs,
    current: AtomicUsize,
    born: Instant,
    /// Milliseconds after `born` of the last switch: pooled connections older are closed.
    fence_ms: AtomicU64,
    /// Why no server that takes writes is in use, while that is so.
    trouble: Mutex<Option<String>>,
    /// Wakes the monitor (a new connection met a standby).
    wake: Notify,
    /// Tells connections waiting in `after_connect` that the pool points elsewhere now.
    switched: Notify,
}

/// What a server said it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Writable,
    Standby,
}

impl Primary {
    /// The servers of `targets`, each with the application name set.
    pub(super) fn new(targets: &HostTargets) -> Result<Primary, sqlx::Error> {
        let options = targets
            .urls
            .iter()
            .map(|u| PgConnectOptions::from_str(u).map(|o| o.application_name("claimd")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Primary {
            options,
            labels: targets.labels.clone(),
            attrs: targets.attrs,
            current: AtomicUsize::new(0),
            born: Instant::now(),
            fence_ms: AtomicU64::new(0),
            trouble: Mutex::new(None),
            wake: Notify::new(),
            switched: Notify::new(),
        })
    }

    /// The options of the server the pool uses.
    pub(super) fn current_options(&self) -> PgConnectOptions {
        self.options[self.current.load(Ordering::Acquire)].clone()
    }

    fn label(&self, i: usize) -> &str {
        &self.labels[i]
    }

    /// Why the store has no server that takes writes now, if so (for `/readyz`).
    pub(super) fn trouble(&self) -> Option<String> {
        self.trouble.lock().expect("trouble lock").clone()
    }

    fn set_trouble(&self, why: Option<String>) {
        *self.trouble.lock().expect("trouble lock") = why;
    }

    /// Closes every pooled connection made before now at its next use.
    fn fence(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.fence_ms.store(ms, Ordering::Release);
    }

    /// Whether a pooled connection of this age was made after the last switch.
    fn after_fence(&self, age: Duration) -> bool {
        let since_fence = self
            .born
            .elapsed()
            .saturating_sub(Duration::from_millis(self.fence_ms.load(Ordering::Acquire)));
        age < since_fence
    }

    async fn role(&self, conn: &mut PgConnection) -> Result<Role, sqlx::Error> {
        // The simple protocol: no prepared statement, named or not, so it is safe through a
        // pooler in transaction mode (it is the first statement of every new connection).
        let row = sqlx::raw_sql(ROLE_CHECK).fetch_one(&mut *conn).await?;
        let recovery: bool = row.try_get(0)?;
        let read_only: bool = row.try_get(1)?;
        let standby = match self.attrs {
            SessionAttrs::Primary => recovery,
            SessionAttrs::ReadWrite => recovery || read_only,
        };
        Ok(if standby {
            Role::Standby
        } else {
            Role::Writable
        })
    }

    /// One server's role, on a connection of its own.
    async fn probe(&self, i: usize) -> Result<Role, String> {
        let check = async {
            let mut conn = PgConnection::connect_with(&self.options[i]).await?;
            let role = self.role(&mut conn).await;
            let _ = conn.close().await;
            role
        };
        match tokio::time::timeout(CHECK_WAIT, check).await {
            Ok(Ok(role)) => Ok(role),
            Ok(Err(e)) => Err(crate::store::error::driver_words(&e)),
            Err(_) => Err(format!("no answer within {}s", CHECK_WAIT.as_secs())),
        }
    }
}

/// The pool's hooks: a new connection to a server that does not take writes is refused (and
/// the monitor woken); a pooled connection made before the last switch is closed.
pub(super) fn with_hooks(options: PgPoolOptions, primary: &Arc<Primary>) -> PgPoolOptions {
    let on_connect = Arc::downgrade(primary);
    let on_acquire = Arc::downgrade(primary);
    options
        .after_connect(move |conn, _meta| {
            let primary = on_connect.clone();
            Box::pin(async move {
                let Some(primary) = primary.upgrade() else {
                    return Ok(());
                };
                match primary.role(conn).await? {
                    Role::Writable => Ok(()),
                    Role::Standby => {
                        primary.wake.notify_one();
                        // Give the monitor a moment to find the new primary before the pool
                        // tries again (each refusal is logged by the pool).
                        let _ = tokio::time::timeout(CHECK_WAIT, primary.switched.notified()).await;
                        Err(sqlx::Error::Protocol(format!(
                            "the server is a standby or read-only ({}); claimd needs {}",
                            primary.label(primary.current.load(Ordering::Acquire)),
                            primary.attrs.as_str()
                        )))
                    }
                }
            })
        })
        .before_acquire(move |_conn, meta| {
            let keep = on_acquire
                .upgrade()
                .is_none_or(|primary| primary.after_fence(meta.age));
            Box::pin(async move { Ok(keep) })
        })
}

/// Starts the monitor. It ends when the store (the last holder of `primary`) is dropped.
pub(super) fn watch(pool: PgPool, primary: &Arc<Primary>) {
    let primary = Arc::downgrade(primary);
    tokio::spawn(async move {
        loop {
            let Some(p) = primary.upgrade() else {
                return;
            };
            tokio::select! {
                _ = p.wake.notified() => {}
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            if pool.is_closed() {
                return;
            }
            check(&pool, &p).await;
        }
    });
}

/// One round: the server in use is fine, or the next that takes writes is found.
async fn check(pool: &PgPool, p: &Arc<Primary>) {
    let current = p.current.load(Ordering::Acquire);
    if let Some(why) = p.trouble() {
        // Already looking: each host answers (or refuses) at once, where the pool would wait
        // out its connection retries.
        return search(pool, p, current, why).await;
    }
    let in_use = async {
        let mut conn = pool.acquire().await?;
        p.role(&mut conn).await
    };
    let why = match tokio::time::timeout(CHECK_WAIT, in_use).await {
        Ok(Ok(Role::Writable)) => {
            if p.trouble().is_some() {
                tracing::info!(
                    server = p.label(current),
                    "store: the primary answers again"
                );
            }
            p.set_trouble(None);
            return;
        }
        Ok(Ok(Role::Standby)) => {
            // A pooled connection on a server that stopped taking writes: none of them is
            // any use.
            p.fence();
            format!("{} is a standby or read-only", p.label(current))
        }
        Ok(Err(e)) => format!(
            "{}: {}",
            p.label(current),
            crate::store::error::driver_words(&e)
        ),
        Err(_) => format!(
            "{}: no answer within {}s",
            p.label(current),
            CHECK_WAIT.as_secs()
        ),
    };
    search(pool, p, current, why).await;
}

/// Tries the other hosts in order, then the current one, and points the pool at the first
/// that takes writes; says why when none does.
async fn search(pool: &PgPool, p: &Arc<Primary>, current: usize, why: String) {
    let n = p.options.len();
    let mut seen = Vec::new();
    let mut standbys = 0;
    for step in 1..=n {
        let i = (current + step) % n;
        match p.probe(i).await {
            Ok(Role::Writable) => {
                if i != current {
                    p.current.store(i, Ordering::Release);
                    pool.set_connect_options(p.options[i].clone());
                    p.fence();
                    p.switched.notify_waiters();
                    tracing::warn!(
                        from = p.label(current),
                        to = p.label(i),
                        reason = %why,
                        "store: the primary moved; new connections go to the new one and \
                         connections to the old one are closed"
                    );
                }
                p.set_trouble(None);
                return;
            }
            Ok(Role::Standby) => {
                standbys += 1;
                seen.push(format!("{} is a standby or read-only", p.label(i)));
            }
            Err(e) => seen.push(format!("{}: {e}", p.label(i))),
        }
    }
    if n == 1 && standbys == 0 {
        // One server, unreachable: an outage like any other, which the store's errors already
        // say in the driver's words; there is nowhere else to look.
        p.set_trouble(None);
        return;
    }
    let words = format!(
        "no PostgreSQL server that takes writes ({}): {}",
        p.attrs.as_str(),
        seen.join("; ")
    );
    if p.trouble().as_deref() != Some(words.as_str()) {
        tracing::warn!(reason = %words, "store: looking for the primary");
    }
    p.set_trouble(Some(words));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hosts::split_hosts;

    #[test]
    fn connections_made_before_a_switch_are_closed_and_later_ones_kept() {
        let p = Primary::new(&split_hosts("postgres://u@a:1,b:2/db").unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        p.fence();
        std::thread::sleep(Duration::from_millis(20));
        // Made an hour ago: before the fence. Made just now: after it. (Ages near the fence's
        // would depend on how long the sleeps took on a busy machine.)
        assert!(!p.after_fence(Duration::from_secs(3600)));
        assert!(p.after_fence(Duration::ZERO));
        assert_eq!(p.label(1), "b:2");
        assert_eq!(p.current_options().get_port(), 1);
    }
}
