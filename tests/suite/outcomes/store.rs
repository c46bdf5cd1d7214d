//! The outbox in the store, on PostgreSQL and SQLite: an event exactly when a settle that
//! ends or pauses a claim commits (alone, batched, from another state, an operator's move),
//! none for a hand-off, a lost fence or a write that rolled back; a claim's events in order;
//! two relays never take the same event.

use crate::common::{TestStore, orphan_claim};
use claimd::domain::claim::{Claim, ClaimState};
use claimd::engine::settle::{completed, park};
use claimd::store::outbox::OutcomeEvent;
use claimd::store::{self, ClaimOutcome, NewEvent, SettleItem, Settlement, Store};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

fn event(action: &str) -> NewEvent<'_> {
    NewEvent {
        actor: "test",
        action,
        outcome: action,
        provider_status: None,
        detail: None,
    }
}

async fn open(ts: &TestStore) -> Store {
    let s = store::open(&ts.url(), 4).await.unwrap();
    s.migrate().await.unwrap();
    // Two destinations: each settle writes a row for each, sent and retried apart.
    s.set_outcome_destinations(vec![
        ("pay".into(), HOOKS.into()),
        ("pay".into(), BUS.into()),
    ]);
    s
}

async fn claim(s: &Store, consumer: &str, id: &str) -> Claim {
    match s.claim(&orphan_claim(consumer, "", id, id)).await.unwrap() {
        ClaimOutcome::Created(c) => c,
        other => panic!("{other:?}"),
    }
}

/// The destinations of `pay` in these tests.
const HOOKS: &str = "hooks";
const BUS: &str = "bus";

/// What `owner`'s relay of the `hooks` destination would send now: nothing unless it holds
/// that relay.
async fn take(s: &Store, consumer: &str, limit: u32, owner: &str) -> Vec<OutcomeEvent> {
    take_for(s, consumer, HOOKS, limit, owner).await
}

/// The same for `destination`.
async fn take_for(
    s: &Store,
    consumer: &str,
    destination: &str,
    limit: u32,
    owner: &str,
) -> Vec<OutcomeEvent> {
    if !s
        .hold_outcome_relay(consumer, destination, owner, LEASE)
        .await
        .unwrap()
    {
        return Vec::new();
    }
    s.due_outcomes(consumer, destination, limit).await.unwrap()
}

async fn unsent(s: &Store, owner: &str) -> Vec<(String, String)> {
    take(s, "pay", 100, owner)
        .await
        .into_iter()
        .map(|e| (e.message_id, e.state))
        .collect()
}

