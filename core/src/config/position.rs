//! Where things were written: 1-based line and column numbers computed from byte offsets, and
//! the positions of a table's keys kept for checks that run after parsing.

use std::collections::BTreeMap;

/// A 1-based line and column (counted in characters) in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Pos {
    /// The position of byte `offset` in `text`, for a single position (an error): scans the
    /// text before it. Many positions in one text go through a [`LineIndex`].
    pub(crate) fn at(text: &str, offset: usize) -> Pos {
        LineIndex::new(text).at(offset)
    }
}

/// Where each line of a text starts, found in one pass, so that each position after it costs a
/// binary search and its own line, not a scan of everything before it (positions of every key
/// of a large file would otherwise take time quadratic in its size).
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    /// Byte offset of each line's first byte.
    starts: Vec<usize>,
}

#[cfg(test)]
thread_local! {
    /// Bytes of text examined by [`LineIndex`] on this thread (the tests' measure of work).
    pub(crate) static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn scanned(_bytes: usize) {
    #[cfg(test)]
    SCANNED.with(|s| s.set(s.get() + _bytes));
}

impl<'a> LineIndex<'a> {
    /// Indexes `text` (one pass).
    pub(crate) fn new(text: &'a str) -> Self {
        scanned(text.len());
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { text, starts }
    }

    /// The 1-based line and column of byte `offset` (clamped to the text, stepped back to a
    /// character boundary).
    pub(crate) fn at(&self, offset: usize) -> Pos {
        let mut end = offset.min(self.text.len());
        // A span always starts on a char boundary; step back rather than panic if one did not.
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        // The last line starting at or before `end`.
        let line = self.starts.partition_point(|&s| s <= end);
        let start = self.starts[line - 1];
        scanned(end - start);
        Pos {
            line,
            column: self.text[start..end].chars().count() + 1,
        }
    }
}

/// Where the keys of one table (`[runtime]` or one `[[cluster]]`) were written.
///
/// Keys are paths relative to the table (`ranks`, `plugin_dirs[1]`, `options.nccl.library`).
/// Positions are provenance, not value: two tables with equal values compare equal wherever
/// they were written.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyPositions {
    table: Option<Pos>,
    keys: BTreeMap<String, Pos>,
}

impl KeyPositions {
    /// Records where the table itself starts (its `[[cluster]]` header).
    pub(crate) fn set_table(&mut self, pos: Pos) {
        self.table = Some(pos);
    }

    /// Records where `key` was written.
    pub(crate) fn set(&mut self, key: impl Into<String>, pos: Pos) {
        self.keys.insert(key.into(), pos);
    }

    /// Forgets `key`, for a value that no longer comes from the file (an environment override).
    pub(crate) fn forget(&mut self, key: &str) {
        self.keys.remove(key);
    }

    /// Keeps only the keys for which `keep` is true.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.keys.retain(|key, _| keep(key));
    }

    /// Where `key` was written, if it was.
    pub(crate) fn key(&self, key: &str) -> Option<Pos> {
        self.keys.get(key).copied()
    }

    /// Where `key` was written, else where its table starts: the best line for an error
    /// about `key`.
    pub(crate) fn key_or_table(&self, key: &str) -> Option<Pos> {
        self.key(key).or(self.table)
    }
}

impl PartialEq for KeyPositions {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl Eq for KeyPositions {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let text = "a = 1\nbb = \"é\"\n\nc";
        assert_eq!(Pos::at(text, 0), Pos { line: 1, column: 1 });
        assert_eq!(Pos::at(text, 4), Pos { line: 1, column: 5 });
        assert_eq!(Pos::at(text, 6), Pos { line: 2, column: 1 });
        // Columns count characters: the closing quote follows a two-byte 'é'.
        assert_eq!(Pos::at(text, 14), Pos { line: 2, column: 8 });
        assert_eq!(Pos::at(text, 17), Pos { line: 4, column: 1 });
        // Past the end clamps; inside a char steps back to its start.
        assert_eq!(Pos::at(text, 999), Pos { line: 4, column: 2 });
        assert_eq!(Pos::at(text, 13), Pos { line: 2, column: 7 });
    }

    #[test]
    fn an_index_gives_the_same_positions_in_one_pass() {
        let text = "a = 1\nbb = \"é\"\n\nc";
        let index = LineIndex::new(text);
        for offset in 0..=text.len() + 2 {
            let mut end = offset.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let before = &text[..end];
            let start = before.rfind('\n').map_or(0, |i| i + 1);
            let slow = Pos {
                line: before.matches('\n').count() + 1,
                column: before[start..].chars().count() + 1,
            };
            assert_eq!(index.at(offset), slow, "offset {offset}");
        }
        assert_eq!(LineIndex::new("").at(0), Pos { line: 1, column: 1 });
    }

    #[test]
    fn key_falls_back_to_table() {
        let mut p = KeyPositions::default();
        assert_eq!(p.key_or_table("ranks"), None);
        p.set_table(Pos { line: 3, column: 1 });
        assert_eq!(p.key_or_table("ranks").map(|p| p.line), Some(3));
        p.set("ranks", Pos { line: 5, column: 9 });
        assert_eq!(p.key_or_table("ranks").map(|p| p.line), Some(5));
        p.forget("ranks");
        assert_eq!(p.key_or_table("ranks").map(|p| p.line), Some(3));
    }
}
