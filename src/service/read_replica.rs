//! What `claimd run` says at start about its read replica (`[store] read_url`): whether it
//! answers, whether it is a standby, and its lag. A replica that cannot be read does not stop
//! the start: it serves operators' reads only, and intake, claims and settles never use it.

use crate::store::read_replica::{ReadFallback, Reads};

/// Logs the replica's state once: INFO when it is a standby that answers, WARN otherwise
/// (operators' reads then fall back to the primary or are refused, as `fallback` says).
pub async fn say_at_start(reads: &Reads, fallback: ReadFallback) {
    let Some(status) = reads.status().await else {
        return;
    };
    let then = match fallback {
        ReadFallback::Primary => {
            "operators' searches and reports run on the primary, one at a time, until it answers"
        }
        ReadFallback::Refuse => {
            "operators' searches and reports are refused (read_fallback = \"refuse\") until it answers"
        }
    };
    match status.reading {
        Ok(r) if r.in_recovery => tracing::info!(
            replica = %status.url,
            lag_s = r.lag_s,
            streaming = r.streaming,
            "operators' searches, reports and ledger reads run on the read replica"
        ),
        Ok(_) => tracing::warn!(
            replica = %status.url,
            "[store] read_url names a server that is not a standby (pg_is_in_recovery() is false): operators' reads load it as they would a primary"
        ),
        Err(e) => tracing::warn!(
            replica = %status.url,
            error = %e,
            "the read replica ([store] read_url) cannot be read: {then}"
        ),
    }
}
