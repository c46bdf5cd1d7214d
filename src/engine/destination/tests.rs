//! The breakers and the pace, in paused time.

use super::*;

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

fn down() -> Verdict {
    Verdict::Failed { retry_after: None }
}

#[tokio::test(start_paused = true)]
async fn a_failing_destination_opens_and_probes_one_request_at_a_time() {
    let d = Destination::new(None);
    for _ in 0..FAILED_OF_RECENT {
        let p = d.reserve(far()).unwrap();
        d.record(p, down());
    }
    assert_eq!(d.status().state, BreakerState::Open);
    let held = d.reserve(far()).unwrap_err();
    assert_eq!(held.by, HeldBy::Open);
    assert_eq!(held.until - Instant::now(), MIN_OPEN);
    tokio::time::advance(MIN_OPEN).await;
    let probe = d.reserve(far()).unwrap();
    assert_eq!(d.reserve(far()).unwrap_err().by, HeldBy::Probing);
    d.record(probe, down());
    // Each failed probe doubles the wait, up to MAX_OPEN: at most one request a second.
    let mut sent = 1;
    let start = Instant::now();
    while Instant::now() < start + Duration::from_secs(600) {
        match d.reserve(far()) {
            Ok(p) => {
                sent += 1;
                d.record(p, down());
            }
            Err(h) => tokio::time::sleep_until(h.until).await,
        }
    }
    assert!(
        sent <= 600 / MAX_OPEN.as_secs() + 5,
        "{sent} requests in 600 s"
    );
    tokio::time::advance(MAX_OPEN).await;
    let probe = d.reserve(far()).unwrap();
    d.record(probe, Verdict::Answered);
    assert_eq!(d.status().state, BreakerState::Closed);
    assert_eq!(d.status().rate, Some(SLOW_START));
}

#[tokio::test(start_paused = true)]
async fn a_failing_status_endpoint_never_holds_calls_back() {
    let d = Destination::new(None);
    for _ in 0..FAILED_OF_RECENT {
        let p = d.reserve_as(Kind::Lookup, far()).unwrap();
        d.record(p, down());
    }
    assert_eq!(d.lookup_state(), BreakerState::Open);
    let held = d.reserve_as(Kind::Lookup, far()).unwrap_err();
    assert_eq!(held.by, HeldBy::Open);
    // Calls go, at full pace, and the sweeper is not kept away.
    assert_eq!(d.status().state, BreakerState::Closed);
    assert_eq!(d.open_until(), None);
    let call = d.reserve(far()).unwrap();
    assert_eq!(call.at, Instant::now());
    d.record(call, Verdict::Answered);
    // A lookup answered after its outage leaves the calls' pace alone.
    tokio::time::advance(MIN_OPEN).await;
    let probe = d.reserve_as(Kind::Lookup, far()).unwrap();
    d.record(probe, Verdict::Answered);
    assert_eq!(d.lookup_state(), BreakerState::Closed);
    assert_eq!(d.status().rate, None);
}

#[tokio::test(start_paused = true)]
async fn after_an_outage_the_pace_starts_low_and_rises_to_the_ceiling() {
    let d = Destination::new(Some(500.0));
    for _ in 0..FAILED_OF_RECENT {
        let p = d.reserve(far()).unwrap();
        d.record(p, down());
    }
    // Down for 7 s: probes at 1 s and 3 s fail, the one at 7 s is answered.
    for wait in [1, 2] {
        tokio::time::advance(Duration::from_secs(wait)).await;
        let probe = d.reserve(far()).unwrap();
        d.record(probe, down());
    }
    tokio::time::advance(Duration::from_secs(4)).await;
    let probe = d.reserve(far()).unwrap();
    d.record(probe, Verdict::Answered);
    assert_eq!(d.status().rate, Some(10.0));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(d.status().rate, Some(80.0));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(d.status().rate, Some(500.0), "capped by the ceiling");
}

