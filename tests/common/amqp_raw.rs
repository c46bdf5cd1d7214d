//! A publisher that writes AMQP 0-9-1 frames itself, for messages no client library would send:
//! headers nested thousands of levels deep (lapin's own encoder recurses, and so did its
//! decoder), short strings that are not UTF-8. Blocking I/O on a socket of its own; call it from
//! `spawn_blocking`.

use std::io::{Read, Write};
use std::net::TcpStream;

/// RabbitMQ's default `frame_max` (the broker's `frame_max` setting).
pub const FRAME_MAX: usize = 131_072;

/// A connection with channel 1 open in confirm mode.
pub struct RawPublisher {
    sock: TcpStream,
}

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(0xce);
    f
}

fn short(s: &[u8]) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s);
    v
}

fn long(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut v = class.to_be_bytes().to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(args);
    v
}

/// How a nested header is built.
#[derive(Clone, Copy, Debug)]
pub enum Nesting {
    /// Tables inside tables, each under the key "a" (7 bytes a level).
    Tables,
    /// Arrays inside arrays (5 bytes a level: the most levels a frame can hold).
    Arrays,
}

impl Nesting {
    fn level_bytes(self) -> usize {
        match self {
            Nesting::Tables => 7,
            Nesting::Arrays => 5,
        }
    }
}

/// An encoded `headers` table whose one header "deep" holds a value nested `levels` deep
/// (tables or arrays), the `headers` table itself not counted.
pub fn nested_headers(levels: usize, shape: Nesting) -> Vec<u8> {
    // Written outside in: each level's length is known from how many levels lie below it.
    let per = shape.level_bytes();
    let mut value = Vec::with_capacity(levels * per + 16);
    for level in 1..=levels {
        let below = levels - level;
        let (tag, entry) = match shape {
            Nesting::Tables => (b'F', &[1u8, b'a', b'F'][..]),
            Nesting::Arrays => (b'A', &[b'A'][..]),
        };
        if level == 1 {
            value.push(tag);
        }
        let content = if below == 0 { 0 } else { below * per };
        value.extend_from_slice(&(content as u32).to_be_bytes());
        if below > 0 {
            value.extend_from_slice(entry);
        }
    }
    let mut entry = short(b"deep");
    entry.extend_from_slice(&value);
    long(&entry)
}

/// The deepest `levels` for [`nested_headers`] whose content header frame the broker still
/// takes with a message id of `id_len` bytes. RabbitMQ takes a frame whose payload is
/// `frame_max` bytes (measured: one byte more is a `FRAME_ERROR`), 8 more than the AMQP spec's
/// `frame_max`, which counts the frame's header and end too.
pub fn deepest_that_fits(frame_max: usize, id_len: usize, shape: Nesting) -> usize {
    // Class, weight, body size, flags (14); the headers table's length (4), the key "deep" (5),
    // its type (1), the last level's length (4); the message id (1 + id_len).
    let fixed = 14 + 4 + 5 + 1 + 4 + 1 + id_len;
    (frame_max - fixed) / shape.level_bytes() + 1
}

impl RawPublisher {
    /// Connects as guest to `127.0.0.1:5672` (vhost `/`), accepting the broker's `frame_max`.
    pub fn connect() -> std::io::Result<RawPublisher> {
        let mut sock = TcpStream::connect("127.0.0.1:5672")?;
        sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        sock.write_all(b"AMQP\x00\x00\x09\x01")?;
        let mut p = RawPublisher { sock };
        p.read_frame()?; // connection.start
        let mut start_ok = long(b"");
        start_ok.extend(short(b"PLAIN"));
        start_ok.extend(long(b"\0guest\0guest"));
        start_ok.extend(short(b"en_US"));
        p.send(1, 0, &method(10, 11, &start_ok))?;
        let (_, _, tune) = p.read_frame()?; // connection.tune: channel_max, frame_max, heartbeat
        let mut tune_ok = tune[4..10].to_vec();
        tune_ok.extend_from_slice(&0u16.to_be_bytes());
        p.send(1, 0, &method(10, 31, &tune_ok))?;
        let mut open = short(b"/");
        open.extend(short(b""));
        open.push(0);
        p.send(1, 0, &method(10, 40, &open))?;
        p.read_frame()?; // open-ok
        p.send(1, 1, &method(20, 10, &short(b"")))?;
        p.read_frame()?; // channel.open-ok
        p.send(1, 1, &method(85, 10, &[0]))?;
        p.read_frame()?; // confirm.select-ok
        Ok(p)
    }

    fn send(&mut self, kind: u8, channel: u16, payload: &[u8]) -> std::io::Result<()> {
        self.sock.write_all(&frame(kind, channel, payload))
    }

    fn read_frame(&mut self) -> std::io::Result<(u8, u16, Vec<u8>)> {
        let mut head = [0u8; 7];
        self.sock.read_exact(&mut head)?;
        let len = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut payload = vec![0u8; len + 1];
        self.sock.read_exact(&mut payload)?;
        payload.truncate(len);
        Ok((head[0], u16::from_be_bytes([head[1], head[2]]), payload))
    }

    /// Publishes `body` to `queue` (default exchange) with the raw `message_id` bytes and, if
    /// given, an encoded `headers` table; `Ok(())` once the broker confirmed it, else what the
    /// broker answered (a frame too large closes the connection).
    pub fn publish(
        &mut self,
        queue: &str,
        message_id: &[u8],
        headers: Option<&[u8]>,
        body: &[u8],
    ) -> Result<(), String> {
        let mut args = 0u16.to_be_bytes().to_vec();
        args.extend(short(b""));
        args.extend(short(queue.as_bytes()));
        args.push(1); // mandatory
        let mut flags = 1u16 << 7; // message_id
        let mut props = Vec::new();
        if let Some(h) = headers {
            flags |= 1 << 13;
            props.extend_from_slice(h);
        }
        props.extend(short(message_id));
        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        header.extend_from_slice(&flags.to_be_bytes());
        header.extend(props);
        let sent = self
            .send(1, 1, &method(60, 40, &args))
            .and_then(|_| self.send(2, 1, &header))
            .and_then(|_| self.send(3, 1, body));
        sent.map_err(|e| format!("send: {e}"))?;
        let (_, _, p) = self.read_frame().map_err(|e| format!("read: {e}"))?;
        match (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ) {
            (60, 80) => Ok(()),
            (60, 120) => Err("nack".into()),
            (60, 50) => Err("returned: no such queue".into()),
            (class, id) => Err(format!(
                "{class}.{id}: {}",
                String::from_utf8_lossy(&p[4..p.len().min(200)])
            )),
        }
    }
}
