//! Property tests (a fuzz target by another name) over the pure functions that read HTTP intake
//! headers: `Idempotency-Key`, `Tenant-Id`, `Content-Type`, `Content-Length`, and the `Host` /
//! `Origin` checks of token-less routes. Arbitrary bytes never panic, and each function accepts
//! exactly what docs/operations.md says it accepts. Longer runs: `PROPTEST_CASES=2000000 cargo
//! test --test edge_headers` (docs/reliability.md, "Edge").

use axum::http::{HeaderMap, HeaderValue, header};
use claimd::domain::claim::{validate_content_type, validate_message_id, validate_tenant};
use claimd::edge::http::guard::{host_allowed, host_name, is_loopback_name, origin_allowed};
use claimd::edge::http::server::declared_length;
use proptest::prelude::*;

/// Names as DNS has them (never `localhost` or under `.localhost`).
fn dns_name() -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-z0-9][a-z0-9-]{0,15}", 1..5)
        .prop_map(|labels| labels.join("."))
        .prop_filter("not a loopback name", |n| {
            n != "localhost" && !n.ends_with(".localhost") && n.parse::<std::net::IpAddr>().is_err()
        })
}

fn port() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), (0u16..).prop_map(|p| format!(":{p}"))]
}

/// Every way a request can name this machine.
fn loopback_host() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("localhost".to_string()),
        Just("LocalHost.".to_string()),
        "[a-z0-9]{1,10}".prop_map(|l| format!("{l}.localhost")),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c)| format!("127.{a}.{b}.{c}")),
        Just("[::1]".to_string()),
        Just("[0:0:0:0:0:0:0:1]".to_string()),
    ]
}

proptest! {
    #[test]
    fn host_and_origin_checks_never_panic_and_accept_only_local_names(s in "\\PC{0,80}", raw in proptest::collection::vec(any::<u8>(), 0..80)) {
        let lossy = String::from_utf8_lossy(&raw).into_owned();
        for v in [&s, &lossy] {
            if host_allowed(v, &[]) {
                let name = host_name(v).expect("an accepted Host parses");
                prop_assert!(is_loopback_name(&name), "{v:?} accepted as {name:?}");
            }
            if origin_allowed(v, &[]) {
                prop_assert!(v.trim().starts_with("http://") || v.trim().starts_with("https://"), "{v:?}");
            }
        }
    }

    #[test]
    fn a_rebinding_name_is_refused_unless_listed(name in dns_name(), port in port(), upper in any::<bool>()) {
        let host = format!("{name}{port}");
        let sent = if upper { host.to_ascii_uppercase() } else { host.clone() };
        prop_assert!(!host_allowed(&sent, &[]), "{sent}");
        prop_assert!(!origin_allowed(&format!("http://{sent}"), &[]), "{sent}");
        prop_assert!(host_allowed(&sent, std::slice::from_ref(&name)), "{sent} listed");
        prop_assert!(origin_allowed(&format!("https://{sent}"), &[name.to_ascii_uppercase()]), "{sent} listed");
        // A local name as userinfo or in a path does not make a foreign origin local.
        let userinfo = format!("http://localhost@{host}");
        let path = format!("http://{host}/localhost");
        prop_assert!(!origin_allowed(&userinfo, &[]), "{}", userinfo);
        prop_assert!(!origin_allowed(&path, &[]), "{}", path);
    }

    #[test]
    fn every_loopback_spelling_is_accepted(host in loopback_host(), port in port()) {
        let v = format!("{host}{port}");
        prop_assert!(host_allowed(&v, &[]), "{v}");
        prop_assert!(origin_allowed(&format!("http://{v}"), &[]), "{v}");
        prop_assert!(!origin_allowed("null", &[]));
    }

    #[test]
    fn content_length_reads_digits_only(n in any::<u64>(), pad in "[ \t]{0,3}", raw in proptest::collection::vec(any::<u8>(), 0..30)) {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(&format!("{pad}{n}{pad}")).unwrap());
        prop_assert_eq!(declared_length(&h), Some(n));
        if let Ok(v) = HeaderValue::from_bytes(&raw) {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, v);
            if let Some(got) = declared_length(&h) {
                let text = std::str::from_utf8(&raw).unwrap().trim();
                prop_assert_eq!(text.trim_start_matches('+').parse::<u64>().ok(), Some(got));
            }
        }
    }

    #[test]
    fn idempotency_keys_and_tenants_are_visible_ascii_up_to_255(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        let visible = raw.iter().all(|b| (0x21..=0x7e).contains(b));
        let short = raw.len() <= 255;
        prop_assert_eq!(validate_message_id(&raw).is_ok(), visible && short && !raw.is_empty());
        prop_assert_eq!(validate_tenant(&raw).is_ok(), visible && short);
        if let Ok(s) = validate_message_id(&raw) {
            prop_assert_eq!(s.as_bytes(), &raw[..]);
        }
    }

    #[test]
    fn content_types_are_printable_ascii_up_to_255(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        let printable = raw.iter().all(|b| *b == b'\t' || (0x20..=0x7e).contains(b));
        prop_assert_eq!(validate_content_type(&raw).is_ok(), printable && raw.len() <= 255);
    }
}
