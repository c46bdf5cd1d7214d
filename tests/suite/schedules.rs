//! Periodic effects (`[[schedules]]`, docs/schedules.md): each slot is a message
//! `schedule:<name>:<slot>`, claimed once across every instance and performed once at the
//! provider; after a downtime the missed slots follow `catch_up`; bad schedules are refused
//! at load naming the schedule and the key; `claimd schedules` lists them with their slots.

use crate::common;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A `[[schedules]]` table for the `payments` consumer.
fn schedule_toml(name: &str, cron: &str, catch_up: &str) -> String {
    format!(
        "\n[[schedules]]\nname = \"{name}\"\ncron = \"{cron}\"\nconsumer = \"payments\"\ncatch_up = \"{catch_up}\"\npayload = '{{\"amount\": 100, \"run\": \"{{{{slot}}}}\"}}'\n"
    )
}

/// A sandbox that applies every `POST` (no idempotency of its own), so a slot sent twice
/// would be counted twice under its key.
async fn counting_sandbox() -> (Sandbox, String) {
    sandbox(SandboxOptions {
        ignore_keys: true,
        ..Default::default()
    })
    .await
}

/// The slots of schedule `name` that have a claim, with the claim's state.
fn slots_of(
    claims: &[claimd::domain::claim::Claim],
    name: &str,
) -> BTreeMap<DateTime<Utc>, ClaimState> {
    let prefix = format!("schedule:{name}:");
    claims
        .iter()
        .filter_map(|c| {
            let slot = c.message_id.strip_prefix(&prefix)?;
            let slot = DateTime::parse_from_rfc3339(slot).ok()?.with_timezone(&Utc);
            Some((slot, c.state))
        })
        .collect()
}

/// How many times the sandbox applied the slot's message (its key is the default template's).
fn applied(sb: &Sandbox, name: &str, slot: DateTime<Utc>) -> u64 {
    let key = format!(
        "payments::{}",
        claimd::domain::periodic::message_id(name, slot)
    );
    sb.effects()
        .iter()
        .find(|e| e.key == key)
        .map_or(0, |e| e.applied)
}

