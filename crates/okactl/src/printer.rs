//! Everything okactl prints goes through a [`Printer`]: results to stdout, warnings and
//! errors to stderr, and kubectl's table layout ([`tabulate`]).

use std::io::Write as _;

/// Where output goes. Passed to every command, so none writes to a stream directly.
#[derive(Debug, Default)]
pub struct Printer;

impl Printer {
    /// One line of a command's result (stdout). A closed stdout (`okactl get | head`) is
    /// not an error worth reporting.
    pub fn line(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// Text as it is (stdout), for YAML and JSON documents that end in their own newline.
    pub fn text(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    /// `Warning: <text>` on stderr.
    pub fn warn(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "Warning: {text}");
    }

    /// `Error: <text>` on stderr: how every failure is reported (exit code 1 follows).
    pub fn error(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "Error: {text}");
    }

    /// A notice on stderr that is not a failure (`No resources found in default namespace.`).
    pub fn notice(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
}

/// Column widths for `rows`: the widest cell of each column, in characters.
pub fn widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let width = cell.chars().count();
            match widths.get_mut(i) {
                Some(w) if *w < width => *w = width,
                Some(_) => {}
                None => widths.push(width),
            }
        }
    }
    widths
}

/// `row` laid out as kubectl lays out tables (Go's tabwriter with padding 3): each cell but
/// the last padded to its column's width plus three spaces; the last cell as it is.
pub fn layout(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        line.push_str(cell);
        if i + 1 < row.len() {
            let width = widths.get(i).copied().unwrap_or(0).max(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 3));
        }
    }
    line
}

/// `rows` as kubectl's table: one line each, columns aligned.
pub fn tabulate(rows: &[Vec<String>]) -> Vec<String> {
    let widths = widths(rows);
    rows.iter().map(|row| layout(row, &widths)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_as_kubectl_prints_them() {
        let rows: Vec<Vec<String>> = [["NAME", "REPLICAS", "AGE"], ["base", "2", "5s"]]
            .iter()
            .map(|r| r.iter().map(|c| (*c).to_owned()).collect())
            .collect();
        assert_eq!(tabulate(&rows), ["NAME   REPLICAS   AGE", "base   2          5s"]);
    }
}
