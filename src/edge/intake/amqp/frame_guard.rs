//! The AMQP 0-9-1 frames the broker guard rewrites, as pure functions over bytes (no I/O).
//!
//! lapin's decoder recurses once per nesting level of a field table and fails a whole frame on
//! a short string that is not UTF-8; either closed the connection (or the process) and the
//! broker delivered the same message again, for ever. What reaches lapin through the guard:
//!
//! - a content header whose `headers` table nests deeper than the bound, or holds a name that
//!   is not UTF-8, with those headers taken out and named in [`TOO_DEEP_HEADER`] or
//!   [`UNREADABLE_HEADER`] (the readable ones kept as they were); a table that cannot be read
//!   at all becomes a table of [`UNREADABLE_HEADER`] alone;
//! - short strings that are not UTF-8 (properties such as `message_id`; the exchange,
//!   routing key, consumer tag and reply text of `Basic.Deliver`, `Basic.GetOk`,
//!   `Basic.Return`) as UTF-8 with U+FFFD, cut to 255 bytes on a character boundary.
//!
//! Everything is scanned with loops and an explicit stack, never by recursion, so no input
//! can exhaust the stack here.

use std::borrow::Cow;

/// The last octet of every frame.
pub(crate) const FRAME_END: u8 = 0xCE;
/// A frame's bytes besides its payload: type, channel, size (7) and the end octet (1).
pub(crate) const FRAME_OVERHEAD: usize = 8;
/// A method frame.
pub(crate) const FRAME_METHOD: u8 = 1;
/// A content header frame.
pub(crate) const FRAME_HEADER: u8 = 2;
/// A content body frame.
pub(crate) const FRAME_BODY: u8 = 3;
/// The header naming the headers taken out because they nested too deep, with their depth:
/// `"deep" (2000 levels)`.
pub const TOO_DEEP_HEADER: &str = "x-claimd-headers-too-deep";
/// The header naming the headers taken out because they could not be read (a name that is
/// not UTF-8, a table whose lengths do not add up).
pub const UNREADABLE_HEADER: &str = "x-claimd-unreadable-headers";
/// How much longer than the broker's frames the client must accept: a rewrite adds at most
/// the two names' lists (each cut at [`MAX_NOTE_BYTES`]) and the growth of a dozen short
/// strings cut at 255 bytes.
pub(crate) const GROWTH_ALLOWANCE: u32 = 64 * 1024;
/// The longest list one of the two headers carries.
const MAX_NOTE_BYTES: usize = 2048;

/// Why a frame is passed on unchanged without being judged: lapin decides what to do with it
/// (close the connection, as it would without the guard). The broker does not send these.
pub(crate) type Unjudged = &'static str;

/// `s` as UTF-8: unchanged when it is, else with U+FFFD for the bad bytes, cut to 255 bytes on
/// a character boundary (a short string's limit).
pub(crate) fn lossy_short(s: &[u8]) -> Cow<'_, [u8]> {
    match String::from_utf8_lossy(s) {
        Cow::Borrowed(_) => Cow::Borrowed(s),
        Cow::Owned(mut text) => {
            let mut end = text.len().min(255);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            Cow::Owned(text.into_bytes())
        }
    }
}

/// A cursor over a payload, failing with [`Unjudged`] at its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Unjudged> {
        let end = self.at.checked_add(n).ok_or("a length past the frame")?;
        let s = self
            .bytes
            .get(self.at..end)
            .ok_or("a length past the frame")?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Unjudged> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Unjudged> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, Unjudged> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A short string, copied to `out` as UTF-8; whether it was changed.
    fn short_string(&mut self, out: &mut Vec<u8>) -> Result<bool, Unjudged> {
        let len = self.u8()?;
        let s = self.take(usize::from(len))?;
        let text = lossy_short(s);
        out.push(text.len() as u8);
        out.extend_from_slice(&text);
        Ok(matches!(text, Cow::Owned(_)))
    }
    fn copy(&mut self, n: usize, out: &mut Vec<u8>) -> Result<(), Unjudged> {
        out.extend_from_slice(self.take(n)?);
        Ok(())
    }
    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// One field of a method's arguments or of the Basic properties.
