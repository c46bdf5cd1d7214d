//! Whether a claim claimd has acknowledged is on a standby yet: the PostgreSQL primary's
//! replication settings as claimd reads them ([`ReplicationSettings`]), what they mean for
//! acknowledged claims ([`classify`], [`Replication`]), and the latest reading shared by the
//! parts of a running worker ([`ReplicationWatch`]: intake, `/readyz`, `/metrics`).
//!
//! claimd acknowledges a message once its claim commits on the primary. With a synchronous
//! standby (`synchronous_standby_names` set and `synchronous_commit` = `on`, `remote_write` or
//! `remote_apply`) that commit waits until a standby has the claim, so a failover to that
//! standby keeps every acknowledged claim. Otherwise the last claims acknowledged before a
//! failover may never reach the standby that takes over: they are gone, though their effects
//! may have been performed. docs/postgresql.md, "Replication: when an acknowledged claim can be
//! lost". A read replica's own state ([`ReplicaReading`]) is here too.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the docs explain the choice and the runbook (named in every warning).
pub const DOCS: &str =
    "docs/postgresql.md, \"Replication: when an acknowledged claim can be lost\"";

/// The primary's settings and standbys as one claimd connection sees them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicationSettings {
    /// `pg_is_in_recovery()`: the server is itself a standby.
    pub in_recovery: bool,
    /// `synchronous_standby_names` (empty: no synchronous standby).
    pub synchronous_standby_names: String,
    /// `synchronous_commit` as claimd's sessions have it (role and database settings
    /// included): `on`, `remote_apply`, `remote_write`, `local` or `off`.
    pub synchronous_commit: String,
    /// Standbys streaming from this server (rows of `pg_stat_replication`); `None` when claimd
    /// could not read the view.
    pub standbys: Option<i64>,
    /// Of those, the ones the server names `sync` or `quorum`; `None` when the role may not
    /// see their `sync_state` (it needs `pg_read_all_stats`) or the view could not be read.
    pub synchronous_standbys: Option<i64>,
}

/// What the settings mean for an acknowledged claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationMode {
    /// Every commit waits for a synchronous standby: a failover to it loses no acknowledged
    /// claim.
    Synchronous,
    /// Standbys may be attached, but commits do not wait for them: a failover can lose the
    /// claims acknowledged in its last moments.
    Asynchronous,
    /// No standby is attached (or claimd cannot see `pg_stat_replication`) and none is named
    /// synchronous: acknowledged claims are on this server only.
    None,
    /// The settings could not be read, or the server is a standby itself.
    Unknown,
}

impl ReplicationMode {
    /// Every mode, in the order the gauge lists them.
    pub const ALL: [ReplicationMode; 4] = [
        ReplicationMode::Synchronous,
        ReplicationMode::Asynchronous,
        ReplicationMode::None,
        ReplicationMode::Unknown,
    ];

    /// The label of `claimd_store_replication{mode}` and `/readyz`: `synchronous`,
    /// `asynchronous`, `none` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicationMode::Synchronous => "synchronous",
            ReplicationMode::Asynchronous => "asynchronous",
            ReplicationMode::None => "none",
            ReplicationMode::Unknown => "unknown",
        }
    }
}

/// The settings with what they mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// The mode.
    pub mode: ReplicationMode,
    /// `synchronous_commit = off`: a claim is acknowledged before the primary has flushed it,
    /// so a crash of the primary alone, without any failover, can lose the last ones.
    pub unflushed: bool,
    /// What was read.
    pub settings: ReplicationSettings,
}

/// Whether `synchronous_commit` makes a commit wait for the synchronous standbys.
fn waits_for_standby(commit: &str) -> bool {
    matches!(commit, "on" | "remote_write" | "remote_apply")
}

/// What `s` means for acknowledged claims (see [`ReplicationMode`]).
pub fn classify(s: &ReplicationSettings) -> Replication {
    let names = s.synchronous_standby_names.trim();
    let commit = s.synchronous_commit.trim().to_ascii_lowercase();
    let mode = if s.in_recovery {
        ReplicationMode::Unknown
    } else if !names.is_empty() && waits_for_standby(&commit) {
        ReplicationMode::Synchronous
    } else if !names.is_empty() || s.standbys.is_some_and(|n| n > 0) {
        ReplicationMode::Asynchronous
    } else {
        ReplicationMode::None
    };
    Replication {
        mode,
        unflushed: commit == "off",
        settings: s.clone(),
    }
}

