//! What the NATS broker guard rewrites in the server's line protocol, as pure functions over
//! bytes (no I/O).
//!
//! async-nats closes its connection on an `HMSG` whose header section is not UTF-8, has a
//! line without a colon, a name with characters a name cannot have, or no `NATS/1.0` line,
//! and on a `MSG` or `HMSG` line that is not UTF-8; JetStream then redelivers the message
//! after every reconnect, for ever. Through the guard the client gets a header section it can
//! read: the readable lines as they were, plus [`UNREADABLE_HEADERS`] saying what could not be
//! read, with the byte counts fixed; a subject (or reply subject) that is not UTF-8 arrives
//! with U+FFFD. `INFO` loses `connect_urls`, so the client does not go round the guard to
//! another server of the cluster, and `tls_required` (the guard speaks TLS to the server).

use std::borrow::Cow;

/// The header the broker guard adds to a message whose header section it could not read in
/// full, saying what it could not read; the readable headers are kept.
pub const UNREADABLE_HEADERS: &str = "Nats-Unreadable-Headers";

/// The largest control line (`INFO` included) or message the guard holds to judge; past it,
/// the rest of the connection is passed on as it is (the server's `max_payload` is below).
const MAX_JUDGED: usize = 64 * 1024 * 1024;

/// Splits the server's byte stream into operations and rewrites those the client could not
/// read; once something the guard cannot parse passes, the rest goes on as it is.
#[derive(Debug, Default)]
pub(crate) struct ServerLines {
    raw: bool,
}

impl ServerLines {
    /// Moves the complete operations of `input` to `output`, rewritten where needed.
    pub(crate) fn feed(&mut self, input: &mut bytes::BytesMut, output: &mut Vec<u8>) {
        while !self.raw {
            let Some(eol) = input.windows(2).position(|w| w == b"\r\n") else {
                if input.len() > MAX_JUDGED {
                    self.raw = true;
                }
                break;
            };
            let line = &input[..eol];
            let op = line
                .split(|b| *b == b' ' || *b == b'\t')
                .next()
                .unwrap_or_default();
            let rewritten = if op.eq_ignore_ascii_case(b"MSG") || op.eq_ignore_ascii_case(b"HMSG") {
                let Some(msg) = Message::parse(line, op.len() == 4) else {
                    self.raw = true;
                    break;
                };
                let whole = eol + 2 + msg.total + 2;
                if msg.total > MAX_JUDGED {
                    self.raw = true;
                    break;
                }
                if input.len() < whole {
                    break;
                }
                let body = &input[eol + 2..eol + 2 + msg.total];
                msg.rewrite(line, body, output);
                output.extend_from_slice(b"\r\n");
                let _ = input.split_to(whole);
                continue;
            } else if op.eq_ignore_ascii_case(b"INFO") {
                info(line)
            } else {
                None
            };
            match rewritten {
                Some(new) => output.extend_from_slice(&new),
                None => output.extend_from_slice(line),
            }
            output.extend_from_slice(b"\r\n");
            let _ = input.split_to(eol + 2);
        }
        if self.raw {
            output.extend_from_slice(input);
            input.clear();
        }
    }
}

/// A `MSG` or `HMSG` control line, parsed.
struct Message {
    /// Header bytes (`HMSG` only).
    headers: Option<usize>,
    /// Bytes after the line (headers and payload), before the closing CRLF.
    total: usize,
}