#[derive(Clone, Copy)]
enum Field {
    /// A short string (length octet and bytes): made UTF-8.
    Short,
    /// A field table (long length and content): the `headers` property.
    Table,
    /// So many octets, copied.
    Octets(usize),
}

/// The arguments of the methods that carry short strings the broker takes from publishers.
fn method_fields(class: u16, method: u16) -> Option<&'static [Field]> {
    use Field::*;
    match (class, method) {
        // Basic.Deliver: consumer tag, delivery tag, redelivered, exchange, routing key.
        (60, 60) => Some(&[Short, Octets(9), Short, Short]),
        // Basic.GetOk: delivery tag, redelivered, exchange, routing key, message count.
        (60, 71) => Some(&[Octets(9), Short, Short, Octets(4)]),
        // Basic.Return: reply code, reply text, exchange, routing key.
        (60, 50) => Some(&[Octets(2), Short, Short, Short]),
        _ => None,
    }
}

/// A method frame's payload with its short strings made UTF-8: `None` when nothing changed.
pub(crate) fn method(payload: &[u8]) -> Result<Option<Vec<u8>>, Unjudged> {
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let (class, method) = (r.u16()?, r.u16()?);
    let Some(fields) = method_fields(class, method) else {
        return Ok(None);
    };
    let mut out = payload[..4].to_vec();
    let mut changed = false;
    for f in fields {
        match *f {
            Field::Short => changed |= r.short_string(&mut out)?,
            Field::Octets(n) => r.copy(n, &mut out)?,
            Field::Table => return Err("a table in a method the guard reads"),
        }
    }
    if !r.done() {
        return Err("bytes after the method's arguments");
    }
    Ok(changed.then_some(out))
}

/// `Connection.Tune` (server) or `Connection.TuneOk` (client): its frame_max.
pub(crate) fn tune_frame_max(payload: &[u8], method: u16) -> Option<u32> {
    (payload.len() == 12 && payload[..4] == [0, 10, 0, method as u8])
        .then(|| u32::from_be_bytes([payload[6], payload[7], payload[8], payload[9]]))
}

/// The same `Connection.Tune` / `TuneOk` payload with another frame_max.
pub(crate) fn with_frame_max(payload: &[u8], frame_max: u32) -> Vec<u8> {
    let mut out = payload.to_vec();
    out[6..10].copy_from_slice(&frame_max.to_be_bytes());
    out
}

/// The Basic properties in flag order (bit 15 first).
const PROPERTIES: [Field; 14] = [
    Field::Short,     // content_type
    Field::Short,     // content_encoding
    Field::Table,     // headers
    Field::Octets(1), // delivery_mode
    Field::Octets(1), // priority
    Field::Short,     // correlation_id
    Field::Short,     // reply_to
    Field::Short,     // expiration
    Field::Short,     // message_id
    Field::Octets(8), // timestamp
    Field::Short,     // type
    Field::Short,     // user_id
    Field::Short,     // app_id
    Field::Short,     // cluster_id
];

/// A content header frame's payload with its headers and short strings made readable
/// (headers past `max_depth` levels, the table being level 1, taken out): `None` when nothing
/// changed.
pub(crate) fn content_header(
    payload: &[u8],
    max_depth: usize,
) -> Result<Option<Vec<u8>>, Unjudged> {
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    // Class, weight, body size, flags (one word: lapin reads no continuation).
    r.take(14)?;
    let flags = u16::from_be_bytes([payload[12], payload[13]]);
    let mut out = payload[..14].to_vec();
    let mut changed = false;
    for (bit, kind) in PROPERTIES.iter().enumerate() {
        if flags & (1 << (15 - bit)) == 0 {
            continue;
        }
        match *kind {
            Field::Short => changed |= r.short_string(&mut out)?,
            Field::Table => {
                let len = r.u32()? as usize;
                let table = r.take(len)?;
                match headers(table, max_depth) {
                    None => {
                        out.extend_from_slice(&(len as u32).to_be_bytes());
                        out.extend_from_slice(table);
                    }
                    Some(new) => {
                        out.extend_from_slice(&(new.len() as u32).to_be_bytes());
                        out.extend_from_slice(&new);
                        changed = true;
                    }
                }
            }
            Field::Octets(n) => r.copy(n, &mut out)?,
        }
    }
    if !r.done() {
        return Err("bytes after the properties");
    }
    Ok(changed.then_some(out))
}

