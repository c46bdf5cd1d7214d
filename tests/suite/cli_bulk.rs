//! The bulk forms of `claimd claims resolve|redrive` (issue 15), on SQLite and PostgreSQL,
//! through the built binary: without `--yes` they list what they would do and change nothing;
//! with `--yes` they change exactly the parked claims of that consumer and reason, each
//! recorded as `operator:<name>`; a claim that moved since it was listed is skipped, not
//! changed; more than 200 matching claims are capped and said so.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::ops::operator_action::{Action, Outcome, Target, act, select_parked};
use claimd::store::Store;
use common::*;

/// Runs `claimd --config CONFIG ARGS...` as operator `tester`: (exit code, stdout, stderr).
fn claimd(config: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let config = config.to_string_lossy();
    let mut all = vec!["--config", &config];
    all.extend_from_slice(args);
    cli_with_env(&all, &[("CLAIMD_OPERATOR", "tester")])
}

/// A migrated store with a `payments` consumer, and its configuration file.
async fn setup(store: &TestStore) -> (tempfile::TempDir, std::path::PathBuf, Store) {
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    (dir, cfg, app.store.clone())
}

/// Whether a table row of `out` names claim `id` (a word of its own, not part of a path).
fn lists(out: &str, id: &str) -> bool {
    out.lines().any(|l| l.split_whitespace().any(|w| w == id))
}

async fn state(s: &Store, consumer: &str, id: &str) -> (ClaimState, i32) {
    let c = s.get(consumer, "", id).await.unwrap().unwrap();
    (c.state, c.attempt)
}

