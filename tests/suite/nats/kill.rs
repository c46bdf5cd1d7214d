//! A `claimd` process SIGKILLed while it holds messages, some mid-call: the server redelivers
//! what was not acknowledged to the next worker, the sweeper finishes the claims left
//! `started`, and every key is applied exactly once (0 lost, 0 doubled).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_worker_loses_and_doubles_nothing() {
    const N: usize = 200;
    let Some(s) = TestStream::new("kill").await else {
        return;
    };
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A slow provider: the worker dies with calls in flight and messages in hand.
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(150),
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        &s.consumer_toml(
            "payments",
            "concurrency = 8\nprefetch = 32",
            &http_effect(&provider),
        ),
    );
    let first = ready_worker(&toml, dir.path(), "first").await;
    for i in 0..N {
        s.publish_json(&format!("kill-{i}"), &format!("{{\"n\":{i}}}"))
            .await;
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            sandbox.effects().len() >= 30
        })
        .await,
        "the first worker did not get going"
    );
    first.kill();
    let at_kill = sandbox.effects().len();
    assert!(at_kill < N, "the kill came too late to matter");

    let second = ready_worker(&toml, dir.path(), "second").await;
    let st = claimd::store::open(&store.url(), 2).await.unwrap();
    let done = eventually(Duration::from_secs(90), || {
        let st = st.clone();
        async move { completed(&st, "payments").await == N }
    })
    .await;
    assert!(
        done,
        "completed {} of {N} after the kill ({at_kill} effects before it)",
        completed(&st, "payments").await
    );
    applied_once_each(&sandbox, N);
    assert!(
        eventually(Duration::from_secs(15), || async {
            s.unacknowledged("claimd-payments").await == 0
        })
        .await,
        "messages left unacknowledged"
    );
    assert!(s.dead_letters().await.is_empty(), "nothing is bad input");
    assert_eq!(claims_in(&st, "payments", None).await.len(), N);
    drop(second);
    s.delete().await;
}
