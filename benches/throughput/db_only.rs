//! The database-only section: claim + settle through `PgStore` from many tasks, against the
//! same single-row statements sent with sqlx directly, and the batched calls.

use super::*;

pub(crate) const RAW_SETTLE: &str = "\
    UPDATE claims SET state = 'completed', processed_utc = now(), updated_utc = now() \
    WHERE id = $1 AND attempt = 1 AND state = 'started'";

pub(crate) fn new_claim(i: usize) -> NewClaim {
    let body = body_of(i);
    NewClaim {
        consumer: "payments".into(),
        tenant: String::new(),
        message_id: format!("m-{i}"),
        idem_key: format!("m-{i}"),
        fingerprint: fingerprint(body.as_bytes()),
        payload: body.into_bytes().into(),
        content_type: "application/json".into(),
        worker: "bench".into(),
        lease: Duration::from_secs(60),
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    }
}

pub(crate) fn applied() -> Settlement {
    Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        provider_response: Some("{\"ok\":true}".into()),
        ..Default::default()
    }
}

pub(crate) const EVENT: NewEvent<'static> = NewEvent {
    actor: "bench",
    action: "perform",
    outcome: "applied",
    provider_status: Some(200),
    detail: None,
};

/// Runs `tasks` workers over `n` items, each worker calling `f(batch_start, batch_len)`.
pub(crate) async fn spread<F, Fut>(n: usize, tasks: usize, batch: usize, f: F) -> f64
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut hs = Vec::new();
    for _ in 0..tasks {
        let (next, f) = (next.clone(), f.clone());
        hs.push(tokio::spawn(async move {
            loop {
                let s = next.fetch_add(batch, Ordering::Relaxed);
                if s >= n {
                    return;
                }
                f(s, batch.min(n - s)).await;
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

pub(crate) async fn db_only(
    pg: &Pg,
    n: usize,
    pool: u32,
    batch: usize,
    callers: usize,
) -> Vec<(String, f64, f64, f64)> {
    let mut rows = Vec::new();
    for variant in ["raw", "claimd", "claimd-coalesced", "claimd-batched"] {
        let name = format!("claimd_bench_db_{}_{variant}", std::process::id()).replace('-', "_");
        let url = pg.create(&name).await;
        let store = PgStore::connect(&url, pool).await.unwrap();
        store.migrate().await.unwrap();
        let (store, tasks) = match variant {
            "raw" | "claimd" => (store.unbatched(), pool as usize),
            "claimd-coalesced" => (store, callers),
            _ => (store.unbatched(), pool as usize),
        };
        let x0 = pg.xacts(&name).await;
        let load = load1();
        let rate = match variant {
            "raw" => {
                let p = store.pool().clone();
                spread(n, pool as usize, 1, move |i, _| {
                    let p = p.clone();
                    async move {
                        let c = new_claim(i);
                        let id: i64 = sqlx::query_scalar(SINGLE_ROW_INSERT)
                            .bind(&c.message_id)
                            .bind(&c.fingerprint)
                            .bind(&c.payload[..])
                            .fetch_one(&p)
                            .await
                            .unwrap();
                        sqlx::query(RAW_SETTLE).bind(id).execute(&p).await.unwrap();
                    }
                })
                .await
            }
            "claimd" | "claimd-coalesced" => {
                let s = store.clone();
                spread(n, tasks, 1, move |i, _| {
                    let s = s.clone();
                    async move {
                        let ClaimOutcome::Created(c) = s.claim(&new_claim(i)).await.unwrap() else {
                            panic!("new claim expected")
                        };
                        assert!(s.settle(c.id, c.attempt, &applied(), &EVENT).await.unwrap());
                    }
                })
                .await
            }
            _ => {
                let s = store.clone();
                spread(n, tasks, batch, move |start, len| {
                    let s = s.clone();
                    async move {
                        let news: Vec<NewClaim> = (start..start + len).map(new_claim).collect();
                        let out = s.claim_many(&news).await.unwrap();
                        let items: Vec<SettleItem<'_>> = out
                            .iter()
                            .map(|o| match o {
                                ClaimOutcome::Created(c) => SettleItem {
                                    id: c.id,
                                    attempt: c.attempt,
                                    settlement: applied(),
                                    event: EVENT,
                                },
                                _ => panic!("new claim expected"),
                            })
                            .collect();
                        let done = s.settle_many(&items).await.unwrap();
                        assert!(done.iter().all(|d| *d));
                    }
                })
                .await
            }
        };
        let completed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM claims WHERE state = 'completed'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(completed as usize, n, "{variant}: every claim settled");
        store.pool().close().await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let x1 = pg.xacts(&name).await;
        // Minus migration-free bookkeeping: the count above and the first xacts read.
        let per = (x1 - x0 - 1) as f64 / n as f64;
        pg.drop_db(&name).await;
        rows.push((variant.to_string(), rate, per, load));
    }
    rows
}
