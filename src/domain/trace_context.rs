//! W3C Trace Context (`traceparent`): the producer's trace a message joins. A header that does
//! not parse is ignored, as the recommendation says: the message starts a trace of its own.
//! A telemetry header never refuses a message.

/// The header's name, in HTTP, AMQP and NATS headers alike.
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent`: version 00's fields, as lowercase hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, not all zero: the producer's span, which becomes the intake span's parent.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Reads a header's bytes: `00-<32 hex>-<16 hex>-<2 hex>` (a later version is read by its
    /// first four fields, as the recommendation asks). `None` for anything else.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let text = std::str::from_utf8(value).ok()?.trim();
        let mut parts = text.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 has exactly four fields; a later one may have more.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        if ![trace, span, flags].iter().all(|p| is_lower_hex(p)) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(span, &mut span_id).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id, as tracing backends show and search it (32 lowercase hex digits).
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The header's text, version 00.
    pub fn to_header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_the_recommendations_example_and_writes_it_back() {
        let tp = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(hex::encode(tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(tp.span_id), "00f067aa0ba902b7");
        assert_eq!(tp.flags, 1);
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.to_header(), GOOD);
    }

    #[test]
    fn ignores_what_does_not_parse() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(TraceParent::parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn reads_a_later_version_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        let tp = TraceParent::parse(later.as_bytes()).unwrap();
        assert_eq!(tp.to_header(), GOOD);
    }
}
