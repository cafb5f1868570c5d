//! Text shaped for a terminal line.

/// `text` cut to `max` characters, with `…` when something was cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    loom::text::clip(text, max, "…")
}

/// `text` with control characters, and the invisible ones that reorder
/// or hide text (bidirectional overrides, zero-width), escaped (`\n`,
/// `\u{1b}`).
pub(crate) fn shown(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    text.chars()
        .map(|c| {
            if hidden(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
