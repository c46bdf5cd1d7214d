//! An operator rebuilding indexes in the combined run: `claimd reindex --all --min-mib 0`, as
//! the owner, every 2–5 s while the ledger is sent, every index of claimd's tables rebuilt
//! concurrently under the workers' writes. The terminated backends cut some rebuilds,
//! leaving invalid copies; after the run one more `claimd reindex` must succeed and leave no
//! invalid index behind.

use super::*;

/// Runs `claimd reindex` every 2–5 s until `done`; returns (indexes rebuilt, rebuilds cut
/// short). Notes each run in the timeline.
pub(super) fn start(
    db_url: String,
    seed: u64,
    done: Arc<std::sync::atomic::AtomicBool>,
    timeline: Arc<Mutex<Vec<Moment>>>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    tokio::spawn(async move {
        let mut r = rng(seed ^ 0x1dea);
        let mut counts = (0, 0);
        while !done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(r.u64(2000..5000))).await;
            let (code, out, err) = run(&db_url).await;
            let (rebuilt, cut) = tally(&out);
            counts = (counts.0 + rebuilt, counts.1 + cut);
            let why = err.lines().next().unwrap_or_default();
            timeline.lock().unwrap().push((
                chrono::Utc::now(),
                format!("claimd reindex (exit {code}): {rebuilt} indexes rebuilt, {cut} cut {why}"),
            ));
        }
        counts
    })
}

/// (indexes rebuilt, rebuilds that failed) in a run's JSON; (0, 1) when it printed none (the
/// command's own connection cut before it listed anything).
fn tally(out: &str) -> (usize, usize) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(out) else {
        return (0, 1);
    };
    let indexes = v["indexes"].as_array().cloned().unwrap_or_default();
    let rebuilt = indexes
        .iter()
        .filter(|i| !i["bytes_after"].is_null())
        .count();
    let cut = indexes.iter().filter(|i| !i["error"].is_null()).count();
    (rebuilt, cut)
}

/// The last run, once the faults are over: it succeeds, and no invalid index is left on
/// claimd's tables (a cut run's copies dropped).
pub(super) async fn finish(db_url: &str, during: (usize, usize)) {
    let (code, out, err) = run(db_url).await;
    assert_eq!(code, 0, "claimd reindex after the run:\n{out}\n{err}");
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db_url).await.unwrap();
    let invalid: Vec<String> = sqlx::query_scalar(
        "SELECT indexrelid::regclass::text FROM pg_index \
         WHERE NOT indisvalid AND indrelid::regclass::text = ANY($1)",
    )
    .bind(claimd::store::index_rebuild::TABLES)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(
        invalid.is_empty(),
        "invalid indexes left: {invalid:?}\n{out}"
    );
    let (rebuilt, _) = tally(&out);
    eprintln!(
        "reindex: {} indexes rebuilt while the workers ran, {} rebuilds cut; {rebuilt} after",
        during.0, during.1
    );
    assert!(during.0 > 0, "no index was rebuilt while the workers ran");
}

async fn run(db_url: &str) -> (i32, String, String) {
    let url = db_url.to_string();
    tokio::task::spawn_blocking(move || {
        crate::common::cli_with_env(
            &["reindex", "--all", "--min-mib", "0", "--format", "json"],
            &[("CLAIMD__STORE__URL", url.as_str())],
        )
    })
    .await
    .unwrap()
}
