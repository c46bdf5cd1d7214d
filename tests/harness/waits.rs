//! Waiting for the run to come to rest: queues drained, claims committed, claims settled.

use super::*;

/// Waits until every queue of the run is empty (nothing ready) twice in a row, a second apart.
pub(super) async fn wait_drained(q: &Queues) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(300);
    let mut empty_twice = 0;
    while Instant::now() < end && empty_twice < 2 {
        let mut empty = true;
        for c in &q.consumers {
            match q.ready(&conn, c).await {
                Some((0, _)) => {}
                _ => empty = false,
            }
        }
        empty_twice = if empty { empty_twice + 1 } else { 0 };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = conn.close(200, "ok".into()).await;
}

/// Waits until the store holds at least `n` claims.
pub(super) async fn wait_claimed(store: &Store, n: usize, within: Duration) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(counts) = store.counts(None).await {
            let claims: i64 = counts
                .iter()
                .map(|c| c.completed + c.failed + c.needs_attention + c.started)
                .sum();
            if claims as usize >= n {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until no claim is `started` or `pending`.
pub(super) async fn wait_settled(store: &Store, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if settled_now(store).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Whether no claim is `started` or `pending` now.
pub(super) async fn settled_now(store: &Store) -> bool {
    store
        .open_counts()
        .await
        .map(|c| c.iter().all(|c| c.started == 0 && c.pending == 0))
        .unwrap_or(false)
}
