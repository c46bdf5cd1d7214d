//! A primary failover without a restart (issue 54, items 1 and 2): four workers on a
//! multi-host store URL (`host1,host2` with `target_session_attrs=read-write`) under HTTP
//! load, and producers enqueueing in their own transactions; the primary is SIGKILLed and,
//! 4 s later, the standby promoted. Checked as an operator would: intake answers only
//! `202`/`200`/`503` throughout, every worker takes messages again within 10 s of the
//! promotion without a restart, `/readyz` says why while no server takes writes, nothing is
//! charged twice, every claim finishes without a person. With a synchronous standby nothing
//! acknowledged or committed is lost. With an asynchronous one the warning is given, and every
//! effect the provider performed after the kill has its claim in the store (written back by the
//! instance that held it); what is gone was settled before the kill (the runbook's part).

use crate::common;

use common::pg_pair::{PgPair, Standby};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the load saw: each answer with its time, and `/readyz`'s complaints.
#[derive(Default)]
struct Seen {
    answers: Vec<(String, u16, Instant, usize)>,
    unready: Vec<String>,
}

/// Posts messages to the workers in turn from `clients` tasks until `stop`; each message is
/// posted once (a `503` is counted, not retried: the test checks what was acknowledged).
async fn load(bases: Vec<String>, clients: usize, stop: Arc<tokio::sync::Notify>) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (bases, seen, next, done) = (bases.clone(), seen.clone(), next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let c = client();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let worker = n % bases.len();
                let id = format!("m{n}");
                let r = c
                    .post(format!("{}/v1/messages/payments", bases[worker]))
                    .header("Idempotency-Key", &id)
                    .json(&serde_json::json!({"amount": n}))
                    .send()
                    .await;
                let status = r.map(|r| r.status().as_u16()).unwrap_or(0);
                seen.lock()
                    .unwrap()
                    .answers
                    .push((id, status, Instant::now(), worker));
                if status != 202 && status != 200 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    // Readiness, as a load balancer would ask it.
    {
        let (bases, seen, done) = (bases.clone(), seen.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let c = client();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for base in &bases {
                    if let Ok(r) = c.get(format!("{base}/readyz")).send().await
                        && r.status() == 503
                    {
                        let body = r.text().await.unwrap_or_default();
                        seen.lock().unwrap().unready.push(body);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    stop.notified().await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap()
}

/// The message ids of the claims in the database at `url`.
async fn stored_ids(url: &str) -> BTreeSet<String> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar::<_, String>("SELECT message_id FROM claims")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Producers enqueueing in their own transactions until `done`, each on whichever server takes
/// writes (as a multi-host libpq client would); returns the ids whose commit succeeded.
async fn produce(
    urls: [String; 2],
    producers: usize,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> BTreeSet<String> {
    let committed = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for p in 0..producers {
        let (urls, committed, done) = (urls.clone(), committed.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            use sqlx::Connection;
            let mut n = 0u64;
            let mut conn: Option<sqlx::PgConnection> = None;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if conn.is_none() {
                    for url in &urls {
                        if let Ok(mut c) = sqlx::PgConnection::connect(url).await
                            && sqlx::query_scalar::<_, bool>("SELECT NOT pg_is_in_recovery()")
                                .fetch_one(&mut c)
                                .await
                                .unwrap_or(false)
                        {
                            conn = Some(c);
                            break;
                        }
                    }
                    if conn.is_none() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
                let c = conn.as_mut().unwrap();
                n += 1;
                let id = format!("e{p}-{n}");
                let sent =
                    sqlx::query("SELECT * FROM claimd.enqueue('payments', $1, '{\"amount\": 1}')")
                        .bind(&id)
                        .execute(&mut *c)
                        .await;
                match sent {
                    Ok(_) => {
                        committed.lock().unwrap().insert(id);
                    }
                    Err(_) => {
                        conn = None;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(committed)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap()
}

/// What one failover showed.
struct Outcome {
    acknowledged: BTreeSet<String>,
    stored: BTreeSet<String>,
    sb: claimd::provider::sandbox::Sandbox,
    killed_utc: chrono::DateTime<chrono::Utc>,
    mode_before: String,
    restored: u64,
}

/// Four workers and four producers through a failover of `standby`'s pair.
async fn failover(pair: &PgPair) -> Outcome {
    let (sb, provider) = sandbox(Default::default()).await;
    let stream = common::nats::TestStream::new("failover")
        .await
        .expect("NATS JetStream (the suite's server)");
    let notify = stream.consumer_toml(
        "notify",
        "",
        &format!(
            "[consumers.effect]\nkind = \"http\"\nurl = \"{provider}/v1/notify\"\ntimeout = \"1s\"\n\
             status_url = \"{provider}/v1/effects/{{key}}\"\n"
        ),
    );
    let toml = config_toml(
        &pair.multi_host_url(),
        &format!(
            "{}{notify}",
            consumer_toml("payments", &provider, "concurrency = 16")
        ),
    );
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(start(&toml).await);
    }
    // NATS: published throughout; the stream keeps what claimd has not acknowledged.
    let publishing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let published = {
        let publishing = publishing.clone();
        let (js, subject) = (stream.js.clone(), stream.subject.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !publishing.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let h = common::nats::headers(&[
                    ("Nats-Msg-Id", &format!("n{n}")),
                    ("Content-Type", "application/json"),
                ]);
                let ack = js
                    .publish_with_headers(subject.clone(), h, "{\"amount\": 1}".into())
                    .await
                    .unwrap();
                ack.await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        })
    };
    let bases: Vec<String> = workers
        .iter()
        .map(|w| format!("http://{}", w.http_addr))
        .collect();
    let mode_before = get_json(&format!("{}/readyz", bases[0])).await["replication_mode"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let stop = Arc::new(tokio::sync::Notify::new());
    let run = tokio::spawn(load(bases.clone(), 8, stop.clone()));
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers = tokio::spawn(produce(
        [pair.url(), pair.standby_url()],
        4,
        producing.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;

    tokio::task::block_in_place(|| pair.kill_primary());
    // Read once every process of the old primary is gone: nothing commits there afterwards.
    let killed = Instant::now();
    let killed_utc = chrono::Utc::now();
    // A cluster manager takes some seconds to decide; meanwhile no server takes writes.
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| pair.promote_standby());
    let promoted = Instant::now();
    tokio::time::sleep(Duration::from_secs(12)).await;
    stop.notify_one();
    producing.store(true, std::sync::atomic::Ordering::Relaxed);
    publishing.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = run.await.unwrap();
    let enqueued = producers.await.unwrap();
    let published: usize = published.await.unwrap();

    let statuses: BTreeMap<u16, usize> = seen.answers.iter().fold(BTreeMap::new(), |mut m, a| {
        *m.entry(a.1).or_default() += 1;
        m
    });
    let mut acknowledged: BTreeSet<String> = seen
        .answers
        .iter()
        .filter(|a| a.1 == 202 || a.1 == 200)
        .map(|a| a.0.clone())
        .collect();
    let before = seen.answers.iter().filter(|a| a.2 < killed).count();
    // Back to taking messages: each worker's first acknowledgement after the promotion.
    let back: Vec<Option<Duration>> = (0..bases.len())
        .map(|w| {
            seen.answers
                .iter()
                .filter(|a| a.3 == w && a.2 > promoted && (a.1 == 202 || a.1 == 200))
                .map(|a| a.2 - promoted)
                .min()
        })
        .collect();
    eprintln!(
        "failover ({mode_before}): {} posted ({before} before the kill), answers {statuses:?}, \
         {} acknowledged, {} enqueued, {published} published to NATS; back after the \
         promotion in {back:?}; /readyz unready {} times",
        seen.answers.len(),
        acknowledged.len(),
        enqueued.len(),
        seen.unready.len(),
    );
    for status in statuses.keys() {
        assert!(
            matches!(status, 200 | 202 | 503),
            "intake answered {status}: {statuses:?}"
        );
    }
    assert!(before > 50, "the load ran before the kill: {before}");
    assert!(!enqueued.is_empty(), "producers enqueued");
    for (w, t) in back.iter().enumerate() {
        let t = t.unwrap_or_else(|| panic!("worker {w} never took a message after the promotion"));
        assert!(t < Duration::from_secs(10), "worker {w} back after {t:?}");
    }
    let why = seen.unready.iter().find(|b| {
        b.contains("no PostgreSQL server that takes writes (read-write)")
            && b.contains(&format!(
                "127.0.0.1:{} is a standby or read-only",
                pair.standby_port
            ))
    });
    assert!(why.is_some(), "/readyz said why: {:?}", seen.unready);

    // Every claim finishes without a person, and nothing is charged twice.
    let store = claimd::store::open(&pair.standby_url(), 2).await.unwrap();
    let finished = eventually(Duration::from_secs(90), || {
        let store = store.clone();
        async move {
            let c = counts_of(&store, "payments").await;
            c.pending + c.started + c.waiting + c.scheduled == 0
        }
    })
    .await;
    let counts = counts_of(&store, "payments").await;
    assert!(finished, "claims left unfinished: {counts:?}");
    assert_eq!(
        counts.needs_attention, 0,
        "nothing asks a person: {counts:?}"
    );
    // Every NATS message is claimed and finished: what was not acknowledged came back.
    let all_in = eventually(Duration::from_secs(90), || {
        let store = store.clone();
        async move {
            let c = counts_of(&store, "notify").await;
            c.completed as usize >= published && c.pending + c.started == 0
        }
    })
    .await;
    let notify = counts_of(&store, "notify").await;
    assert!(all_in, "{published} published to NATS: {notify:?}");
    assert_eq!(notify.needs_attention, 0, "{notify:?}");
    let twice: Vec<_> = sb.effects().into_iter().filter(|e| e.applied > 1).collect();
    assert!(twice.is_empty(), "charged twice: {twice:?}");
    let mut restored = 0;
    for base in &bases {
        let ready = get_json(&format!("{base}/readyz")).await;
        assert_eq!(ready["ready"], true, "{ready}");
        let metrics = get_text(&format!("{base}/metrics")).await;
        restored += metrics
            .lines()
            .filter(|l| l.starts_with("claimd_claims_vanished_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
    }
    for w in workers {
        w.shutdown(Duration::from_secs(5)).await;
    }
    acknowledged.extend(enqueued);
    Outcome {
        stored: stored_ids(&pair.standby_url()).await,
        acknowledged,
        sb,
        killed_utc,
        mode_before,
        restored,
    }
}

async fn pair_of(standby: Standby) -> Option<PgPair> {
    let pair = tokio::task::spawn_blocking(move || PgPair::start(standby))
        .await
        .unwrap()?;
    let want = if standby == Standby::Synchronous {
        "sync"
    } else {
        "async"
    };
    let attached = eventually(Duration::from_secs(15), || {
        let url = pair.url();
        async move {
            use sqlx::Connection;
            let Ok(mut c) = sqlx::PgConnection::connect(&url).await else {
                return false;
            };
            sqlx::query_scalar::<_, String>("SELECT sync_state FROM pg_stat_replication")
                .fetch_all(&mut c)
                .await
                .is_ok_and(|s| s == [want])
        }
    })
    .await;
    assert!(attached, "the standby never streamed as {want}");
    Some(pair)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_list_follows_the_promoted_synchronous_standby_and_loses_nothing() {
    let Some(pair) = pair_of(Standby::Synchronous).await else {
        return;
    };
    // A URL naming the standby alone: no connection to it is used, and the store says why.
    let wrong = claimd::store::open(&pair.standby_url(), 2).await.unwrap();
    let said = eventually(Duration::from_secs(20), || {
        let wrong = wrong.clone();
        async move {
            wrong.ping().await.is_err_and(|e| {
                e.to_string()
                    .contains("no PostgreSQL server that takes writes (read-write)")
                    && e.to_string().contains("is a standby or read-only")
            })
        }
    })
    .await;
    assert!(said, "{:?}", wrong.ping().await);
    drop(wrong);
    let o = failover(&pair).await;
    assert_eq!(o.mode_before, "synchronous");
    let lost: Vec<&String> = o.acknowledged.difference(&o.stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged claims lost: {lost:?}",
        lost.len()
    );
    assert_eq!(o.restored, 0, "nothing vanished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_an_asynchronous_failover_what_an_instance_held_is_written_back() {
    let Some(pair) = pair_of(Standby::Asynchronous).await else {
        return;
    };
    let o = failover(&pair).await;
    assert_eq!(o.mode_before, "asynchronous", "the warning's mode");
    let lost: Vec<&String> = o.acknowledged.difference(&o.stored).collect();
    // An effect the provider performed with no claim left: settled on the old primary before
    // the kill and not yet on the standby. Anything performed later was held by an instance,
    // which wrote it back.
    let orphans: Vec<_> =
        o.sb.effects()
            .into_iter()
            .filter(|e| {
                !o.stored
                    .contains(e.key.rsplit(':').next().unwrap_or_default())
            })
            .collect();
    eprintln!(
        "asynchronous failover: {} acknowledged claims gone, {} written back, {} effects without \
         a claim (for the runbook)",
        lost.len(),
        o.restored,
        orphans.len()
    );
    for e in &orphans {
        assert!(
            e.first_applied_utc < o.killed_utc,
            "an effect performed after the kill has no claim: {e:?}"
        );
    }
}
