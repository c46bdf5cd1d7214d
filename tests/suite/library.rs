//! claimd embedded as a library: the front door (`claimd::Worker`) with an effect of the
//! program's own, through `examples/custom_effect.rs`.

#[path = "../../examples/custom_effect.rs"]
#[allow(dead_code)] // the example's `main`
mod custom_effect;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_worker_writes_each_ledger_entry_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let summary = custom_effect::demo(dir.path(), 20)
        .await
        .expect("the example runs");

    for i in 0..20 {
        let id = format!("order-{i}");
        assert_eq!(summary.states[&id], "completed", "{id}: {summary:?}");
        assert_eq!(summary.entries[&id], 1, "{id} written once: {summary:?}");
    }
    // Twenty orders, each submitted twice in process and order-0 a third time over HTTP: each
    // inserted once; the repeats were recognised as duplicates without calling the effect.
    assert_eq!(summary.inserted, 20, "{summary:?}");
    assert!(summary.duplicates >= 21, "{summary:?}");
    // order-3's answer was lost after the write: the sweeper's lookup found the entry, so no
    // second write reached the ledger.
    assert_eq!(summary.repeated, 0, "{summary:?}");
    // A zero amount is refused by the effect: failed, nothing written.
    assert_eq!(summary.states["order-zero"], "failed", "{summary:?}");
    assert_eq!(summary.entries["order-zero"], 0, "{summary:?}");
}

#[tokio::test]
async fn a_custom_consumer_without_its_effect_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[store]
url = "sqlite://{}"
[http]
listen = "127.0.0.1:0"
[[consumers]]
name = "ledger"
source = "http"
on_unknown = "park"
[consumers.effect]
kind = "custom"
"#,
        dir.path().join("claims.db").display()
    );
    let err = claimd::Worker::from_toml(&config)
        .unwrap()
        .start()
        .await
        .expect_err("no effect given");
    assert!(
        err.to_string().contains("consumer ledger") && err.to_string().contains("custom"),
        "{err}"
    );

    let ledger = custom_effect::LedgerWrite::open(&dir.path().join("ledger.db"))
        .await
        .unwrap();
    let err = claimd::Worker::from_toml(&config)
        .unwrap()
        .effect("ledgers", ledger.clone())
        .start()
        .await
        .expect_err("an effect for a consumer that does not exist");
    assert!(err.to_string().contains("ledgers"), "{err}");

    let worker = claimd::Worker::from_toml(&config)
        .unwrap()
        .effect("ledger", ledger)
        .start()
        .await
        .expect("starts with its effect");
    assert_eq!(worker.shutdown(Duration::from_secs(1)).await, 0);
}