impl Message {
    /// `MSG <subject> <sid> [reply-to] <#bytes>` or `HMSG <subject> <sid> [reply-to]
    /// <#header bytes> <#total bytes>`; `None` when the counts cannot be read.
    fn parse(line: &[u8], headers: bool) -> Option<Message> {
        let args: Vec<&[u8]> = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|a| !a.is_empty())
            .collect();
        let number = |a: &[u8]| std::str::from_utf8(a).ok()?.parse::<usize>().ok();
        if headers {
            if !(5..=6).contains(&args.len()) {
                return None;
            }
            let (h, total) = (number(args[args.len() - 2])?, number(args[args.len() - 1])?);
            (h <= total).then_some(Message {
                headers: Some(h),
                total,
            })
        } else {
            if !(4..=5).contains(&args.len()) {
                return None;
            }
            Some(Message {
                headers: None,
                total: number(args[args.len() - 1])?,
            })
        }
    }

    /// Writes the message (line, CRLF, headers, payload) as the client can read it.
    fn rewrite(&self, line: &[u8], body: &[u8], output: &mut Vec<u8>) {
        let (section, payload) = body.split_at(self.headers.unwrap_or(0));
        let readable = self.headers.and_then(|_| readable_headers(section));
        let text = String::from_utf8_lossy(line);
        if readable.is_none() && matches!(text, Cow::Borrowed(_)) {
            output.extend_from_slice(line);
            output.extend_from_slice(b"\r\n");
            output.extend_from_slice(body);
            return;
        }
        let section = readable.as_deref().unwrap_or(section);
        let mut args: Vec<&str> = text.split_ascii_whitespace().collect();
        let counts = if self.headers.is_some() { 2 } else { 1 };
        args.truncate(args.len() - counts);
        let mut new = args.join(" ");
        if self.headers.is_some() {
            new.push_str(&format!(" {}", section.len()));
        }
        new.push_str(&format!(" {}\r\n", section.len() + payload.len()));
        output.extend_from_slice(new.as_bytes());
        output.extend_from_slice(section);
        output.extend_from_slice(payload);
    }
}

/// Whether `s` is a status code as the client reads one: three digits, the first not 0.
fn is_status(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 3 && (b'1'..=b'9').contains(&b[0]) && b[1..].iter().all(u8::is_ascii_digit)
}

/// Whether `name` is a header name as the client reads one.
fn is_name(name: &str) -> bool {
    !name.contains(|c: char| !c.is_ascii_graphic() || c == ':')
}

/// A header section the client can read, in place of one it cannot: `None` when it can read
/// this one. Read as the client reads it (lines, the `NATS/1.0` line with an optional status,
/// `Name: value` lines with continuations), keeping what it can and naming what it cannot in
/// [`UNREADABLE_HEADERS`].
pub(crate) fn readable_headers(section: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(section);
    let mut unreadable: Vec<&'static str> = Vec::new();
    if matches!(text, Cow::Owned(_)) {
        unreadable.push("bytes that are not UTF-8");
    }
    let mut lines = text.lines().peekable();
    let first = lines.next().unwrap_or("");
    let version = match first.strip_prefix("NATS/1.0") {
        Some(suffix) => {
            let suffix = suffix.trim();
            let status = suffix.split_once(' ').map_or(suffix, |(s, _)| s.trim());
            if status.is_empty() || is_status(status) {
                first
            } else {
                unreadable.push("a status that is not a status code");
                "NATS/1.0"
            }
        }
        None => {
            unreadable.push("no NATS/1.0 version line");
            "NATS/1.0"
        }
    };
    let mut kept: Vec<&str> = Vec::new();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            unreadable.push("a line without a colon");
            continue;
        };
        if !is_name(name) {
            unreadable.push("a name with characters a header name cannot have");
            continue;
        }
        kept.push(line);
        while let Some(more) = lines.next_if(|s| s.starts_with(char::is_whitespace)) {
            kept.push(more);
        }
    }
    if unreadable.is_empty() {
        return None;
    }
    unreadable.dedup();
    let mut out = format!("{version}\r\n");
    for line in kept {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "{UNREADABLE_HEADERS}: {}\r\n\r\n",
        unreadable.join("; ")
    ));
    Some(out.into_bytes())
}