impl Replication {
    /// The settings as the warning names them: `synchronous_standby_names = '…',
    /// synchronous_commit = …, N standbys attached`.
    pub fn settings_text(&self) -> String {
        let s = &self.settings;
        let attached = match (s.standbys, s.synchronous_standbys) {
            (None, _) => "standbys attached: unknown (pg_stat_replication unreadable)".into(),
            (Some(n), Some(k)) if n > 0 => format!("{n} standby(s) attached, {k} synchronous"),
            (Some(n), _) => format!("{n} standby(s) attached"),
        };
        format!(
            "synchronous_standby_names = '{}', synchronous_commit = {}, {attached}",
            s.synchronous_standby_names, s.synchronous_commit
        )
    }

    /// Whether an acknowledged claim can be lost: in every mode but synchronous
    /// (`synchronous_commit = off` is never synchronous, see [`classify`]).
    pub fn can_lose_acknowledged(&self) -> bool {
        self.mode != ReplicationMode::Synchronous
    }

    /// One sentence in plain words: what the mode means for acknowledged claims, the
    /// settings, and where the docs are.
    pub fn describe(&self) -> String {
        let settings = self.settings_text();
        let mut text = match self.mode {
            ReplicationMode::Synchronous => {
                let mut t = format!(
                    "PostgreSQL replication is synchronous ({settings}): a claim is acknowledged only once a synchronous standby has it, so a failover to that standby loses no acknowledged claim"
                );
                if self.settings.synchronous_standbys == Some(0) {
                    t.push_str(
                        "; no synchronous standby is connected now, so every commit waits until one connects: no message is acknowledged meanwhile",
                    );
                }
                t
            }
            ReplicationMode::Asynchronous => format!(
                "PostgreSQL replication is asynchronous ({settings}): a claim is acknowledged once the primary commits it, before a standby has it, so a failover can lose claims that were already acknowledged (for payments: payment requests the provider may have performed, with no claim left)"
            ),
            ReplicationMode::None => format!(
                "PostgreSQL has no synchronous standby and none attached ({settings}): acknowledged claims are on this server only; losing it, or a failover to a standby that is not synchronous, can lose claims that were already acknowledged (for payments: payment requests the provider may have performed, with no claim left)"
            ),
            ReplicationMode::Unknown if self.settings.in_recovery => format!(
                "the PostgreSQL server claimd is connected to is a standby (pg_is_in_recovery() is true; {settings}): whether acknowledged claims are on another server is unknown"
            ),
            ReplicationMode::Unknown => format!(
                "PostgreSQL replication is unknown ({settings}): whether acknowledged claims are on a standby cannot be told"
            ),
        };
        if self.unflushed {
            text.push_str(
                "; synchronous_commit = off: a claim is acknowledged before the primary has even flushed it, so a crash of the primary alone, with no failover, can lose the last acknowledged claims",
            );
        }
        text.push_str(&format!(" (see {DOCS})"));
        text
    }
}

/// The latest replication reading of a running worker, and whether the configuration requires
/// a synchronous standby (`[store] require_synchronous_standby`).
#[derive(Debug, Default)]
pub struct ReplicationWatch {
    required: AtomicBool,
    last: Mutex<Option<Replication>>,
}

impl ReplicationWatch {
    /// Sets whether a synchronous standby is required.
    pub fn require_synchronous(&self, required: bool) {
        self.required.store(required, Ordering::SeqCst);
    }

    /// Whether a synchronous standby is required.
    pub fn required(&self) -> bool {
        self.required.load(Ordering::SeqCst)
    }

    /// Records a reading; returns the previous one.
    pub fn set(&self, r: Replication) -> Option<Replication> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.replace(r)
    }

    /// The latest reading (`None`: none yet, or a SQLite store).
    pub fn get(&self) -> Option<Replication> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Why intake refuses new messages: a synchronous standby is required and the latest
    /// reading is not synchronous. `None` when not required, or no reading was made yet (a
    /// worker that started with the requirement had a synchronous reading first).
    pub fn refusal(&self) -> Option<String> {
        if !self.required() {
            return None;
        }
        let r = self.get()?;
        (r.mode != ReplicationMode::Synchronous).then(|| {
            format!(
                "[store] require_synchronous_standby is set and {}",
                r.describe()
            )
        })
    }
}

