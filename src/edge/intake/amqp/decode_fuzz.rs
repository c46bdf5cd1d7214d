//! Property tests over the AMQP decode path claimd feeds: a content header frame from the
//! broker goes through the broker guard (`frame_guard`), then lapin's unpatched decoder
//! (`amq_protocol::frame::parse_frame`), then what claimd reads from the properties (depth
//! check, message id, tenant) and the dead letter it would publish. Inputs: well-formed
//! frames with headers nested up to 400 levels (tables, arrays, mixed), ids and header names of
//! any bytes, scalar values of every type, then bytes of the payload overwritten or cut; and
//! payloads of random bytes. Whatever the frame holds, the guard's output decodes, or the
//! guard says it cannot read the frame (which it then passes on unchanged, as lapin would get
//! it without the guard; RabbitMQ sends no such frame).
//!
//! Each case runs on a thread with the stack lapin's I/O thread has (2 MiB, Rust's default for a
//! spawned thread): the decoder recurses once per nesting level, and a header the guard let
//! through too deep would overflow it and abort the test binary. Here the decoder is compiled
//! unoptimised (its generic parsers are instantiated in this crate), so it takes several times
//! the stack it takes inside lapin: the margin in a real build is larger than the one tested.
//! Run longer with `PROPTEST_CASES` (docs/amqp-and-email.md, "Fuzzing the decode path").

use super::frame_guard::{content_header, from_broker};
use super::verdict::{header_bytes, message_id_of, nesting, too_deep_headers};
use super::*;
use amq_protocol::frame::{AMQPFrame, parse_frame};
use proptest::prelude::*;

/// One header's value, before encoding.
#[derive(Debug, Clone)]
enum Gen {
    /// A scalar: its type tag and raw bytes (lengths written for the string types).
    Scalar(u8, Vec<u8>),
    /// `levels` tables or arrays, one inside the other (`shapes[i % len]`: true = table),
    /// around a scalar.
    Nested {
        levels: usize,
        shapes: Vec<bool>,
        inner: Box<Gen>,
    },
}

fn long(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

/// The encoding of `g`, type tag included. Iterative over the nesting.
fn encode(g: &Gen) -> Vec<u8> {
    match g {
        Gen::Scalar(tag, bytes) => {
            let mut v = vec![*tag];
            match tag {
                b'S' | b'x' => v.extend(long(bytes)),
                b't' | b'b' | b'B' => v.push(bytes.first().copied().unwrap_or(0)),
                b's' | b'u' => v.extend(pad(bytes, 2)),
                b'I' | b'i' | b'f' => v.extend(pad(bytes, 4)),
                b'l' | b'd' | b'T' => v.extend(pad(bytes, 8)),
                b'D' => v.extend(pad(bytes, 5)),
                _ => {} // 'V'
            }
            v
        }
        Gen::Nested {
            levels,
            shapes,
            inner,
        } => {
            let mut v = encode(inner);
            for i in (0..*levels).rev() {
                v = if shapes[i % shapes.len()] {
                    let mut entry = vec![1, b'n'];
                    entry.extend(v);
                    let mut t = vec![b'F'];
                    t.extend(long(&entry));
                    t
                } else {
                    let mut a = vec![b'A'];
                    a.extend(long(&v));
                    a
                };
            }
            v
        }
    }
}

fn pad(bytes: &[u8], n: usize) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(n, 0);
    v
}

fn depth_of(g: &Gen) -> usize {
    match g {
        Gen::Scalar(..) => 0,
        Gen::Nested { levels, inner, .. } => levels + depth_of(inner),
    }
}