/// An `INFO` line without `connect_urls` (and `ws_connect_urls`) and with `tls_required`
/// false: `None` when there is nothing to change or it is not JSON (the client decides).
pub(crate) fn info(line: &[u8]) -> Option<Vec<u8>> {
    let json = line.get(5..)?;
    let mut info: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(json).ok()?;
    let mut changed = info.remove("connect_urls").is_some();
    changed |= info.remove("ws_connect_urls").is_some();
    if info.get("tls_required") == Some(&serde_json::Value::Bool(true)) {
        info.insert("tls_required".into(), serde_json::Value::Bool(false));
        changed = true;
    }
    changed.then(|| format!("INFO {}", serde_json::Value::Object(info)).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[u8]) -> Vec<u8> {
        let mut lines = ServerLines::default();
        let mut out = Vec::new();
        // Byte by byte: every split point of the stream.
        let mut buf = bytes::BytesMut::new();
        for b in input {
            buf.extend_from_slice(&[*b]);
            lines.feed(&mut buf, &mut out);
        }
        assert!(buf.is_empty(), "left: {buf:?}");
        out
    }

    #[test]
    fn readable_operations_pass_unchanged() {
        let stream = b"INFO {\"server_id\":\"x\",\"headers\":true}\r\nPING\r\n+OK\r\nMSG a.b 1 5\r\nhello\r\nHMSG a.b 2 _INBOX.x 23 28\r\nNATS/1.0\r\nA: b\r\n  c\r\n\r\nhello\r\nHMSG s 3 31 31\r\nNATS/1.0 100 Idle Heartbeat\r\n\r\n\r\n-ERR 'x'\r\n";
        let stream = &stream[..];
        assert_eq!(run(stream), stream);
    }

    #[test]
    fn unreadable_header_sections_become_readable_with_what_was_wrong() {
        let cases: [(&[u8], &str); 5] = [
            (
                b"NATS/1.0\r\nNats-Msg-Id: id-\xff\r\n\r\n",
                "NATS/1.0\r\nNats-Msg-Id: id-\u{FFFD}\r\nNats-Unreadable-Headers: bytes that are not UTF-8\r\n\r\n",
            ),
            (
                b"NATS/1.0\r\n\xff\xfe: v\r\nOk: 1\r\n\r\n",
                "NATS/1.0\r\nOk: 1\r\nNats-Unreadable-Headers: bytes that are not UTF-8; a name with characters a header name cannot have\r\n\r\n",
            ),
            (
                b"NATS/1.0\r\nno colon here\r\n\r\n",
                "NATS/1.0\r\nNats-Unreadable-Headers: a line without a colon\r\n\r\n",
            ),
            (
                b"NATS/1.0\r\nBad Name: v\r\n\r\n",
                "NATS/1.0\r\nNats-Unreadable-Headers: a name with characters a header name cannot have\r\n\r\n",
            ),
            (
                b"HTTP/1.1 200\r\nA: b\r\n\r\n",
                "NATS/1.0\r\nA: b\r\nNats-Unreadable-Headers: no NATS/1.0 version line\r\n\r\n",
            ),
        ];
        for (section, want) in cases {
            let got = readable_headers(section).expect("rewritten");
            assert_eq!(String::from_utf8(got).unwrap(), want);
        }
        assert_eq!(readable_headers(b"NATS/1.0 404 No Messages\r\n\r\n"), None);
        assert!(readable_headers(b"NATS/1.0 4x4\r\n\r\n").is_some());
    }

    #[test]
    fn messages_get_their_counts_fixed_and_subjects_made_utf8() {
        let mut stream =
            b"HMSG a.b 7 r.\xff 22 24\r\nNATS/1.0\r\nno colon\r\n\r\nhi\r\nPING\r\n".to_vec();
        stream.extend_from_slice(b"MSG s\xff 1 2\r\nhi\r\n");
        let out = run(&stream);
        let want = "HMSG a.b 7 r.\u{FFFD} 61 63\r\nNATS/1.0\r\nNats-Unreadable-Headers: a line without a colon\r\n\r\nhi\r\nPING\r\nMSG s\u{FFFD} 1 2\r\nhi\r\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn info_loses_the_other_servers_and_the_tls_requirement() {
        let line = br#"INFO {"connect_urls":["10.0.0.2:4222"],"headers":true,"tls_required":true}"#;
        let new: serde_json::Value = serde_json::from_slice(&info(line).unwrap()[5..]).unwrap();
        assert_eq!(
            new,
            serde_json::json!({"headers": true, "tls_required": false})
        );
        assert_eq!(info(br#"INFO {"headers":true}"#), None);
        assert_eq!(info(b"INFO not json"), None);
    }

    #[test]
    fn what_cannot_be_parsed_passes_on_as_it_is() {
        let stream = b"MSG a b c d e f\r\nanything\r\nPING\r\n";
        assert_eq!(run(stream), stream);
    }
}
