//! A markdown table as the benchmarks print it (`| a | b |` lines), and the numbers in its cells.

/// A table: its header's cells and each row's cells, trimmed.
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// The cells of a `| a | b |` line; `None` for any other line.
pub fn cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

/// Whether `cells` are a header's separator (`|---|---|`).
fn separator(cells: &[String]) -> bool {
    cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':'))
}

impl Table {
    /// The first table in `text`.
    pub fn parse(text: &str) -> Option<Table> {
        Table::all(text).into_iter().next()
    }

    /// Every table in `text`, in order: a `| … |` line followed by a separator line starts one;
    /// it runs while lines are `| … |`.
    pub fn all(text: &str) -> Vec<Table> {
        let lines: Vec<&str> = text.lines().collect();
        let mut tables = vec![];
        let mut i = 0;
        while i + 1 < lines.len() {
            let (Some(header), Some(sep)) = (cells(lines[i]), cells(lines[i + 1])) else {
                i += 1;
                continue;
            };
            if !separator(&sep) {
                i += 1;
                continue;
            }
            let rows: Vec<Vec<String>> = lines[i + 2..].iter().map_while(|l| cells(l)).collect();
            i += 2 + rows.len();
            tables.push(Table { header, rows });
        }
        tables
    }

    /// The row whose first cell is `name`.
    pub fn row(&self, name: &str) -> Option<&[String]> {
        self.rows
            .iter()
            .find(|r| r.first().is_some_and(|c| c == name))
            .map(Vec::as_slice)
    }

    /// Row `name`'s cell in column `column`.
    pub fn cell(&self, name: &str, column: &str) -> Option<&str> {
        let i = self.header.iter().position(|h| h == column)?;
        self.row(name)?.get(i).map(String::as_str)
    }
}

/// A number as a doc or table states it: its value and how many decimals it was given with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figure {
    pub value: f64,
    pub decimals: usize,
}

impl Figure {
    /// Whether `stated` is this figure rounded to `stated`'s decimals (357.4 states as 357, 2.61
    /// as 2.6; 3.5 is not 2.61).
    pub fn agrees(&self, stated: Figure) -> bool {
        let unit = 10f64.powi(-(stated.decimals as i32));
        (self.value - stated.value).abs() <= unit / 2.0 + 1e-9
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.*}", self.decimals, self.value)
    }
}

/// Every number in `text`, in order (`1,063` is one number; `3.03-3.05` two).
pub fn figures(text: &str) -> Vec<Figure> {
    let bytes = text.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < bytes.len() {
        let starts = bytes[i].is_ascii_digit() && (i == 0 || !is_word(bytes[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < bytes.len()
            && (bytes[end].is_ascii_digit()
                || (matches!(bytes[end], b',' | b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit)))
        {
            end += 1;
        }
        let digits = text[i..end].replace(',', "");
        let decimals = digits.find('.').map_or(0, |dot| digits.len() - dot - 1);
        if let Ok(value) = digits.parse() {
            out.push(Figure { value, decimals });
        }
        i = end;
    }
    out
}

/// A byte that belongs to a word a number can follow only as part of it (`v3`, `p99`, `2^40`).
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'^' | b'.')
}

/// The first number in `text`.
pub fn first(text: &str) -> Option<Figure> {
    figures(text).into_iter().next()
}

/// The ratio a benchmark cell shows in brackets: `80 (4.47x)` → 4.47.
pub fn ratio(cell: &str) -> Option<Figure> {
    let open = cell.rfind('(')?;
    let inner = cell[open + 1..].strip_suffix(')')?.strip_suffix('x')?;
    first(inner)
}