/// The value of `claimd_schedule_slots_total{schedule, outcome}` on a worker's `/metrics`.
async fn slot_metric(base: &str, schedule: &str, outcome: &str) -> u64 {
    let text = get_text(&format!("{base}/metrics")).await;
    let series =
        format!("claimd_schedule_slots_total{{schedule=\"{schedule}\",outcome=\"{outcome}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

/// Waits until every claim of a slot at or before `cutoff` is completed; returns the claims.
async fn settled_through(
    store: &claimd::store::Store,
    cutoff: DateTime<Utc>,
) -> Vec<claimd::domain::claim::Claim> {
    let done = eventually(Duration::from_secs(30), || async {
        claims_in(store, "payments", None)
            .await
            .iter()
            .all(|c| c.state == ClaimState::Completed || slot_after(&c.message_id, cutoff))
    })
    .await;
    assert!(done, "the slots' claims did not complete");
    claims_in(store, "payments", None).await
}

/// Whether the message id's slot is after `cutoff`.
fn slot_after(message_id: &str, cutoff: DateTime<Utc>) -> bool {
    let slot = message_id.splitn(3, ':').nth(2).unwrap_or_default();
    DateTime::parse_from_rfc3339(slot).is_ok_and(|s| s > cutoff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_is_claimed_and_performed_once_across_two_instances() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sb, provider) = counting_sandbox().await;
    let toml = config_toml(
        &store.url(),
        &format!(
            "{}{}",
            consumer_toml("payments", &provider, ""),
            schedule_toml("tick", "* * * * * *", "latest")
        ),
    );
    let a = start(&toml).await;
    let b = start(&toml).await;
    let started = Utc::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cutoff = Utc::now() - ChronoDuration::seconds(1);
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    let claims = settled_through(&s, cutoff).await;
    let slots = slots_of(&claims, "tick");
    let through: Vec<DateTime<Utc>> = slots.keys().copied().filter(|t| *t <= cutoff).collect();
    println!("slots claimed: {through:?}");
    assert!(through.len() >= 4, "a slot a second for 5 s: {through:?}");
    assert!(
        through[0] <= started + ChronoDuration::seconds(2),
        "the first slot after start: {through:?}"
    );
    for pair in through.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            ChronoDuration::seconds(1),
            "no slot missed: {through:?}"
        );
    }
    for slot in &through {
        assert_eq!(applied(&sb, "tick", *slot), 1, "slot {slot} performed once");
    }
    // Both instances tried; together they claimed each slot once.
    a.app().claimer.stop_accepting();
    b.app().claimer.stop_accepting();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let all = slots_of(&claims_in(&s, "payments", None).await, "tick").len() as u64;
    let a_base = format!("http://{}", a.http_addr);
    let b_base = format!("http://{}", b.http_addr);
    let submitted = slot_metric(&a_base, "tick", "submitted").await
        + slot_metric(&b_base, "tick", "submitted").await;
    assert_eq!(
        submitted, all,
        "each claimed slot counted once as submitted"
    );
    assert_eq!(slot_metric(&a_base, "tick", "refused").await, 0);

    // `claimd schedules` lists it with its last and next slot.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, &toml).unwrap();
    let (code, out, err) = cli(&["schedules", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("tick"))
        .unwrap_or_default();
    assert!(
        row.contains("* * * * * *") && row.contains("payments") && row.contains("latest"),
        "{out}"
    );
    assert!(!row.contains("not run yet"), "{out}");
    let (code, json, _) = cli(&[
        "schedules",
        "--config",
        path.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["name"], "tick");
    assert!(
        v[0]["last_slot_utc"].is_string() && v[0]["next_slot_utc"].is_string(),
        "{v}"
    );
    // And the page shows it.
    let page = get_text(&format!("{a_base}/")).await;
    assert!(
        page.contains("<h2>Schedules</h2>") && page.contains("tick"),
        "{page}"
    );
    a.shutdown(Duration::from_secs(2)).await;
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_slots_follow_catch_up_after_a_downtime() {
    // On SQLite: the schedules were last run 30 s ago (as if every instance had been down
    // since), then one instance starts.
    let store = TestStore::sqlite();
    let (sb, provider) = counting_sandbox().await;
    let toml = config_toml(
        &store.url(),
        &format!(
            "{}{}{}{}",
            consumer_toml("payments", &provider, ""),
            schedule_toml("all", "* * * * * *", "all"),
            schedule_toml("latest", "* * * * * *", "latest"),
            schedule_toml("none", "* * * * * *", "none"),
        ),
    );
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    let down_since = {
        let now = s.now().await.unwrap();
        now - ChronoDuration::milliseconds(now.timestamp_subsec_millis() as i64)
            - ChronoDuration::seconds(30)
    };
    for name in ["all", "latest", "none"] {
        s.advance_schedule(name, down_since).await.unwrap();
    }
    let before_start = Utc::now();
    let w = start(&toml).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.app().claimer.stop_accepting();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let base = format!("http://{}", w.http_addr);
    let claims = settled_through(&s, Utc::now()).await;
    let first = |name: &str| *slots_of(&claims, name).keys().next().unwrap();
    let contiguous = |name: &str| {
        let slots: Vec<_> = slots_of(&claims, name).into_keys().collect();
        for pair in slots.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                ChronoDuration::seconds(1),
                "{name}: {slots:?}"
            );
        }
        slots
    };
    let all = contiguous("all");
    let latest = contiguous("latest");
    let none = contiguous("none");
    println!("all: {all:?}\nlatest: {latest:?}\nnone: {none:?}");
    // all: every slot since the last one run.
    assert_eq!(first("all"), down_since + ChronoDuration::seconds(1));
    // none: only the slots due once the instance watched (3 s of grace before its start).
    assert!(
        first("none") >= before_start - ChronoDuration::seconds(4),
        "{none:?}"
    );
    // latest: those and the newest missed one.
    assert_eq!(first("latest"), first("none") - ChronoDuration::seconds(1));
    for (name, slots) in [("all", &all), ("latest", &latest), ("none", &none)] {
        for slot in slots {
            assert_eq!(applied(&sb, name, *slot), 1, "{name} {slot} performed once");
        }
    }
    let missed = (first("none") - down_since).num_seconds() as u64 - 1;
    assert_eq!(slot_metric(&base, "none", "skipped").await, missed);
    assert_eq!(slot_metric(&base, "latest", "skipped").await, missed - 1);
    assert_eq!(slot_metric(&base, "all", "skipped").await, 0);
    w.shutdown(Duration::from_secs(2)).await;
}

#[test]
fn a_bad_schedule_is_refused_naming_it_and_its_key() {
    // A key without {tenant}: its messages carry none.
    let consumer = consumer_toml(
        "payments",
        "http://127.0.0.1:9",
        "key = \"{consumer}:{message_id}\"",
    );
    let good =
        "[[schedules]]\nname = \"nightly\"\ncron = \"0 0 2 * * *\"\nconsumer = \"payments\"\n";
    let load = |schedules: &str| {
        claimd::config::Config::from_toml(
            &config_toml("sqlite://x.db", &format!("{consumer}\n{schedules}")),
            Path::new("c.toml"),
            std::env::vars(),
        )
    };
    let loaded = load(good).unwrap().config;
    let s = &loaded.schedules[0];
    assert_eq!(
        s.catch_up,
        claimd::domain::periodic::CatchUp::Latest,
        "the default"
    );
    assert!(s.payload.contains("{{slot}}"));
    // Five fields (minute first) are taken too.
    assert!(load(&good.replace("0 0 2 * * *", "0 2 * * *")).is_ok());
    for (schedules, expect) in [
        (
            good.replace("payments\"", "refunds\""),
            "schedules[0].consumer: schedule \"nightly\": no consumer \"refunds\"",
        ),
        (
            good.replace("0 0 2 * * *", "0 0 25 * * *"),
            "schedules[0].cron: schedule \"nightly\"",
        ),
        (
            good.replace("0 0 2 * * *", "every night"),
            "schedules[0].cron: schedule \"nightly\": \"every night\": expected 5 fields",
        ),
        (
            good.replace("\"nightly\"", "\"night ly\""),
            "schedules[0].name: schedule \"night ly\"",
        ),
        (
            format!("{good}\n{good}"),
            "schedules[1].name: schedule \"nightly\": another schedule has this name",
        ),
        (
            format!("{good}payload = '{{\"slot\": {{{{slot}}}}}}'\n"),
            "schedules[0].payload: schedule \"nightly\": not JSON",
        ),
        (
            format!("{good}tenant = \"acme\"\n"),
            "schedules[0].tenant: schedule \"nightly\": consumer \"payments\" has no {tenant} in its key",
        ),
        (
            format!("{good}catch_up = \"some\"\n"),
            "schedules[0].catch_up",
        ),
        (format!("{good}every = \"1h\"\n"), "schedules[0]"),
    ] {
        let e = load(&schedules).unwrap_err().to_string();
        assert!(e.contains(expect), "expected {expect:?} in: {e}");
    }
}

/// One run of the "Done when" scenario: three instances on one PostgreSQL, three schedules
/// (`all`, `latest`, `none`) every 5 s for about 2 minutes, every instance killed (SIGKILL)
/// for 30 s in the middle. Prints each slot and how often it was performed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: cargo test --test suite schedules -- --ignored"]
async fn three_instances_with_a_downtime_perform_each_slot_once_or_as_catch_up_says() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sb, provider) = counting_sandbox().await;
    let toml = config_toml(
        &store.url(),
        &format!(
            "{}{}{}{}",
            consumer_toml("payments", &provider, ""),
            schedule_toml("all", "*/5 * * * * *", "all"),
            schedule_toml("latest", "*/5 * * * * *", "latest"),
            schedule_toml("none", "*/5 * * * * *", "none"),
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let spawn_three = |round: &'static str| {
        let (toml, dir) = (toml.clone(), dir.path().to_path_buf());
        async move {
            let mut ws = Vec::new();
            for i in 0..3 {
                ws.push(ready_worker(&toml, &dir, &format!("{round}-{i}")).await);
            }
            ws
        }
    };
    let first = spawn_three("before").await;
    // Slots from here on are checked (each instance's schedules start when it does).
    let begin = Utc::now();
    tokio::time::sleep(Duration::from_secs(45)).await;
    let stopped = Utc::now();
    for w in first {
        w.kill();
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let restarting = Utc::now();
    let second = spawn_three("after").await;
    let ready = Utc::now();
    tokio::time::sleep(Duration::from_secs(45)).await;
    let cutoff = Utc::now() - ChronoDuration::seconds(6);
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    let claims = settled_through(&s, cutoff).await;
    drop(second);
    println!(
        "began {begin}, killed {stopped}, restarting {restarting}, ready {ready}, cutoff {cutoff}"
    );
    // Every 5 s slot from the first after the start to the cutoff.
    let mut slot = begin + ChronoDuration::seconds(5 - begin.timestamp() % 5)
        - ChronoDuration::nanoseconds(begin.timestamp_subsec_nanos() as i64);
    let mut slots = Vec::new();
    while slot <= cutoff {
        slots.push(slot);
        slot += ChronoDuration::seconds(5);
    }
    let mut failures = Vec::new();
    for name in ["all", "latest", "none"] {
        let claimed = slots_of(&claims, name);
        let mut caught_up = 0;
        println!("schedule {name}:");
        for slot in &slots {
            let performed = applied(&sb, name, *slot);
            let has_claim = claimed.contains_key(slot);
            let zone = if *slot <= stopped - ChronoDuration::seconds(2) {
                "before"
            } else if *slot >= ready + ChronoDuration::seconds(2) {
                "after"
            } else {
                "down"
            };
            println!("  {slot} {zone:6} claimed={has_claim} performed={performed}");
            let mut fail = |why: &str| failures.push(format!("{name} {slot} ({zone}): {why}"));
            if performed > 1 {
                fail("performed more than once");
            }
            if has_claim != (performed == 1) {
                fail("claim and provider disagree");
            }
            match zone {
                "before" | "after" if performed != 1 => fail("not performed"),
                "down" => {
                    // Slots that fell while every instance was down and well before the
                    // restart (earlier than the newest missed one can be).
                    let long_missed =
                        *slot > stopped && *slot < restarting - ChronoDuration::seconds(3 + 5);
                    if name == "all" && performed != 1 {
                        fail("catch_up = \"all\" leaves no slot out");
                    }
                    if name != "all" && long_missed && performed != 0 {
                        fail("a missed slot was performed");
                    }
                    if name == "latest" && *slot > stopped && performed == 1 {
                        caught_up += 1;
                    }
                }
                _ => {}
            }
        }
        if name == "latest" && caught_up == 0 {
            failures.push("latest: no missed slot was caught up".into());
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_whose_messages_its_consumer_would_refuse_stops_the_start() {
    // The consumer orders its claims by a payload field the schedule's payload lacks: every
    // slot would be refused, so `claimd run` does not start.
    let store = TestStore::sqlite();
    let toml = config_toml(
        &store.url(),
        &format!(
            "{}{}",
            consumer_toml(
                "payments",
                "http://127.0.0.1:9",
                "order_key = \"{order_id}\""
            ),
            schedule_toml("nightly", "0 0 2 * * *", "latest")
        ),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let e = claimd::service::run::start(app)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schedule \"nightly\": consumer \"payments\" would refuse its messages")
            && e.contains("order_id"),
        "{e}"
    );
    // With the field in its payload, it starts.
    let fixed = toml.replace(
        "\"amount\": 100",
        "\"amount\": 100, \"order_id\": \"{{slot}}\"",
    );
    let w = start(&fixed).await;
    w.shutdown(Duration::from_secs(1)).await;
}
