//! The error of the textual IR: a message at a `file:line:col` position, shown with the offending
//! source line and a caret under the column.
//!
//! Lexical, syntactic and semantic errors (unknown names, type mismatches, bad attributes) all
//! come out as one [`ParseError`], positioned at the token at fault.

/// An error in a textual IR file, positioned at the token at fault.
///
/// Displays as `file:line:col: message`, then the source line, then a caret under the column.
/// `line` and `col` are 1-based; `col` counts characters, not bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ParseError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    /// The text of line `line` (without its line break).
    pub source_line: String,
}

impl ParseError {
    /// An error at byte `offset` of `source` (clamped to the source; snapped back to a character
    /// boundary).
    pub fn at(file: &str, source: &str, offset: usize, message: impl Into<String>) -> ParseError {
        let mut offset = offset.min(source.len());
        while !source.is_char_boundary(offset) {
            offset -= 1;
        }
        let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[offset..]
            .find('\n')
            .map_or(source.len(), |i| offset + i);
        let line = source[..line_start].matches('\n').count() + 1;
        let col = source[line_start..offset].chars().count() + 1;
        let source_line = source[line_start..line_end]
            .trim_end_matches('\r')
            .to_string();
        ParseError {
            file: file.to_string(),
            line,
            col,
            message: message.into(),
            source_line,
        }
    }

    /// The full three-line rendering (the `Display` form).
    pub fn render(&self) -> String {
        // Copy tabs so the caret lines up under tab-indented text.
        let pad: String = self
            .source_line
            .chars()
            .take(self.col.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        let missing = self
            .col
            .saturating_sub(1)
            .saturating_sub(self.source_line.chars().count());
        format!(
            "{}:{}:{}: {}\n{}\n{}{}^",
            self.file,
            self.line,
            self.col,
            self.message,
            self.source_line,
            pad,
            " ".repeat(missing)
        )
    }
}

/// An error at a byte offset of the source, before it is rendered with its file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct At {
    pub offset: usize,
    pub message: String,
}

/// An [`At`] error.
pub(crate) fn at(offset: usize, message: impl Into<String>) -> At {
    At {
        offset,
        message: message.into(),
    }
}

/// The 1-based line and character column of byte `offset` in `source`, as `line:col`, for
/// messages that point at a second place ("first defined at 3:1").
pub(crate) fn line_col(source: &str, offset: usize) -> String {
    let e = ParseError::at("", source, offset, "");
    format!("{}:{}", e.line, e.col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_lines_and_characters() {
        let src = "ab\n\tcé d\nlast";
        let e = ParseError::at("f.tp", src, src.find('d').expect("d"), "bad d");
        assert_eq!((e.line, e.col), (2, 5));
        assert_eq!(e.source_line, "\tcé d");
        assert_eq!(e.to_string(), "f.tp:2:5: bad d\n\tcé d\n\t   ^");
        let end = ParseError::at("f.tp", src, src.len(), "eof");
        assert_eq!((end.line, end.col), (3, 5));
        assert_eq!(end.to_string(), "f.tp:3:5: eof\nlast\n    ^");
    }
}
