//! What reaches a terminal. Input echoed to one (log excerpts and file names in the import
//! summary, configuration values in `check`, errors that quote a peer's answer) passes through
//! [`escape`], so that a log line cannot set the window title or print a hyperlink (OSC),
//! move the cursor or clear the screen (CSI), overwrite a line (`\r`) or reorder what is shown
//! (bidirectional overrides).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` would control the terminal instead of being shown: C0 and C1 controls, DEL, and
/// the bidirectional embeddings, overrides and isolates.
fn controls(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character written as an escape (`\r`, `\n`, `\t`, `\x1b`,
/// `\u{9b}`); a backslash followed by what reads as one is doubled, so that what is shown is
/// unambiguous. Borrowed when there is nothing to escape.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| controls(c) || c == '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if controls(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if controls(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` escaped line by line: the lines phasetrace writes stay lines, and nothing inside one
/// reaches the terminal raw.
pub(crate) fn escape_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out += &escape(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_escaped_and_text_is_kept() {
        let osc = "\u{1b}]0;pwned\u{7}\u{1b}]8;;http://evil/\u{1b}\\link\u{1b}]8;;\u{1b}\\";
        let shown = escape(osc);
        assert!(!shown.chars().any(controls), "{shown}");
        assert_eq!(escape("a\rb\u{9b}2J\u{202e}c"), "a\\rb\\u{9b}2J\\u{202e}c");
        assert_eq!(escape("kda_mixer 12.5 µs"), "kda_mixer 12.5 µs");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape("C:\\x1b"),
            "C:\\\\x1b",
            "a literal backslash is not an escape"
        );
        assert_eq!(escape_lines("one\u{1b}[2K\ntwo"), "one\\x1b[2K\ntwo");
    }
}
