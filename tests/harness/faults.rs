//! The chaos loop of a run: SIGKILLs and restarts of random workers spread over the send
//! phase (any the send phase did not reach right after it), with PostgreSQL fast restarts between them, and one broker outage (a third of the
//! way in), one database outage (half way) and one provider outage (two thirds of the way)
//! when the scenario has them. Each thing it does is noted in the run's timeline.

use super::*;

/// The faults of a run (from its [`Scenario`]).
pub(super) struct Faults {
    pub(super) kills: usize,
    pub(super) workers: usize,
    pub(super) db_outage: Option<Duration>,
    pub(super) broker_outage: Option<Duration>,
    pub(super) provider_outage: Option<Duration>,
    pub(super) real_db_restart: bool,
    pub(super) pg_restarts: usize,
    pub(super) seed: u64,
}

/// What the loop shares with the run: when to stop, and what it did.
pub(super) struct Progress {
    pub(super) done: Arc<std::sync::atomic::AtomicBool>,
    pub(super) kills_done: Arc<AtomicUsize>,
    pub(super) restarted: Arc<AtomicUsize>,
    pub(super) timeline: Arc<Mutex<Vec<Moment>>>,
    /// The share of the ledger acknowledged so far (0 to 1): kill `k` waits for `k / kills`
    /// of it, so that the kills (and the outages between them) spread over the whole send
    /// phase however long it runs.
    pub(super) sent: LedgerShare,
}

/// Starts the loop; it hands the fleet back once every kill and every outage has happened.
/// `doors` are the provider's doors a provider outage closes.
pub(super) fn start(
    f: Faults,
    mut fleet: Fleet,
    doors: Vec<Arc<Gate>>,
    proxy: Arc<proxy::Proxy>,
    p: Progress,
) -> tokio::task::JoinHandle<Fleet> {
    let Faults {
        kills,
        workers,
        db_outage: outage,
        broker_outage: broker,
        provider_outage,
        real_db_restart: real,
        pg_restarts,
        seed,
    } = f;
    let Progress {
        done,
        kills_done,
        restarted,
        timeline,
        sent,
    } = p;
    tokio::spawn(async move {
        let note = |what: String| timeline.lock().unwrap().push((chrono::Utc::now(), what));
        let mut r = rng(seed ^ 0x5eed);
        let (mut did_outage, mut did_broker, mut did_provider) = (false, false, false);
        // Every kill happens: those the send phase did not reach land in the drain after it.
        while kills_done.load(Ordering::SeqCst) < kills {
            tokio::time::sleep(Duration::from_millis(r.u64(150..600))).await;
            let due = kills_done.load(Ordering::SeqCst) as f64 / kills as f64;
            while sent() < due && !done.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let i = r.usize(0..workers);
            let at = chrono::Utc::now();
            let killed = fleet.restart(i).await.unwrap_or_default();
            timeline
                .lock()
                .unwrap()
                .push((at, format!("SIGKILL worker {i} ({killed})")));
            note(format!("worker {i} up again"));
            let k = kills_done.fetch_add(1, Ordering::SeqCst) + 1;
            let r_done = restarted.load(Ordering::SeqCst);
            if r_done < pg_restarts && k * (pg_restarts + 1) >= kills * (r_done + 1) {
                note("PostgreSQL fast restart".into());
                postgres_fast_restart().await;
                restarted.fetch_add(1, Ordering::SeqCst);
                note("PostgreSQL up again".into());
            }
            if let Some(d) = broker
                && !did_broker
                && k >= kills / 3
            {
                did_broker = true;
                note("broker down".into());
                broker_outage(d).await;
                note("broker up".into());
            }
            if let Some(d) = outage
                && !did_outage
                && k >= kills / 2
            {
                did_outage = true;
                note("database down".into());
                outage_now(&proxy, real, d).await;
                note("database up".into());
            }
            if let Some(d) = provider_outage
                && !did_provider
                && k >= kills * 2 / 3
            {
                did_provider = true;
                note("provider down".into());
                futures_util::future::join_all(doors.iter().map(|g| g.outage(d))).await;
                note("provider up".into());
            }
        }
        if let Some(d) = broker
            && !did_broker
        {
            broker_outage(d).await;
        }
        if let Some(d) = outage
            && !did_outage
        {
            outage_now(&proxy, real, d).await;
        }
        if let Some(d) = provider_outage
            && !did_provider
        {
            futures_util::future::join_all(doors.iter().map(|g| g.outage(d))).await;
        }
        fleet
    })
}