async fn bulk_acts_on_exactly_what_it_lists(store: TestStore) {
    let (_dir, cfg, s) = setup(&store).await;
    for id in ["p1", "p2", "p3"] {
        parked_claim(&s, "payments", id, "attempts exhausted: 503 from provider").await;
    }
    parked_claim(&s, "payments", "p4", "unknown outcome after timeout").await;
    parked_claim(&s, "refunds", "r1", "attempts exhausted: 503 from provider").await;
    let before = s
        .events(s.get("payments", "", "p1").await.unwrap().unwrap().id)
        .await
        .unwrap();

    let resolve = [
        "claims",
        "resolve",
        "--consumer",
        "payments",
        "--reason-prefix",
        "attempts exhausted",
        "--as",
        "failed",
        "--note",
        "provider shows no charge",
    ];
    let (code, out, err) = claimd(&cfg, &resolve);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("would resolve as failed 3 parked claims of payments"),
        "{out}"
    );
    assert!(out.contains("operator:tester"), "{out}");
    for id in ["p1", "p2", "p3"] {
        assert!(lists(&out, id), "{id} listed: {out}");
    }
    assert!(!lists(&out, "p4") && !lists(&out, "r1"), "{out}");
    assert!(out.contains("nothing changed"), "{out}");
    assert!(
        out.contains(
            "--reason-prefix 'attempts exhausted' --as failed --note 'provider shows no charge'"
        ) && out.contains(" --yes"),
        "the apply command is shown: {out}"
    );
    // The preview changed nothing.
    for (consumer, id) in [
        ("payments", "p1"),
        ("payments", "p2"),
        ("payments", "p3"),
        ("payments", "p4"),
        ("refunds", "r1"),
    ] {
        assert_eq!(
            state(&s, consumer, id).await,
            (ClaimState::NeedsAttention, 1),
            "{id}"
        );
    }
    let id1 = s.get("payments", "", "p1").await.unwrap().unwrap().id;
    assert_eq!(s.events(id1).await.unwrap().len(), before.len());

    // Someone redrives p2 between the preview and --yes.
    s.redrive("payments", "", "p2", "operator:someone-else", None)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let mut apply = resolve.to_vec();
    apply.push("--yes");
    let (code, out, err) = claimd(&cfg, &apply);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 done"), "{out}");
    assert!(
        !lists(&out, "p2"),
        "p2 is no longer parked with that reason: {out}"
    );
    for id in ["p1", "p3"] {
        assert_eq!(
            state(&s, "payments", id).await,
            (ClaimState::Failed, 1),
            "{id}"
        );
        let c = s.get("payments", "", id).await.unwrap().unwrap();
        let last = s.events(c.id).await.unwrap().pop().unwrap();
        assert_eq!(last.actor, "operator:tester", "{id}");
        assert_eq!(
            last.detail.as_deref(),
            Some("provider shows no charge"),
            "{id}"
        );
    }
    // p2 stays where the other operator put it; p4 and r1 were never selected.
    assert_eq!(state(&s, "payments", "p2").await, (ClaimState::Started, 2));
    assert_eq!(
        state(&s, "payments", "p4").await,
        (ClaimState::NeedsAttention, 1)
    );
    assert_eq!(
        state(&s, "refunds", "r1").await,
        (ClaimState::NeedsAttention, 1)
    );

    // A bulk redrive of what is left (any reason), then nothing to do.
    let (code, out, err) = claimd(
        &cfg,
        &["claims", "redrive", "--consumer", "payments", "--yes"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 done") && lists(&out, "p4"), "{out}");
    assert_eq!(state(&s, "payments", "p4").await, (ClaimState::Started, 2));
    let (code, out, _) = claimd(&cfg, &["claims", "redrive", "--consumer", "payments"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to do"), "{out}");

    // What --yes runs: the claims listed, then one guarded transition each, only from the
    // state they were listed in (parked). A claim that moved in between, even to a state an
    // operator may act on (failed), is skipped and stays as it was moved.
    parked_claim(&s, "payments", "t1", "timeout").await;
    parked_claim(&s, "payments", "t2", "timeout").await;
    parked_claim(&s, "payments", "t3", "timeout").await;
    parked_claim(&s, "payments", "t4", "timeout").await;
    let listed = select_parked(s.as_ref(), "payments", "timeout")
        .await
        .unwrap();
    assert_eq!(listed.claims.len(), 4);
    assert!(!listed.more);
    for (id, to, note) in [
        ("t2", ClaimState::Completed, "found it"),
        ("t3", ClaimState::Failed, "refunded by hand"),
    ] {
        s.resolve("payments", "", id, to, "operator:other", note, None)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    // t4: redriven by someone else, and its new attempt parked again (parked, as listed, but
    // not the attempt that was listed: what its lookup said may no longer hold).
    let t4 = s
        .redrive("payments", "", "t4", "operator:other", None)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let parked_again = claimd::store::Settlement {
        state: Some(ClaimState::NeedsAttention),
        error: Some("timeout again".into()),
        ..Default::default()
    };
    let event = claimd::store::NewEvent {
        actor: "test",
        action: "park",
        outcome: "unknown",
        provider_status: None,
        detail: None,
    };
    assert!(
        s.settle(t4.id, t4.attempt, &parked_again, &event)
            .await
            .unwrap()
    );
    let mut results = Vec::new();
    for c in &listed.claims {
        let o = act(
            s.as_ref(),
            Action::Redrive,
            &Target::of(c),
            "operator:tester",
            "",
        )
        .await;
        results.push((c.message_id.clone(), o));
    }
    for (id, o) in &results {
        match (id.as_str(), o) {
            ("t1", Outcome::Done(c)) => assert_eq!(c.state, ClaimState::Started),
            ("t2", Outcome::Skipped(ClaimState::Completed)) => {}
            ("t3", Outcome::Skipped(ClaimState::Failed)) => {}
            ("t4", Outcome::Changed { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        state(&s, "payments", "t2").await,
        (ClaimState::Completed, 1)
    );
    assert_eq!(state(&s, "payments", "t3").await, (ClaimState::Failed, 1));
    assert_eq!(
        state(&s, "payments", "t4").await,
        (ClaimState::NeedsAttention, 2)
    );
    let t3 = s.get("payments", "", "t3").await.unwrap().unwrap();
    let history = s.events(t3.id).await.unwrap();
    assert!(
        history.iter().all(|e| e.actor != "operator:tester"),
        "the bulk redrive left no line on t3: {history:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_forms_preview_then_act_on_exactly_the_listed_claims_sqlite() {
    bulk_acts_on_exactly_what_it_lists(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_forms_preview_then_act_on_exactly_the_listed_claims_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    bulk_acts_on_exactly_what_it_lists(store).await;
}

/// 201 parked claims: the preview says more match than one action takes, and `--yes` acts on
/// 200 of them, leaving one for the next run. Also: a reason with LIKE's wildcards in it is
/// matched as text.
async fn bulk_is_capped(store: TestStore) {
    let (_dir, cfg, s) = setup(&store).await;
    for i in 0..201 {
        parked_claim(&s, "payments", &format!("m{i:03}"), "50% off_ by one").await;
    }
    parked_claim(&s, "payments", "other", "50x off by one").await;
    let args = [
        "claims",
        "redrive",
        "--consumer",
        "payments",
        "--reason-prefix",
        "50% off_",
    ];
    let (code, out, err) = claimd(&cfg, &args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would redrive 200 parked claims"), "{out}");
    assert!(out.contains("over 200 claims match"), "{out}");
    assert!(!lists(&out, "other"), "{out}");
    let mut apply = args.to_vec();
    apply.push("--yes");
    let (code, out, err) = claimd(&cfg, &apply);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("200 done"), "{out}");
    let left = select_parked(s.as_ref(), "payments", "50% off_")
        .await
        .unwrap();
    assert_eq!(left.claims.len(), 1);
    assert_eq!(
        state(&s, "payments", "other").await,
        (ClaimState::NeedsAttention, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_forms_are_capped_at_200_sqlite() {
    bulk_is_capped(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_forms_are_capped_at_200_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    bulk_is_capped(store).await;
}

/// The single and bulk forms cannot be mixed, and `--yes` belongs to the bulk form.
#[test]
fn the_two_forms_are_exclusive() {
    let (code, _, err) = cli(&[
        "claims",
        "redrive",
        "payments",
        "m1",
        "--consumer",
        "payments",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, _, err) = cli(&["claims", "redrive", "payments", "m1", "--yes"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = cli(&["claims", "resolve", "--as", "failed", "--note", "x"]);
    assert_eq!(code, 2, "{err}");
}