async fn each_settle_that_ends_or_pauses_writes_one_event(ts: TestStore) {
    let s = open(&ts).await;
    let a = claim(&s, "pay", "a").await;
    let b = claim(&s, "pay", "b").await;
    let c = claim(&s, "pay", "c").await;
    let d = claim(&s, "pay", "d").await;
    let other = claim(&s, "other", "x").await;
    // A hand-off (still started) writes none; a settle that completes writes one.
    let handoff = Settlement {
        lease_for: Some(Duration::ZERO),
        ..Default::default()
    };
    assert!(
        s.settle(a.id, 1, &handoff, &event("handoff"))
            .await
            .unwrap()
    );
    assert!(
        s.settle(
            a.id,
            1,
            &completed(200, "{\"id\":\"pi_1\"}".into(), false),
            &event("perform")
        )
        .await
        .unwrap()
    );
    // A lost fence (another attempt holds the claim) writes nothing.
    assert!(
        !s.settle(
            b.id,
            7,
            &completed(200, "{}".into(), false),
            &event("perform")
        )
        .await
        .unwrap()
    );
    // Batched settles: each its own event.
    let items = vec![
        SettleItem {
            id: b.id,
            attempt: 1,
            settlement: park("unknown outcome".into(), None),
            event: event("perform"),
        },
        SettleItem {
            id: c.id,
            attempt: 1,
            settlement: completed(201, "{}".into(), false),
            event: event("perform"),
        },
        SettleItem {
            id: other.id,
            attempt: 1,
            settlement: completed(200, "{}".into(), false),
            event: event("perform"),
        },
    ];
    assert_eq!(s.settle_many(&items).await.unwrap(), vec![true, true, true]);
    // Pending, then completed from pending (a poll): two events; a poll that leaves it
    // pending writes none.
    let pending = Settlement {
        state: Some(ClaimState::Pending),
        lease_for: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    assert!(
        s.settle(d.id, 1, &pending, &event("perform"))
            .await
            .unwrap()
    );
    assert!(
        s.settle_from(d.id, 1, 2, ClaimState::Pending, &pending, &event("poll"))
            .await
            .unwrap()
    );
    assert!(
        s.settle_from(
            d.id,
            1,
            3,
            ClaimState::Pending,
            &completed(200, "{}".into(), false),
            &event("poll")
        )
        .await
        .unwrap()
    );
    // An operator resolves b: one more event, with the operator as actor.
    let resolved = s
        .resolve(
            "pay",
            "",
            "b",
            ClaimState::Completed,
            "alice",
            "checked at the provider",
            None,
        )
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resolved.state, ClaimState::Completed);

    let events = take(&s, "pay", 100, "relay-1").await;
    let mut seen: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.message_id.as_str(), e.state.as_str()))
        .collect();
    // One batch's rows may be numbered in any order among themselves.
    seen.sort();
    // b's resolve waits behind its earlier event, d's completion behind its pending one.
    assert_eq!(
        seen,
        [
            ("a", "completed"),
            ("b", "needs_attention"),
            ("c", "completed"),
            ("d", "pending")
        ]
    );
    let a_event = events.iter().find(|e| e.message_id == "a").unwrap();
    assert_eq!(a_event.provider_status, Some(200));
    assert_eq!(
        a_event.provider_response.as_deref(),
        Some("{\"id\":\"pi_1\"}")
    );
    assert_eq!(a_event.action, "perform");
    let b_event = events.iter().find(|e| e.message_id == "b").unwrap();
    assert_eq!(b_event.reason.as_deref(), Some("unknown outcome"));
    // None for the consumer without a destination.
    assert!(take(&s, "other", 100, "relay-1").await.is_empty());
    // The consumer's relay is relay-1's: another relay takes nothing now.
    assert!(unsent(&s, "relay-2").await.is_empty());
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(s.mark_outcomes_sent(&seqs).await.unwrap(), 4);
    let next = take(&s, "pay", 100, "relay-1").await;
    let seen: Vec<(&str, &str, &str)> = next
        .iter()
        .map(|e| (e.message_id.as_str(), e.state.as_str(), e.actor.as_str()))
        .collect();
    // In the order they committed: d's poll completed it before the operator resolved b.
    assert_eq!(
        seen,
        [("d", "completed", "test"), ("b", "completed", "alice")]
    );
    let (d_done, b_resolved) = (&next[0], &next[1]);
    assert_eq!(b_resolved.action, "resolve");
    assert_eq!(
        b_resolved.reason.as_deref(),
        Some("checked at the provider")
    );
    // A failed send comes back after its backoff, not before.
    s.retry_outcomes(
        &[b_resolved.seq],
        Duration::from_millis(300),
        "endpoint answered 503",
    )
    .await
    .unwrap();
    s.mark_outcomes_sent(&[d_done.seq]).await.unwrap();
    assert!(unsent(&s, "relay-1").await.is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = take(&s, "pay", 100, "relay-1").await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].seq, again[0].tries), (b_resolved.seq, 1));
    let backlog = s.outbox_backlog().await.unwrap();
    let hooks = backlog.iter().find(|b| b.destination == HOOKS).unwrap();
    assert_eq!(hooks.unsent, 1);
    // The other destination's rows were neither sent nor held back by any of that: every
    // event waits there, each claim's first one due now, with the same event ids.
    let bus = backlog.iter().find(|b| b.destination == BUS).unwrap();
    assert_eq!(bus.unsent, 6, "a, b twice, c, d twice");
    let bus_first = take_for(&s, "pay", BUS, 100, "relay-1").await;
    let mut ids: Vec<String> = bus_first
        .iter()
        .map(claimd::edge::outcome_relay::event::event_id)
        .collect();
    ids.sort();
    let mut hook_ids: Vec<String> = events
        .iter()
        .map(claimd::edge::outcome_relay::event::event_id)
        .collect();
    hook_ids.sort();
    assert_eq!(ids, hook_ids, "one change, one id at every destination");
    assert!(
        bus_first
            .iter()
            .all(|e| e.tries == 0 && e.destination == BUS)
    );
    // A redrive is an event too (state started, the operator as actor).
    s.mark_outcomes_sent(&[again[0].seq]).await.unwrap();
    let e = claim(&s, "pay", "e").await;
    s.settle(
        e.id,
        1,
        &claimd::engine::settle::failed(400, "no".into()),
        &event("perform"),
    )
    .await
    .unwrap();
    s.redrive("pay", "", "e", "bob", None)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Let go (a shutdown): another relay takes the consumer over at once.
    s.release_outcome_relay("pay", HOOKS, "relay-1")
        .await
        .unwrap();
    let e_events = unsent(&s, "relay-4").await;
    assert_eq!(e_events, [("e".to_string(), "failed".to_string())]);
}