#[tokio::test(start_paused = true)]
async fn a_flaky_provider_stays_in_use_and_a_blip_resumes_at_full_pace() {
    let d = Destination::new(None);
    // Three calls in ten fail, five of them in a row once: not a provider that is down.
    let pattern = [
        true, true, true, true, true, false, false, false, false, false,
    ];
    for failed in pattern.iter().chain(pattern.iter()) {
        let p = d.reserve(far()).unwrap();
        d.record(p, if *failed { down() } else { Verdict::Answered });
    }
    assert_eq!(d.status().state, BreakerState::Closed);
    // Down for a second, then back: the pace it had (none), no slow start.
    let mut failed = 0;
    while let Ok(p) = d.reserve(far()) {
        d.record(p, down());
        failed += 1;
    }
    assert!(failed <= RECENT, "{failed} failures to open");
    assert_eq!(d.status().state, BreakerState::Open);
    tokio::time::advance(MIN_OPEN).await;
    let probe = d.reserve(far()).unwrap();
    d.record(probe, Verdict::Answered);
    assert_eq!(d.status().state, BreakerState::Closed);
    assert_eq!(d.status().rate, None);
}

#[tokio::test(start_paused = true)]
async fn a_ceiling_spaces_requests_evenly() {
    let d = Destination::new(Some(50.0));
    let start = Instant::now();
    let mut last = start;
    for _ in 0..100 {
        let p = d.admit(far()).await.unwrap();
        last = p.at;
        d.record(p, Verdict::Answered);
    }
    // 100 requests at 50/s: the last one two seconds (less one gap) after the first.
    assert_eq!(last - start, Duration::from_millis(1980));
    // A slot later than the caller can wait is refused, not reserved.
    let soon = Instant::now() + Duration::from_millis(1);
    let _ = d.reserve(far()).unwrap();
    assert_eq!(d.reserve(soon).unwrap_err().by, HeldBy::Pace);
}

#[tokio::test(start_paused = true)]
async fn a_429_pauses_the_whole_destination_and_halves_the_pace() {
    let d = Destination::new(None);
    for _ in 0..200 {
        let p = d.reserve(far()).unwrap();
        d.record(p, Verdict::Answered);
    }
    let p = d.reserve(far()).unwrap();
    d.record(
        p,
        Verdict::RateLimited {
            retry_after: Some(Duration::from_secs(2)),
        },
    );
    let s = d.status();
    assert_eq!(
        s.rate,
        Some(100.5),
        "half of 201 requests in the last second"
    );
    assert_eq!(s.resumes_in, Some(Duration::from_secs(2)));
    // Everyone waits for the pause, then goes at the halved pace.
    let p = d.admit(far()).await.unwrap();
    assert!(p.at >= Instant::now() && Instant::now() - p.at < Duration::from_millis(1));
    d.record(p, Verdict::Answered);
    // The two seconds of pause grew the pace by 5 % each (additive increase).
    let before = d.status().rate.unwrap();
    assert!((before - 100.5 * 1.05 * 1.05).abs() < 0.01, "{before}");
    // A burst of 429s from requests already in flight halves only once a second.
    for _ in 0..10 {
        let p = d.reserve(far()).unwrap();
        d.record(p, Verdict::RateLimited { retry_after: None });
    }
    assert_eq!(d.status().rate, Some(before / 2.0));
}

#[test]
fn verdicts_follow_what_the_answer_proves() {
    let refused = Outcome::NotApplied {
        status: None,
        retry_after: None,
        error: "could not connect: Connection refused".into(),
    };
    assert_eq!(Verdict::of_outcome(&refused), down());
    let unbuilt = Outcome::NotApplied {
        status: None,
        retry_after: None,
        error: format!("{}: no field amount", crate::provider::effect::NOT_BUILT),
    };
    assert_eq!(Verdict::of_outcome(&unbuilt), Verdict::Neutral);
    let limited = Outcome::NotApplied {
        status: Some(429),
        retry_after: Some(Duration::from_secs(3)),
        error: String::new(),
    };
    assert_eq!(
        Verdict::of_outcome(&limited),
        Verdict::RateLimited {
            retry_after: Some(Duration::from_secs(3))
        }
    );
    let timeout = Outcome::Unknown {
        status: None,
        error: "timed out".into(),
    };
    assert_eq!(Verdict::of_outcome(&timeout), down());
    let rejected = Outcome::Rejected {
        status: 400,
        response: String::new(),
    };
    assert_eq!(Verdict::of_outcome(&rejected), Verdict::Answered);
}
