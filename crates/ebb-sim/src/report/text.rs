//! Plain-text tables for terminals: how `ebb reproduce` prints the published figure beside
//! ours.
//!
//! Columns are as wide as their widest cell (counted in characters, not bytes, so `µs` and
//! `≤` align), separated by two spaces, with a dashed rule under the header. A column whose
//! cells all read as numbers (optionally signed, with a trailing `%` or `x`) is right-aligned
//! so digits line up; other columns are left-aligned. Lines carry no trailing spaces, so the
//! output is stable in golden tests and diffs.

/// Column separator.
const GAP: &str = "  ";

/// Formats `rows` under the header `columns` as an aligned table ending in a newline.
///
/// A row shorter than the header is padded with empty cells; a longer one widens the table
/// with untitled columns.
pub fn format_table<C, R, S>(columns: &[C], rows: &[R]) -> String
where
    C: AsRef<str>,
    R: AsRef<[S]>,
    S: AsRef<str>,
{
    let column_count = rows.iter().map(|row| row.as_ref().len()).fold(columns.len(), usize::max);
    let header = |index: usize| columns.get(index).map_or("", |s| s.as_ref());

    let mut widths = vec![0usize; column_count];
    let mut right_aligned = vec![true; column_count];
    for (index, width) in widths.iter_mut().enumerate() {
        *width = char_count(header(index));
        let mut any_number = false;
        for row in rows {
            let text = cell(row, index);
            *width = (*width).max(char_count(text));
            if !text.trim().is_empty() {
                any_number = true;
                right_aligned[index] &= is_numeric(text);
            }
        }
        right_aligned[index] &= any_number;
    }

    let mut out = String::new();
    let header_cells: Vec<&str> = (0..column_count).map(header).collect();
    push_line(&mut out, &header_cells, &widths, &right_aligned);
    let rule: Vec<String> = widths.iter().map(|&width| "-".repeat(width)).collect();
    let rule_cells: Vec<&str> = rule.iter().map(String::as_str).collect();
    push_line(&mut out, &rule_cells, &widths, &right_aligned);
    for row in rows {
        let cells: Vec<&str> = (0..column_count).map(|index| cell(row, index)).collect();
        push_line(&mut out, &cells, &widths, &right_aligned);
    }
    out
}

/// Like [`format_table`], but no column is wider than its entry of `max_widths` (missing
/// entries: unbounded): longer cells wrap at spaces (a word longer than the column is cut),
/// and a row takes as many lines as its tallest cell. Columns are left-aligned but for
/// all-numeric ones, as in [`format_table`].
pub fn format_wrapped_table<C, R, S>(columns: &[C], rows: &[R], max_widths: &[usize]) -> String
where
    C: AsRef<str>,
    R: AsRef<[S]>,
    S: AsRef<str>,
{
    let column_count = rows.iter().map(|row| row.as_ref().len()).fold(columns.len(), usize::max);
    let limit = |index: usize| max_widths.get(index).copied().unwrap_or(usize::MAX).max(1);
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut header = Vec::new();
    for index in 0..column_count {
        header.push(columns.get(index).map_or(String::new(), |c| c.as_ref().to_owned()));
    }
    let mut wrapped_rows: Vec<Vec<Vec<String>>> = Vec::new();
    for row in rows {
        let cells: Vec<Vec<String>> =
            (0..column_count).map(|index| wrap(cell(row, index), limit(index))).collect();
        wrapped_rows.push(cells);
    }
    for cells in &wrapped_rows {
        let height = cells.iter().map(Vec::len).max().unwrap_or(1).max(1);
        for line in 0..height {
            lines.push(cells.iter().map(|c| c.get(line).cloned().unwrap_or_default()).collect());
        }
    }
    format_table(&header, &lines)
}

/// Splits `text` into lines of at most `width` characters, at spaces where possible.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word = word.to_owned();
        loop {
            let needed = char_count(&line) + usize::from(!line.is_empty()) + char_count(&word);
            if needed <= width {
                if !line.is_empty() {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A word longer than the column: cut it.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            lines.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

fn push_line(out: &mut String, cells: &[&str], widths: &[usize], right_aligned: &[bool]) {
    let mut line = String::new();
    for (index, text) in cells.iter().enumerate() {
        if index > 0 {
            line.push_str(GAP);
        }
        let padding = " ".repeat(widths[index] - char_count(text));
        if right_aligned[index] {
            line.push_str(&padding);
            line.push_str(text);
        } else {
            line.push_str(text);
            line.push_str(&padding);
        }
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

fn cell<'a, R: AsRef<[S]>, S: AsRef<str> + 'a>(row: &'a R, index: usize) -> &'a str {
    row.as_ref().get(index).map_or("", |text| text.as_ref())
}

fn char_count(text: &str) -> usize {
    text.chars().count()
}

/// Whether `text` reads as a number: `12`, `-3.5`, `+4%`, `1e6`, `3.1x`.
pub(super) fn is_numeric(text: &str) -> bool {
    let text = text.trim();
    let text = text.strip_suffix('%').or_else(|| text.strip_suffix('x')).unwrap_or(text);
    text.parse::<f64>().is_ok_and(f64::is_finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_numbers_right_and_text_left() {
        // Goal: exact layout of a comparison table, including a multi-byte character.
        let rows = vec![
            vec!["p99.99 read latency (µs)", "22000", "9100.5", "yes"],
            vec!["max read latency", "38000", "12", "no"],
        ];
        let table = format_table(&["result", "published", "ours", "holds"], &rows);
        let expected = "\
result                    published    ours  holds
------------------------  ---------  ------  -----
p99.99 read latency (µs)      22000  9100.5  yes
max read latency              38000      12  no
";
        assert_eq!(table, expected);
    }

    #[test]
    fn ragged_rows_are_padded_and_lines_have_no_trailing_spaces() {
        // Goal: short and long rows do not break alignment and no line ends in a space.
        let columns = vec!["a".to_owned(), "b".to_owned()];
        let rows =
            vec![vec!["x".to_owned()], vec!["1".to_owned(), "2".to_owned(), "3%".to_owned()]];
        let table = format_table(&columns, &rows);
        assert_eq!(table, "a  b\n-  -  --\nx\n1  2  3%\n");
        assert!(table.lines().all(|line| !line.ends_with(' ')));
    }

    #[test]
    fn wrapped_cells_stay_inside_their_column() {
        // Goal: long cells wrap at spaces within the width, long words are cut, and the row
        // takes the lines of its tallest cell.
        let rows = vec![vec!["reader p99.99 latency, laptop", "12", "reproduced"]];
        let table = format_wrapped_table(&["claim", "ratio", "verdict"], &rows, &[10, 6, 20]);
        let expected = "\
claim     ratio  verdict
--------  -----  ----------
reader       12  reproduced
p99.99
latency,
laptop
";
        assert_eq!(table, expected);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), [""]);
    }

    #[test]
    fn empty_table_has_header_only() {
        // Goal: no rows gives the header and the rule.
        let rows: Vec<Vec<String>> = Vec::new();
        assert_eq!(format_table(&["metric"], &rows), "metric\n------\n");
    }
}