#[tokio::test]
async fn each_settle_that_ends_or_pauses_writes_one_event_sqlite() {
    each_settle_that_ends_or_pauses_writes_one_event(TestStore::sqlite()).await;
}

#[tokio::test]
async fn each_settle_that_ends_or_pauses_writes_one_event_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    each_settle_that_ends_or_pauses_writes_one_event(ts).await;
}

/// With events off (no consumer gets outcome events), settles go through the plain statements,
/// without the outbox's part: alone, batched and from `pending`, each still fenced on its
/// attempt and written with its history line, and no outcome event row is written.
async fn a_settle_without_events_writes_no_outbox_row(ts: TestStore) {
    // One by one, so the single settle takes the one-row statement.
    let s = store::open_with(&ts.url(), 4, false).await.unwrap();
    s.migrate().await.unwrap();
    assert!(s.outcome_consumers().is_empty());
    let a = claim(&s, "pay", "a").await;
    let b = claim(&s, "pay", "b").await;
    let c = claim(&s, "pay", "c").await;
    let d = claim(&s, "pay", "d").await;
    let done = || completed(200, "{}".into(), false);
    // The fence holds: a settle at another attempt changes nothing.
    assert!(!s.settle(a.id, 2, &done(), &event("perform")).await.unwrap());
    assert!(s.settle(a.id, 1, &done(), &event("perform")).await.unwrap());
    let items = vec![
        SettleItem {
            id: b.id,
            attempt: 1,
            settlement: park("unknown outcome".into(), None),
            event: event("perform"),
        },
        SettleItem {
            id: c.id,
            attempt: 1,
            settlement: done(),
            event: event("perform"),
        },
        SettleItem {
            id: d.id,
            attempt: 3,
            settlement: done(),
            event: event("perform"),
        },
    ];
    assert_eq!(
        s.settle_many(&items).await.unwrap(),
        vec![true, true, false],
        "the batch keeps each row's fence"
    );
    let pending = Settlement {
        state: Some(ClaimState::Pending),
        lease_for: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    assert!(
        s.settle(d.id, 1, &pending, &event("perform"))
            .await
            .unwrap()
    );
    let d_now = s.get("pay", "", "d").await.unwrap().unwrap();
    assert!(
        !s.settle_from(
            d.id,
            1,
            d_now.version - 1,
            ClaimState::Pending,
            &done(),
            &event("poll")
        )
        .await
        .unwrap(),
        "a stale version is fenced out"
    );
    assert!(
        s.settle_from(
            d.id,
            1,
            d_now.version,
            ClaimState::Pending,
            &done(),
            &event("poll")
        )
        .await
        .unwrap()
    );
    for (id, state, lines) in [
        ("a", ClaimState::Completed, 1),
        ("b", ClaimState::NeedsAttention, 1),
        ("c", ClaimState::Completed, 1),
        ("d", ClaimState::Completed, 2),
    ] {
        let now = s.get("pay", "", id).await.unwrap().unwrap();
        assert_eq!(now.state, state, "claim {id}");
        assert_eq!(
            s.events(now.id).await.unwrap().len(),
            lines,
            "claim {id}: one history line per settle that changed it"
        );
    }
    assert!(
        super::event_rows(&ts.url()).await.is_empty(),
        "an outcome event written with events off"
    );
}

#[tokio::test]
async fn a_settle_without_events_writes_no_outbox_row_sqlite() {
    a_settle_without_events_writes_no_outbox_row(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_settle_without_events_writes_no_outbox_row_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    a_settle_without_events_writes_no_outbox_row(ts).await;
}

/// A settle whose transaction fails after the claim's update (its history line is refused)
/// rolls back whole: the claim stays started and no event exists.
async fn no_event_for_a_settle_that_did_not_commit(ts: TestStore, refuse: &str) {
    let s = open(&ts).await;
    let a = claim(&s, "pay", "a").await;
    let url = ts.url();
    if url.starts_with("sqlite") {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(refuse.to_string()))
            .execute(&pool)
            .await
            .unwrap();
    } else {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(refuse.to_string()))
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut boom = completed(200, "{}".into(), false);
    boom.error = Some("boom".into());
    let ev = NewEvent {
        detail: Some("boom"),
        ..event("perform")
    };
    assert!(
        s.settle(a.id, 1, &boom, &ev).await.is_err(),
        "the write must fail"
    );
    let now = s.get("pay", "", "a").await.unwrap().unwrap();
    assert_eq!(now.state, ClaimState::Started);
    assert!(
        super::event_rows(&url).await.is_empty(),
        "an event for a settle that rolled back"
    );
    // The same settle without the refused line commits with its event.
    assert!(
        s.settle(
            a.id,
            1,
            &completed(200, "{}".into(), false),
            &event("perform")
        )
        .await
        .unwrap()
    );
    assert_eq!(
        super::event_rows(&url).await.len(),
        2,
        "one row per destination"
    );
}

#[tokio::test]
async fn no_event_for_a_settle_that_did_not_commit_sqlite() {
    no_event_for_a_settle_that_did_not_commit(
        TestStore::sqlite(),
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON claim_events WHEN NEW.detail = 'boom' \
         BEGIN SELECT RAISE(ABORT, 'boom refused'); END",
    )
    .await;
}

#[tokio::test]
async fn no_event_for_a_settle_that_did_not_commit_postgres() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    no_event_for_a_settle_that_did_not_commit(
        ts,
        "ALTER TABLE claim_events ADD CONSTRAINT refuse_boom CHECK (detail IS DISTINCT FROM 'boom')",
    )
    .await;
}