/// What a read replica (`[store] read_url`, [`crate::store::read_replica`]) says of itself.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReplicaReading {
    /// `pg_is_in_recovery()`: a standby. `false`: the server is a primary (promoted, or
    /// `read_url` names one), and the reads load it.
    pub in_recovery: bool,
    /// Its WAL receiver streams from a primary now (shown only to roles with
    /// `pg_read_all_stats`; `false` otherwise).
    pub streaming: bool,
    /// How far behind the primary it may be, in seconds: 0 when streaming and everything
    /// received is replayed, else the age of the last transaction replayed (too large when the
    /// primary was idle); `None` when it is not a standby.
    pub lag_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(names: &str, commit: &str, standbys: Option<i64>) -> ReplicationSettings {
        ReplicationSettings {
            in_recovery: false,
            synchronous_standby_names: names.into(),
            synchronous_commit: commit.into(),
            standbys,
            synchronous_standbys: None,
        }
    }

    #[test]
    fn named_standbys_with_a_waiting_commit_are_synchronous() {
        for commit in ["on", "remote_write", "remote_apply", "ON"] {
            let r = classify(&settings("FIRST 1 (s1)", commit, Some(1)));
            assert_eq!(r.mode, ReplicationMode::Synchronous, "{commit}");
            assert!(!r.can_lose_acknowledged());
            assert!(!r.unflushed);
        }
        // Named but none connected: still synchronous (commits wait), and said.
        let mut s = settings("s1", "on", Some(0));
        s.synchronous_standbys = Some(0);
        let r = classify(&s);
        assert_eq!(r.mode, ReplicationMode::Synchronous);
        assert!(
            r.describe().contains("every commit waits"),
            "{}",
            r.describe()
        );
    }

    #[test]
    fn a_commit_that_does_not_wait_makes_named_standbys_asynchronous() {
        let r = classify(&settings("s1", "local", Some(1)));
        assert_eq!(r.mode, ReplicationMode::Asynchronous);
        assert!(!r.unflushed);
        let r = classify(&settings("s1", "off", Some(1)));
        assert_eq!(r.mode, ReplicationMode::Asynchronous);
        assert!(r.unflushed);
        assert!(
            r.describe()
                .contains("a crash of the primary alone, with no failover, can lose"),
            "{}",
            r.describe()
        );
    }

    #[test]
    fn attached_standbys_without_names_are_asynchronous() {
        let r = classify(&settings("", "on", Some(2)));
        assert_eq!(r.mode, ReplicationMode::Asynchronous);
        assert!(r.can_lose_acknowledged());
        let text = r.describe();
        assert!(text.contains("a failover can lose claims that were already acknowledged"));
        assert!(text.contains("synchronous_standby_names = ''"), "{text}");
        assert!(text.contains(DOCS), "{text}");
    }

    #[test]
    fn nothing_attached_or_nothing_visible_is_none() {
        for standbys in [Some(0), None] {
            let r = classify(&settings("", "on", standbys));
            assert_eq!(r.mode, ReplicationMode::None, "{standbys:?}");
            assert!(r.describe().contains("on this server only"));
        }
        let r = classify(&settings("", "off", Some(0)));
        assert_eq!(r.mode, ReplicationMode::None);
        assert!(r.unflushed);
        assert!(r.settings_text().contains("0 standby(s) attached"));
        assert!(
            classify(&settings("", "on", None))
                .settings_text()
                .contains("unknown")
        );
    }

    #[test]
    fn a_server_in_recovery_is_unknown() {
        let mut s = settings("s1", "on", Some(0));
        s.in_recovery = true;
        let r = classify(&s);
        assert_eq!(r.mode, ReplicationMode::Unknown);
        assert!(r.describe().contains("is a standby"), "{}", r.describe());
    }

    #[test]
    fn the_watch_refuses_only_when_required_and_not_synchronous() {
        let w = ReplicationWatch::default();
        w.set(classify(&settings("", "on", Some(0))));
        assert_eq!(w.refusal(), None, "not required");
        w.require_synchronous(true);
        let why = w.refusal().expect("refused");
        assert!(why.contains("require_synchronous_standby"), "{why}");
        w.set(classify(&settings("s1", "on", Some(1))));
        assert_eq!(w.refusal(), None);
        let labels: Vec<_> = ReplicationMode::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(labels, ["synchronous", "asynchronous", "none", "unknown"]);
    }
}