fn scalar() -> impl Strategy<Value = Gen> {
    (
        prop::sample::select(b"StbBsuIiflTdDxV".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(t, b)| Gen::Scalar(t, b))
}

fn value() -> impl Strategy<Value = Gen> {
    prop_oneof![
        scalar(),
        (
            prop_oneof![1usize..40, 90usize..110, 110usize..400],
            prop::collection::vec(any::<bool>(), 1..4),
            scalar()
        )
            .prop_map(|(levels, shapes, inner)| Gen::Nested {
                levels,
                shapes,
                inner: Box::new(inner)
            }),
    ]
}

/// A content header frame (channel 1): `message_id` and `headers` set, raw bytes.
fn header_frame(message_id: &[u8], headers: &[(Vec<u8>, Gen)]) -> Vec<u8> {
    let mut table = Vec::new();
    for (name, g) in headers {
        table.push(name.len() as u8);
        table.extend_from_slice(name);
        table.extend(encode(g));
    }
    let mut payload = 60u16.to_be_bytes().to_vec();
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend_from_slice(&2u64.to_be_bytes());
    payload.extend_from_slice(&((1u16 << 13) | (1 << 7)).to_be_bytes());
    payload.extend(long(&table));
    payload.push(message_id.len() as u8);
    payload.extend_from_slice(message_id);
    payload
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2u8, 0, 1];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(0xce);
    f
}

/// The stack of lapin's I/O thread (`std::thread::Builder` without a size).
const LAPIN_IO_STACK: usize = 2 * 1024 * 1024;

/// What claimd does with a frame from the broker, on lapin's I/O thread's stack: the guard,
/// then the decoder, then reading the properties as `judge` does and building the dead letter.
/// Returns whether the frame decoded as a header and, if so, whether claimd would dead-letter
/// it for depth. Panics when the guard judged a header frame and its output does not decode.
fn feed(frame: Vec<u8>) -> Option<bool> {
    std::thread::Builder::new()
        .stack_size(LAPIN_IO_STACK)
        .spawn(move || {
            let judged = frame[0] == 2
                && content_header(&frame[7..frame.len() - 1], MAX_HEADER_DEPTH).is_ok();
            let frame = from_broker(&frame, MAX_HEADER_DEPTH).unwrap_or(frame);
            let decoded = parse_frame(&frame[..]);
            assert!(
                !judged || matches!(decoded, Ok((_, AMQPFrame::Header(..)))),
                "the guard passed a header frame the decoder refuses: {decoded:?}"
            );
            let Ok((_, AMQPFrame::Header(_, h))) = decoded else {
                return None;
            };
            let props: BasicProperties = h.properties;
            let deep = too_deep_headers(&props);
            let _ = message_id_of(&props, "x-message-id");
            let _ = header_bytes(&props, "tenant");
            let copy = disposition::dead_letter_properties(&props, "reason");
            // The copy never carries a header over the limit, and keeps the reason.
            let headers = copy.headers().clone().unwrap_or_default();
            assert!(
                headers
                    .inner()
                    .values()
                    .all(|v| nesting(v) < MAX_HEADER_DEPTH)
            );
            assert!(headers.contains_key(REASON_HEADER));
            let _ = format!("{props:?}").len();
            Some(!deep.is_empty())
        })
        .expect("spawn")
        .join()
        .expect("the decode path panicked")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn well_formed_headers_decode_and_deep_ones_are_dead_lettered(
        id in prop::collection::vec(any::<u8>(), 0..64),
        headers in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..8), value()),
            0..4,
        ),
    ) {
        let deepest = headers.iter().map(|(_, g)| 1 + depth_of(g)).max().unwrap_or(0);
        // Headers whose names are not UTF-8 are taken out as unreadable, whatever their depth.
        let deep = headers
            .iter()
            .any(|(name, g)| std::str::from_utf8(name).is_ok() && 1 + depth_of(g) > MAX_HEADER_DEPTH);
        let decoded = feed(framed(&header_frame(&id, &headers)));
        prop_assert!(decoded.is_some(), "a well-formed frame did not decode (deepest {deepest})");
        prop_assert_eq!(decoded, Some(deep));
    }

    #[test]
    fn overwritten_or_cut_frames_never_crash(
        id in prop::collection::vec(any::<u8>(), 0..16),
        headers in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..4), value()),
            1..3,
        ),
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        cutting in any::<bool>(),
    ) {
        let mut payload = header_frame(&id, &headers);
        for (at, byte) in writes {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        if cutting {
            payload.truncate(cut.index(payload.len() + 1));
        }
        feed(framed(&payload));
    }

    #[test]
    fn random_payloads_never_crash(
        kind in prop::sample::select(vec![1u8, 2, 3, 8]),
        payload in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut f = framed(&payload);
        f[0] = kind;
        feed(f);
    }
}
