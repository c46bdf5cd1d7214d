//! The AMQP broker guard: lapin connects to a loopback port, and what RabbitMQ sends reaches
//! it through [`frame_guard`](super::frame_guard) (docs/decisions.md, "Poison messages").
//!
//! Frames are parsed in both directions; the broker's are rewritten where they would fail
//! lapin's decoder, the client's only where the frame size negotiation needs it:
//! `Connection.Tune` advertises a frame_max larger than the broker's by
//! [`GROWTH_ALLOWANCE`](super::frame_guard::GROWTH_ALLOWANCE) (so a frame of exactly the
//! broker's frame_max, and a rewritten frame that grew, are accepted; lapin refuses a frame of
//! frame_max bytes of payload), `Connection.TuneOk` is written back to what the broker allows,
//! and body frames lapin cuts at the larger size are cut again at the broker's.

use super::frame_guard::{
    FRAME_BODY, FRAME_END, FRAME_METHOD, FRAME_OVERHEAD, advertised_frame_max,
    frame_max_for_broker, frame_with, from_broker, split_body, tune_frame_max, with_frame_max,
};
use super::{AmqpError, MAX_HEADER_DEPTH};
use crate::edge::intake::guard::{Filter, Guard, Protocol, Upstream, split_url};
use bytes::BytesMut;
use lapin::uri::{AMQPScheme, AMQPUri};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The largest frame the guard holds to judge; a larger one (a broker with `frame_max = 0`)
/// ends the judging of that connection and is passed on as it is.
const MAX_JUDGED_FRAME: usize = 64 * 1024 * 1024;

/// The AMQP protocol for [`Guard`].
struct Amqp;

impl Protocol for Amqp {
    fn filters(&self) -> (Box<dyn Filter>, Box<dyn Filter>) {
        let tuning = Arc::new(Tuning::default());
        (
            Box::new(FromBroker {
                tuning: tuning.clone(),
                frames: Frames::default(),
            }),
            Box::new(FromClient {
                tuning,
                frames: Frames::default(),
                protocol_header: 8,
            }),
        )
    }
}

/// The frame sizes of one connection, as negotiated through the guard.
#[derive(Default)]
struct Tuning {
    /// The broker's frame_max (its `Connection.Tune`).
    broker: AtomicU32,
    /// What the broker was told (the rewritten `Connection.TuneOk`): the size body frames
    /// are cut at on their way to it. 0 until then (no cutting).
    to_broker: AtomicU32,
}

/// Splits a byte stream into frames; once something that is not a frame (or too large to
/// hold) passes, the rest of the connection is passed on as it is.
#[derive(Default)]
struct Frames {
    raw: bool,
}

impl Frames {
    /// The next whole frame of `input`, or `None` (incomplete, or raw from now on: `input`
    /// moved to `output`).
    fn next(&mut self, input: &mut BytesMut, output: &mut Vec<u8>) -> Option<BytesMut> {
        if !self.raw && input.len() >= 7 {
            let size = u32::from_be_bytes([input[3], input[4], input[5], input[6]]) as usize;
            if size > MAX_JUDGED_FRAME || !matches!(input[0], 1..=3 | 8) {
                self.raw = true;
            } else if input.len() >= size + FRAME_OVERHEAD {
                let frame = input.split_to(size + FRAME_OVERHEAD);
                if frame[frame.len() - 1] == FRAME_END {
                    return Some(frame);
                }
                self.raw = true;
                output.extend_from_slice(&frame);
            }
        }
        if self.raw {
            output.extend_from_slice(input);
            input.clear();
        }
        None
    }
}

/// The broker's side: frames made readable, `Connection.Tune` advertising a larger frame_max.
struct FromBroker {
    tuning: Arc<Tuning>,
    frames: Frames,
}

impl Filter for FromBroker {
    fn filter(&mut self, input: &mut BytesMut, output: &mut Vec<u8>) {
        while let Some(frame) = self.frames.next(input, output) {
            let payload = &frame[7..frame.len() - 1];
            if frame[0] == FRAME_METHOD
                && let Some(broker) = tune_frame_max(payload, 30)
            {
                self.tuning.broker.store(broker, Ordering::SeqCst);
                let told = with_frame_max(payload, advertised_frame_max(broker));
                output.extend_from_slice(&frame_with(&frame, &told));
                continue;
            }
            match from_broker(&frame, MAX_HEADER_DEPTH) {
                Some(rewritten) => output.extend_from_slice(&rewritten),
                None => output.extend_from_slice(&frame),
            }
        }
    }
}

/// The client's side: the protocol header, then frames; `Connection.TuneOk` written back to
/// the broker's frame_max, body frames cut to it.
struct FromClient {
    tuning: Arc<Tuning>,
    frames: Frames,
    /// Bytes of the protocol header (`AMQP0091`) still to pass.
    protocol_header: usize,
}

impl Filter for FromClient {
    fn filter(&mut self, input: &mut BytesMut, output: &mut Vec<u8>) {
        if self.protocol_header > 0 {
            let n = self.protocol_header.min(input.len());
            output.extend_from_slice(&input.split_to(n));
            self.protocol_header -= n;
            if self.protocol_header > 0 {
                return;
            }
        }
        while let Some(frame) = self.frames.next(input, output) {
            let payload = &frame[7..frame.len() - 1];
            if frame[0] == FRAME_METHOD
                && let Some(client) = tune_frame_max(payload, 31)
            {
                let broker = self.tuning.broker.load(Ordering::SeqCst);
                let told = frame_max_for_broker(broker, client);
                self.tuning.to_broker.store(told, Ordering::SeqCst);
                output.extend_from_slice(&frame_with(&frame, &with_frame_max(payload, told)));
            } else if frame[0] == FRAME_BODY {
                split_body(&frame, self.tuning.to_broker.load(Ordering::SeqCst), output);
            } else {
                output.extend_from_slice(&frame);
            }
        }
    }
}

/// A guard in front of the broker at `url`, and the URL lapin connects to instead (the same
/// credentials, virtual host and options, at the guard's loopback port, without TLS: the guard
/// speaks TLS to the broker when `url` is `amqps://`).
pub(super) async fn start(url: &str) -> Result<(Guard, AMQPUri), AmqpError> {
    let bad = |why: String| AmqpError::Guard(why);
    let split = split_url(url)
        .ok_or_else(|| bad("the URL is not amqp://host... or amqps://host...".into()))?;
    let tls = match split.scheme.to_ascii_lowercase().as_str() {
        "amqp" => false,
        "amqps" => true,
        other => return Err(bad(format!("scheme {other:?} is neither amqp nor amqps"))),
    };
    let mut uri: AMQPUri = url
        .parse()
        .map_err(|e: String| bad(format!("the URL: {e}")))?;
    let upstream = Upstream {
        host: split.host.to_string(),
        port: split.port.unwrap_or(if tls { 5671 } else { 5672 }),
        tls,
    };
    let guard = Guard::start(upstream, Arc::new(Amqp))
        .await
        .map_err(|e| bad(format!("cannot start the broker guard: {e}")))?;
    uri.scheme = AMQPScheme::AMQP;
    uri.authority.host = "127.0.0.1".to_string();
    uri.authority.port = guard.port();
    Ok((guard, uri))
}
