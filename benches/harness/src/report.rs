//! The report: Markdown text built line by line, printed and written to a file at the end, and
//! Markdown tables. Number formatting helpers show values as the report's tables do.

use std::fmt::Write as _;
use std::path::Path;

/// A column's alignment (`---` or `---:` in the rule under the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A Markdown table. An empty cell renders as `| |`.
#[derive(Clone, Debug)]
pub struct Table {
    header: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Table {
        let (header, aligns) = columns.into_iter().map(|(h, a)| (h.into(), a)).unzip();
        Table { header, aligns, rows: Vec::new() }
    }

    /// Adds a row; missing cells at the end are left empty, extra cells are kept.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Table {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    pub fn lines(&self) -> Vec<String> {
        let rule: String = self.aligns.iter().map(|a| if *a == Align::Right { "---:|" } else { "---|" }).collect();
        let mut lines = vec![render_row(&self.header), format!("|{rule}")];
        for cells in &self.rows {
            let mut cells = cells.clone();
            cells.resize(cells.len().max(self.header.len()), String::new());
            lines.push(render_row(&cells));
        }
        lines
    }
}

fn render_row(cells: &[String]) -> String {
    let mut s = String::from("|");
    for c in cells {
        if c.is_empty() {
            s.push_str(" |");
        } else {
            let _ = write!(s, " {c} |");
        }
    }
    s
}

/// Markdown text, one line at a time.
#[derive(Clone, Debug, Default)]
pub struct Report {
    text: String,
}

impl Report {
    pub fn new() -> Report {
        Report::default()
    }

    pub fn line(&mut self, line: impl AsRef<str>) -> &mut Report {
        self.text.push_str(line.as_ref());
        self.text.push('\n');
        self
    }

    pub fn blank(&mut self) -> &mut Report {
        self.line("")
    }

    /// A blank line, then `### title`, then a blank line: a section of the report.
    pub fn section(&mut self, title: impl AsRef<str>) -> &mut Report {
        self.blank().line(format!("### {}", title.as_ref())).blank()
    }

    pub fn table(&mut self, table: &Table) -> &mut Report {
        for l in table.lines() {
            self.line(l);
        }
        self
    }

    pub fn append(&mut self, other: &Report) -> &mut Report {
        self.text.push_str(&other.text);
        self
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Writes the text to `path`, creating its folder.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, &self.text)
    }
}

/// `x` with `decimals` places.
pub fn fixed(x: f64, decimals: usize) -> String {
    format!("{x:.decimals$}")
}

/// `x` with `decimals` places, or `n/a`.
pub fn fixed_or_na(x: Option<f64>, decimals: usize) -> String {
    x.map_or_else(|| "n/a".to_string(), |x| fixed(x, decimals))
}

/// A share as a percentage with one place (`12.5%`); `den` zero counts as one.
pub fn percent(num: u64, den: u64) -> String {
    format!("{:.1}%", 100.0 * num as f64 / den.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_rule_from_alignments_and_empty_cells_as_one_space() {
        let mut t = Table::new([("a", Align::Left), ("b", Align::Right), ("c", Align::Right)]);
        t.row(["x", "1"]);
        t.row(["y", "", "3"]);
        assert_eq!(t.lines(), ["| a | b | c |", "|---|---:|---:|", "| x | 1 | |", "| y | | 3 |"]);
    }

    #[test]
    fn sections_are_set_off_by_blank_lines() {
        let mut r = Report::new();
        r.section("T").line("body");
        assert_eq!(r.text(), "\n### T\n\nbody\n");
    }

    #[test]
    fn formats_as_printf_does() {
        assert_eq!(fixed(1.2345, 2), "1.23");
        assert_eq!(fixed_or_na(None, 2), "n/a");
        assert_eq!(percent(1, 8), "12.5%");
        assert_eq!(percent(0, 0), "0.0%");
    }
}
