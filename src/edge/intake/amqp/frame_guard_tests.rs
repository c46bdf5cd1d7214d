//! Tests of the AMQP frame rewrites against lapin's unpatched decoder.

use super::frame_guard::*;
use amq_protocol::frame::{AMQPFrame, parse_frame};
use amq_protocol::protocol::AMQPClass;
use amq_protocol::protocol::basic::AMQPMethod;
use lapin::types::AMQPValue;

fn entry(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = vec![name.len() as u8];
    v.extend_from_slice(name);
    v.extend_from_slice(value);
    v
}

/// A table value nesting `levels` tables.
fn nested(levels: usize) -> Vec<u8> {
    let mut v = b"V".to_vec();
    for _ in 0..levels {
        let e = entry(b"n", &v);
        v = b"F".to_vec();
        v.extend_from_slice(&(e.len() as u32).to_be_bytes());
        v.extend_from_slice(&e);
    }
    v
}

fn header_frame(table: &[u8], message_id: &[u8]) -> Vec<u8> {
    let mut p = 60u16.to_be_bytes().to_vec();
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&2u64.to_be_bytes());
    p.extend_from_slice(&((1u16 << 13) | (1 << 7)).to_be_bytes());
    p.extend_from_slice(&(table.len() as u32).to_be_bytes());
    p.extend_from_slice(table);
    p.push(message_id.len() as u8);
    p.extend_from_slice(message_id);
    frame_with(&[FRAME_HEADER, 0, 1], &p)
}

#[test]
fn deep_and_unreadable_headers_are_taken_out_and_named_the_rest_kept() {
    let mut table = entry(b"x-message-id", b"S\0\0\0\x02id");
    table.extend(entry(b"deep", &nested(2000)));
    table.extend(entry(b"\xffk", b"S\0\0\0\x01v"));
    table.extend(entry(b"ok", &nested(31)));
    let frame = header_frame(&table, b"m-\xff");
    let out = from_broker(&frame, 32).expect("rewritten");
    let Ok((_, AMQPFrame::Header(_, h))) = parse_frame(&out[..]) else {
        panic!("the rewritten frame does not decode");
    };
    let headers = h.properties.headers().clone().unwrap();
    let text = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text("x-message-id"), "id");
    assert_eq!(text(TOO_DEEP_HEADER), "\"deep\" (2001 levels)");
    assert_eq!(
        text(UNREADABLE_HEADER),
        "\"\u{FFFD}k\" (a name that is not UTF-8)"
    );
    assert!(headers.contains_key("ok"));
    assert!(!headers.contains_key("deep"));
    assert_eq!(
        h.properties.message_id().as_ref().unwrap().as_str(),
        "m-\u{FFFD}"
    );
    // 32 levels in all are fine and pass unchanged.
    let fine = header_frame(&entry(b"ok", &nested(31)), b"m");
    assert_eq!(from_broker(&fine, 32), None);
}

#[test]
fn a_table_that_cannot_be_read_becomes_one_that_says_so() {
    let table = entry(b"k", b"z\0\0");
    let out = from_broker(&header_frame(&table, b"m"), 32).expect("rewritten");
    let Ok((_, AMQPFrame::Header(_, h))) = parse_frame(&out[..]) else {
        panic!("the rewritten frame does not decode");
    };
    let headers = h.properties.headers().clone().unwrap();
    assert_eq!(
        headers.inner().get(UNREADABLE_HEADER),
        Some(&AMQPValue::LongString(
            "the headers table (an unknown field type)".into()
        ))
    );
}

#[test]
fn deliveries_get_their_short_strings_as_utf8() {
    let mut p = vec![0, 60, 0, 60, 3, b'c', b't', b'g'];
    p.extend_from_slice(&7u64.to_be_bytes());
    p.push(0);
    p.extend_from_slice(b"\x02x\xff");
    let long = vec![0xffu8; 255];
    p.push(255);
    p.extend_from_slice(&long);
    let frame = frame_with(&[FRAME_METHOD, 0, 1], &p);
    let out = from_broker(&frame, 32).expect("rewritten");
    let Ok((_, AMQPFrame::Method(_, AMQPClass::Basic(AMQPMethod::Deliver(d))))) =
        parse_frame(&out[..])
    else {
        panic!("the rewritten frame does not decode");
    };
    assert_eq!(d.consumer_tag.as_str(), "ctg");
    assert_eq!(d.exchange.as_str(), "x\u{FFFD}");
    // 255 bad bytes are 765 as U+FFFD: cut to 85 characters.
    assert_eq!(d.routing_key.as_str(), "\u{FFFD}".repeat(85));
}

#[test]
fn frame_sizes_leave_room_for_rewrites_and_bodies_fit_the_broker() {
    assert_eq!(advertised_frame_max(131_072), 131_072 + 65_536);
    assert_eq!(advertised_frame_max(0), 0);
    assert_eq!(frame_max_for_broker(131_072, 131_072 + 65_536), 131_072);
    assert_eq!(frame_max_for_broker(131_072, 0), 131_072);
    assert_eq!(frame_max_for_broker(131_072, 100_000), 100_000 - 65_536);
    assert_eq!(frame_max_for_broker(0, 0), 0);
    let tune = [0, 10, 0, 30, 0, 0, 0, 2, 0, 0, 0, 60];
    assert_eq!(tune_frame_max(&tune, 30), Some(131_072));
    assert_eq!(tune_frame_max(&with_frame_max(&tune, 5), 30), Some(5));
    assert_eq!(tune_frame_max(&tune, 31), None);
    let body = frame_with(&[FRAME_BODY, 0, 1], &[7u8; 10_000]);
    let mut out = Vec::new();
    split_body(&body, 4096, &mut out);
    let mut rest = &out[..];
    let mut sizes = Vec::new();
    while !rest.is_empty() {
        let Ok((r, AMQPFrame::Body(1, b))) = parse_frame(rest) else {
            panic!("not a body frame");
        };
        sizes.push(b.len());
        rest = r;
    }
    assert_eq!(sizes, [4088, 4088, 1824]);
}
