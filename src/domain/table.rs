//! Tabular output, one renderer for every listing (`claims list`, `reconcile`, `report`):
//! aligned columns for people, CSV for spreadsheets and scripts. Every CSV cell goes through
//! [`csv_field`], so no command can forget the spreadsheet-injection rule, and every cell, text
//! or CSV, through [`escape_controls`], so text from clients and providers cannot drive the
//! terminal it is shown on.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` would do something on a terminal or page instead of showing: a C0 control
/// (line breaks, tab, ESC), DEL, a C1 control (U+0080–U+009F: `CSI`, `OSC` on some
/// terminals), a Unicode bidi control (U+061C, U+200E/U+200F, U+202A–U+202E, U+2066–U+2069,
/// which reorder the text after them) or a line or paragraph separator (U+2028/U+2029).
pub fn is_control(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// `s` with every [`is_control`] character written out visibly: `\n`, `\r`, `\t`, and
/// `\uXXXX` for the others (ESC is `\u001b`, RIGHT-TO-LEFT OVERRIDE `\u202e`). These are JSON's
/// own escapes, so the same function makes JSON text safe without changing what it parses to.
/// Everything claimd prints goes through it: table cells, `claims show` lines, messages that
/// echo input, and (with line breaks kept) whole outputs ([`escape_controls_keep_lines`]).
/// Backslashes are kept as they are: the result is for reading, not for parsing back.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// Like [`escape_controls`], keeping `\n` as a line break: for whole outputs made of lines
/// whose values were escaped already.
pub fn escape_controls_keep_lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_lines: bool) -> Cow<'_, str> {
    let hit = |c: char| is_control(c) && !(keep_lines && c == '\n');
    if !s.chars().any(hit) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !hit(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// A header and its rows, rendered as text ([`Table::text`]) or CSV ([`Table::csv`]).
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column). Each cell is kept with its controls escaped
    /// ([`escape_controls`]): a line break, carriage return or escape sequence in a provider's
    /// answer cannot forge rows, erase lines or retitle the terminal.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len(), "one cell per column");
        let cells = cells
            .into_iter()
            .map(|c| match escape_controls(&c) {
                Cow::Borrowed(_) => c,
                Cow::Owned(escaped) => escaped,
            })
            .collect();
        self.rows.push(cells);
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The header and rows, columns padded to their widest cell (the last one is not padded).
    pub fn text(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for cells in std::iter::once(&self.header).chain(&self.rows) {
            let n = cells.len();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == n {
                    out.push_str(cell);
                } else {
                    let _ = write!(out, "{:<w$}  ", cell, w = widths[i]);
                }
            }
            out.push('\n');
        }
        out
    }

    /// The header and rows as CSV (RFC 4180), every cell through [`csv_field`].
    pub fn csv(&self) -> String {
        let mut out = String::new();
        for cells in std::iter::once(&self.header).chain(&self.rows) {
            let line: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
            out.push_str(&line.join(","));
            out.push('\n');
        }
        out
    }
}

