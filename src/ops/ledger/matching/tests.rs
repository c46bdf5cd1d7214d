//! The matcher's cases, without a provider or a store.

use super::*;

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(s, 0).unwrap()
}

fn claim(key: &str, amount: i64, state: ClaimState) -> ClaimSide {
    ClaimSide {
        key: key.into(),
        tenant: "t".into(),
        message_id: format!("m-{key}"),
        state,
        received: at(1_000),
        amount: Some(amount),
        currency: Some("eur".into()),
        provider_id: None,
        erased: false,
    }
}

fn object(key: &str, id: &str, amount: i64, verdict: ObjectVerdict) -> LedgerObject {
    LedgerObject {
        key: key.into(),
        id: id.into(),
        amount: Some(amount),
        currency: Some("eur".into()),
        status: Some("succeeded".into()),
        verdict,
        created: 1_001,
        refunded: None,
    }
}

fn run(claims: Vec<ClaimSide>, objects: Vec<LedgerObject>) -> ConsumerLedger {
    let commands = OperatorCommands::new(None);
    let mut m = Matcher::new("pay", at(0), at(2_000), &commands);
    merge_sorted(&mut m, claims, objects);
    m.finish()
}

const OK: ObjectVerdict = ObjectVerdict::Completed;
const DONE: ClaimState = ClaimState::Completed;

#[test]
fn each_kind_is_found_and_the_totals_difference_is_the_sum_of_the_findings() {
    let claims = vec![
        claim("a", 100, DONE),
        claim("b", 200, DONE),
        claim("c", 300, DONE),
        claim("d", 400, DONE),
        claim("f", 500, ClaimState::Failed),
    ];
    let objects = vec![
        object("a", "pi_a", 100, OK),
        object("b", "pi_b1", 200, OK),
        object("b", "pi_b2", 200, OK),
        // c: missing
        object("d", "pi_d", 450, OK),
        object("e", "pi_e", 70, OK),
        object("f", "pi_f", 500, ObjectVerdict::Failed),
    ];
    let r = run(claims, objects);
    let kinds: Vec<(Kind, &str)> = r
        .findings
        .iter()
        .map(|f| (f.kind, f.key.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Kind::Double, "b"),
            (Kind::Missing, "c"),
            (Kind::Orphan, "e"),
            (Kind::AmountMismatch, "d")
        ]
    );
    assert_eq!(r.findings[0].refund, vec!["pi_b2".to_string()]);
    assert!(r.findings[0].action.contains("refund pi_b2"));
    assert_eq!(r.counts.agreeing, 2, "a and f (failed on both sides)");
    let total: i64 = r.totals.iter().map(|b| b.difference).sum();
    let by_findings: i64 = r.findings.iter().flat_map(|f| f.difference.values()).sum();
    assert_eq!(total, 200 - 300 + 50 + 70);
    assert_eq!(total, by_findings);
    assert!(r.disagrees());
}

#[test]
fn agreeing_ledgers_have_no_findings_and_no_difference() {
    let claims = (0..50).map(|i| claim(&format!("k{i:03}"), i, DONE));
    let objects = (0..50).map(|i| object(&format!("k{i:03}"), &format!("pi_{i}"), i, OK));
    let r = run(claims.collect(), objects.collect());
    assert!(r.findings.is_empty());
    assert!(!r.disagrees());
    assert_eq!(r.counts.agreeing, 50);
    assert_eq!(r.totals.len(), 1);
    assert_eq!(r.totals[0].store_amount, (0..50).sum::<i64>());
}

#[test]
fn status_and_currency_disagreements_say_what_to_run() {
    let mut usd = object("c", "pi_c", 100, OK);
    usd.currency = Some("usd".into());
    let r = run(
        vec![
            claim("a", 100, ClaimState::Failed),
            claim("b", 100, DONE),
            claim("c", 100, DONE),
        ],
        vec![
            object("a", "pi_a", 100, OK),
            object("b", "pi_b", 100, ObjectVerdict::Failed),
            usd,
        ],
    );
    let kinds: Vec<Kind> = r.findings.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![
            Kind::CurrencyMismatch,
            Kind::StatusMismatch,
            Kind::StatusMismatch
        ]
    );
    let a = r.findings.iter().find(|f| f.key == "a").unwrap();
    assert!(a.action.contains("claims resolve"), "{}", a.action);
    assert!(a.action.contains("--as completed"), "{}", a.action);
    let c = &r.findings[0];
    assert_eq!(c.difference.get("usd"), Some(&100));
    assert_eq!(c.difference.get("eur"), Some(&-100));
}

