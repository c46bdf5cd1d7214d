//! The log's writer: every line claimd writes on stderr passes through
//! [`mask_line`](crate::domain::redaction::mask_line) first, so a card number or an e-mail
//! address a provider's answer or an error quoted never reaches the log.

use crate::domain::redaction::mask_line;
use std::io::{self, Write};

/// A writer that masks what it is given before passing it on (the log formatter writes one
/// whole line per call).
pub(super) struct MaskedWriter<W>(pub W);

impl<W: Write> Write for MaskedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let masked = mask_line(&String::from_utf8_lossy(buf));
        self.0.write_all(masked.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The log's stderr, masked.
pub(super) fn masked_stderr() -> MaskedWriter<io::Stderr> {
    MaskedWriter(io::stderr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn log_lines_carry_no_card_number_nor_address() {
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || MaskedWriter(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                error = "provider said: card 4242424242424242 of ann@example.test declined",
                "settle failed"
            );
        });
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(out.contains("settle failed"), "{out}");
        assert!(out.contains("••••4242"), "{out}");
        assert!(!out.contains("4242424242424242"), "{out}");
        assert!(!out.contains("ann@example.test"), "{out}");
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["level"], "WARN", "still one JSON line");
    }
}