/// One CSV cell, safe to open in a spreadsheet and to print: controls are escaped first
/// ([`escape_controls`]: a CSV read with `cat` must not drive the terminal either), then the
/// OWASP CSV-injection rule: a cell that begins with `=`, `+`, `-`, `@`, tab or carriage return
/// would be run as a formula, so it is prefixed with a single quote and quoted; a cell with a
/// comma, quote or line break is quoted, inner quotes doubled.
pub fn csv_field(s: &str) -> String {
    let s = escape_controls(s);
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("\"'{}\"", s.replace('"', "\"\""))
    } else if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(header: &[&str], rows: &[Vec<String>]) -> Table {
        let mut t = Table::new(header);
        for r in rows {
            t.row(r.clone());
        }
        t
    }

    #[test]
    fn tables_align_and_csv_quotes() {
        let t = table(&["a", "bb"], &[vec!["xxx".into(), "y".into()]]).text();
        assert_eq!(t, "a    bb\nxxx  y\n");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        let csv = table(&["id", "n"], &[vec!["a,b".into(), "1".into()]]).csv();
        assert_eq!(csv, "id,n\n\"a,b\",1\n");
    }

    #[test]
    fn csv_cells_that_a_spreadsheet_would_run_are_neutralised() {
        for (cell, want) in [
            ("=1+1", "\"'=1+1\""),
            ("+SUM(A1)", "\"'+SUM(A1)\""),
            ("-2+3", "\"'-2+3\""),
            ("@SUM(1)", "\"'@SUM(1)\""),
            // A tab or carriage return is escaped first, so it neither runs nor reaches a
            // terminal that prints the file.
            ("\t=1", "\\t=1"),
            ("\r=1", "\\r=1"),
            (
                "=HYPERLINK(\"http://x\",\"y\")",
                "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\"",
            ),
        ] {
            assert_eq!(csv_field(cell), want, "{cell:?}");
        }
        assert_eq!(
            csv_field("order-1=2"),
            "order-1=2",
            "only the first character matters"
        );
    }

    /// Every control a terminal acts on is shown instead: ESC (colours, OSC 0 title, OSC 8
    /// link, OSC 52 clipboard), CR/LF, cursor-up and erase-line, C1 CSI, DEL, bidi overrides.
    #[test]
    fn controls_are_written_out_visibly() {
        for (raw, want) in [
            ("\x1b[31mred\x1b[0m", "\\u001b[31mred\\u001b[0m"),
            ("\x1b]0;owned\x07", "\\u001b]0;owned\\u0007"),
            (
                "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\",
                "\\u001b]8;;http://evil.example\\u001b\\click\\u001b]8;;\\u001b\\",
            ),
            (
                "\x1b]52;c;cm0gLXJmIH4=\x07",
                "\\u001b]52;c;cm0gLXJmIH4=\\u0007",
            ),
            ("ok\r\nforged row", "ok\\r\\nforged row"),
            ("\x1b[1A\x1b[2K", "\\u001b[1A\\u001b[2K"),
            ("a\tb\u{7f}\u{9b}31m", "a\\tb\\u007f\\u009b31m"),
            ("abc\u{202e}fed\u{202c}", "abc\\u202efed\\u202c"),
            (
                "\u{2066}\u{2069}\u{200e}\u{200f}\u{61c}\u{2028}",
                "\\u2066\\u2069\\u200e\\u200f\\u061c\\u2028",
            ),
            ("plain text, é ü 日本", "plain text, é ü 日本"),
        ] {
            assert_eq!(escape_controls(raw), want, "{raw:?}");
        }
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls_keep_lines("a\n\x1b[2Kb\r\n"),
            "a\n\\u001b[2Kb\\r\n"
        );
        // The escapes are JSON's: escaping JSON text keeps it parsing to the same value.
        let json =
            serde_json::to_string(&serde_json::json!({"a": "x\u{202e}y\u{9b}\u{7f}"})).unwrap();
        let escaped = escape_controls_keep_lines(&json);
        assert!(!escaped.chars().any(is_control), "{escaped}");
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back["a"], "x\u{202e}y\u{9b}\u{7f}");
    }

    #[test]
    fn table_cells_cannot_forge_rows_and_csv_cells_are_escaped_too() {
        let mut t = Table::new(&["id", "last_error"]);
        t.row(vec!["a".into(), "boom\n b  fake-row\x1b[1A\x1b[2K".into()]);
        let text = t.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            !text.chars().any(|c| c != '\n' && is_control(c)),
            "{text:?}"
        );
        let csv = t.csv();
        assert_eq!(csv.lines().count(), 2, "{csv}");
        assert!(!csv.chars().any(|c| c != '\n' && is_control(c)), "{csv:?}");
        assert_eq!(
            csv_field("=1\x1b[2K"),
            "\"'=1\\u001b[2K\"",
            "the formula guard stays"
        );
    }
}