/// What scanning one field value found.
struct Scanned {
    /// Where the value ends.
    end: usize,
    /// How many tables or arrays deep it nests (0 for a scalar).
    depth: usize,
    /// A table inside it has a name that is not UTF-8.
    bad_name: bool,
}

/// The bytes a scalar of field type `t` takes (`None`: a length-prefixed or unknown type).
fn scalar_size(t: u8) -> Option<usize> {
    Some(match t {
        b't' | b'b' | b'B' => 1,
        b's' | b'U' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'L' | b'l' | b'd' | b'T' => 8,
        b'D' => 5,
        b'V' => 0,
        _ => return None,
    })
}

/// Scans the value of field type `t` starting at `at` in `buf`, iteratively.
fn scan_value(buf: &[u8], mut at: usize, t: u8) -> Result<Scanned, Unjudged> {
    // Each open table or array: where it ends, and whether it is a table (names before values).
    let mut open: Vec<(usize, bool)> = Vec::new();
    let mut depth = 0;
    let mut bad_name = false;
    let mut next = Some(t);
    loop {
        let limit = open.last().map_or(buf.len(), |o| o.0);
        if let Some(t) = next.take() {
            let len_at = |at: usize| -> Result<usize, Unjudged> {
                let b = buf
                    .get(at..at + 4)
                    .filter(|_| at + 4 <= limit)
                    .ok_or("a length past its table")?;
                Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            };
            match t {
                b'S' | b'x' => {
                    at = at + 4 + len_at(at)?;
                    if at > limit {
                        return Err("a length past its table");
                    }
                }
                b'F' | b'A' => {
                    let end = at + 4 + len_at(at)?;
                    if end > limit {
                        return Err("a length past its table");
                    }
                    open.push((end, t == b'F'));
                    depth = depth.max(open.len());
                    at += 4;
                }
                t => {
                    at += scalar_size(t).ok_or("an unknown field type")?;
                    if at > limit {
                        return Err("a value past its table");
                    }
                }
            }
        }
        // The next value inside the innermost open table or array, closing finished ones.
        loop {
            let Some(&(end, table)) = open.last() else {
                return Ok(Scanned {
                    end: at,
                    depth,
                    bad_name,
                });
            };
            if at == end {
                open.pop();
                continue;
            }
            if table {
                let len = usize::from(buf[at]);
                let name = buf.get(at + 1..at + 1 + len).filter(|_| at + 1 + len < end);
                let name = name.ok_or("a name past its table")?;
                bad_name |= std::str::from_utf8(name).is_err();
                at += 1 + len;
            }
            next = Some(buf[at]);
            at += 1;
            break;
        }
    }
}