#[test]
fn keys_outside_the_window_belong_to_the_neighbours() {
    let mut early = claim("a", 100, DONE);
    early.received = at(-10);
    let mut late = object("z", "pi_z", 5, OK);
    late.created = 2_500;
    let r = run(vec![early], vec![object("a", "pi_a", 1, OK), late]);
    assert!(r.findings.is_empty());
    assert_eq!(r.counts.outside_window, 2);
}

#[test]
fn a_verdict_survives_its_code() {
    for v in [
        ObjectVerdict::Completed,
        ObjectVerdict::Pending,
        ObjectVerdict::NeedsAttention,
        ObjectVerdict::Failed,
        ObjectVerdict::Unknown,
    ] {
        assert_eq!(ObjectVerdict::from_code(v.code()), v);
    }
}

#[test]
fn a_double_keeps_the_object_the_claim_recorded_whatever_the_creation_times() {
    let mut recorded = object("a", "pi_b", 100, OK);
    recorded.created = 1_005;
    let older = object("a", "pi_a", 100, OK);
    for provider_id in [Some("pi_b"), Some("pi_a"), None] {
        let mut c = claim("a", 100, DONE);
        c.provider_id = provider_id.map(str::to_string);
        let r = run(vec![c], vec![older.clone(), recorded.clone()]);
        let f = &r.findings[0];
        assert_eq!(f.kind, Kind::Double);
        let keep = provider_id.unwrap_or("pi_a");
        let other = if keep == "pi_a" { "pi_b" } else { "pi_a" };
        assert_eq!(f.keep.as_deref(), Some(keep), "{provider_id:?}");
        assert_eq!(f.refund, vec![other.to_string()], "{provider_id:?}");
        assert!(
            f.action.contains(&format!("refund {other} ")),
            "{}",
            f.action
        );
    }
    // Created in the same second, the claim's own object sorts last by id: still kept.
    let mut c = claim("a", 100, DONE);
    c.provider_id = Some("pi_z".into());
    let r = run(
        vec![c],
        vec![object("a", "pi_z", 100, OK), object("a", "pi_a", 100, OK)],
    );
    assert_eq!(r.findings[0].refund, vec!["pi_a".to_string()]);
    assert!(
        r.findings[0].action.contains("the one the claim recorded"),
        "{}",
        r.findings[0].action
    );
}

#[test]
fn an_extra_object_refunded_in_full_is_settled_and_a_partial_refund_is_not() {
    let refunded = |id: &str, by: i64| LedgerObject {
        refunded: Some(by),
        ..object("a", id, 100, OK)
    };
    let r = run(
        vec![claim("a", 100, DONE)],
        vec![object("a", "pi_a", 100, OK), refunded("pi_b", 100)],
    );
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert!(!r.disagrees(), "the totals balance: {:?}", r.totals);
    assert_eq!(r.counts.refunded, 1);
    assert_eq!(r.counts.agreeing, 1);
    let r = run(
        vec![claim("a", 100, DONE)],
        vec![object("a", "pi_a", 100, OK), refunded("pi_b", 40)],
    );
    assert_eq!(r.findings[0].kind, Kind::Double, "partly refunded");
    assert_eq!(r.findings[0].refund, vec!["pi_b".to_string()]);
    // An orphan refunded in full is settled too.
    let r = run(
        vec![],
        vec![LedgerObject {
            refunded: Some(70),
            ..object("e", "pi_e", 70, OK)
        }],
    );
    assert!(r.findings.is_empty() && !r.disagrees(), "{r:?}");
    assert_eq!(r.counts.refunded, 1);
}

#[test]
fn a_currency_mismatch_names_the_objects_currency() {
    let usd = LedgerObject {
        currency: Some("usd".into()),
        ..object("a", "pi_a", 146, OK)
    };
    let r = run(vec![claim("a", 146, DONE)], vec![usd]);
    let f = &r.findings[0];
    assert_eq!(f.kind, Kind::CurrencyMismatch);
    assert_eq!(f.currency, "eur");
    assert_eq!(f.provider_currency.as_deref(), Some("usd"));
}