/// Two relays asking at once never take the same event: one holds the consumer's relay, the
/// other takes nothing until the holder lets go or its lease runs out.
#[tokio::test]
async fn two_relays_never_take_the_same_event() {
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    let s = open(&ts).await;
    let mut items = Vec::new();
    for i in 0..200 {
        let c = claim(&s, "pay", &format!("m{i}")).await;
        items.push(c.id);
    }
    let batch: Vec<SettleItem<'_>> = items
        .iter()
        .map(|&id| SettleItem {
            id,
            attempt: 1,
            settlement: completed(200, "{}".into(), false),
            event: event("perform"),
        })
        .collect();
    s.settle_many(&batch).await.unwrap();
    let mut taken = std::collections::HashSet::new();
    let mut holders = std::collections::HashSet::new();
    let mut shut_down: Option<&str> = None;
    for round in 0.. {
        let ask = |owner: &'static str| {
            let s = &s;
            async move {
                match shut_down == Some(owner) {
                    true => Vec::new(),
                    false => take(s, "pay", 30, owner).await,
                }
            }
        };
        let (x, y) = tokio::join!(ask("relay-x"), ask("relay-y"));
        if x.is_empty() && y.is_empty() {
            break;
        }
        assert!(
            x.is_empty() || y.is_empty(),
            "both relays took events in one round"
        );
        let holder = if x.is_empty() { "relay-y" } else { "relay-x" };
        holders.insert(holder);
        for e in x.iter().chain(&y) {
            assert!(taken.insert(e.seq), "event {} taken twice", e.seq);
        }
        let seqs: Vec<i64> = x.iter().chain(&y).map(|e| e.seq).collect();
        s.mark_outcomes_sent(&seqs).await.unwrap();
        // Half-way, the holder shuts down (lets go): the other relay carries on at once.
        if round == 3 {
            s.release_outcome_relay("pay", HOOKS, holder).await.unwrap();
            shut_down = Some(holder);
        }
    }
    assert_eq!(taken.len(), 200);
    assert_eq!(
        holders.len(),
        2,
        "the other relay took over after the release"
    );
}