/// A `headers` table's content rewritten when a header nests past `max_depth` levels (the
/// table being level 1) or cannot be read: `None` when it is fine as it is.
pub(crate) fn headers(table: &[u8], max_depth: usize) -> Option<Vec<u8>> {
    let mut kept = Vec::new();
    let mut too_deep = Vec::new();
    let mut unreadable = Vec::new();
    let mut at = 0;
    while at < table.len() {
        let entry = at;
        let len = usize::from(table[at]);
        let Some(name) = table
            .get(at + 1..at + 1 + len)
            .filter(|_| at + 1 + len < table.len())
        else {
            return Some(marked(
                Vec::new(),
                &[],
                &["the headers table (a name past its end)".into()],
            ));
        };
        at += 1 + len;
        let t = table[at];
        let scanned = match scan_value(table, at + 1, t) {
            Ok(s) => s,
            Err(why) => {
                return Some(marked(
                    Vec::new(),
                    &[],
                    &[format!("the headers table ({why})")],
                ));
            }
        };
        at = scanned.end;
        let shown = String::from_utf8_lossy(name);
        if std::str::from_utf8(name).is_err() {
            unreadable.push(format!("{shown:?} (a name that is not UTF-8)"));
        } else if 1 + scanned.depth > max_depth {
            too_deep.push(format!("{shown:?} ({} levels)", 1 + scanned.depth));
        } else if scanned.bad_name {
            unreadable.push(format!("{shown:?} (a name inside it that is not UTF-8)"));
        } else {
            kept.extend_from_slice(&table[entry..at]);
        }
    }
    if too_deep.is_empty() && unreadable.is_empty() {
        return None;
    }
    Some(marked(kept, &too_deep, &unreadable))
}

/// `kept` plus the two marker headers (those with something to say).
fn marked(mut kept: Vec<u8>, too_deep: &[String], unreadable: &[String]) -> Vec<u8> {
    for (name, list) in [(TOO_DEEP_HEADER, too_deep), (UNREADABLE_HEADER, unreadable)] {
        if list.is_empty() {
            continue;
        }
        let mut note = list.join(", ");
        if note.len() > MAX_NOTE_BYTES {
            let mut end = MAX_NOTE_BYTES;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
            note.push_str(", ...");
        }
        kept.push(name.len() as u8);
        kept.extend_from_slice(name.as_bytes());
        kept.push(b'S');
        kept.extend_from_slice(&(note.len() as u32).to_be_bytes());
        kept.extend_from_slice(note.as_bytes());
    }
    kept
}

/// A whole frame (type, channel, size, payload, end octet) with `payload` in place of its own.
pub(crate) fn frame_with(frame: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + FRAME_OVERHEAD);
    out.extend_from_slice(&frame[..3]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
    out
}

/// A broker's frame as the client should see it: `None` to pass it on unchanged.
pub(crate) fn from_broker(frame: &[u8], max_depth: usize) -> Option<Vec<u8>> {
    let payload = &frame[7..frame.len() - 1];
    let rewritten = match frame[0] {
        FRAME_METHOD => method(payload),
        FRAME_HEADER => content_header(payload, max_depth),
        _ => Ok(None),
    };
    rewritten.ok().flatten().map(|p| frame_with(frame, &p))
}

/// The frame_max the guard advertises to the client for the broker's: larger by the growth a
/// rewrite may add (so a frame of exactly the broker's size, rewritten, is still taken); 0
/// (no limit) stays 0.
pub(crate) fn advertised_frame_max(broker: u32) -> u32 {
    if broker == 0 {
        0
    } else {
        broker.saturating_add(GROWTH_ALLOWANCE)
    }
}

/// The frame_max the guard tells the broker when the client answered `client` to
/// [`advertised_frame_max`]: the broker's own, or smaller when the client asked for less (by
/// the growth allowance, so rewritten frames still fit the client's).
pub(crate) fn frame_max_for_broker(broker: u32, client: u32) -> u32 {
    const FRAME_MIN: u32 = 4096;
    if client == 0 {
        return broker;
    }
    let fits_client = client.saturating_sub(GROWTH_ALLOWANCE).max(FRAME_MIN);
    if broker == 0 {
        fits_client
    } else {
        broker.min(fits_client)
    }
}

/// A body frame split into frames whose payload is at most `frame_max - 8` bytes (the limit
/// lapin itself cuts bodies at): the client was told a larger frame_max than the broker's.
pub(crate) fn split_body(frame: &[u8], frame_max: u32, out: &mut Vec<u8>) {
    let payload = &frame[7..frame.len() - 1];
    let chunk = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    if frame_max == 0 || payload.len() <= chunk {
        out.extend_from_slice(frame);
        return;
    }
    for part in payload.chunks(chunk) {
        out.extend_from_slice(&frame_with(frame, part));
    }
}
