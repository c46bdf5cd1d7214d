//! Tabular output, one renderer for every listing (`claims list`, `reconcile`, `report`):
//! aligned columns for people, CSV for spreadsheets and scripts. Every CSV cell goes through
//! [`csv_field`], so no command can forget the spreadsheet-injection rule.

use std::fmt::Write as _;

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

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len(), "one cell per column");
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

/// One CSV cell, safe to open in a spreadsheet (the OWASP CSV-injection rule): a cell that
/// begins with `=`, `+`, `-`, `@`, tab or carriage return would be run as a formula, so it is
/// prefixed with a single quote and quoted; a cell with a comma, quote or line break is quoted,
/// inner quotes doubled.
pub fn csv_field(s: &str) -> String {
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
            ("\t=1", "\"'\t=1\""),
            ("\r=1", "\"'\r=1\""),
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
}
