//! Text shaped for a terminal line.

/// `text` cut to `max` characters, with `…` when something was cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    loom::text::clip(text, max, "…")
}

/// `text` with control characters (C0, C1, `DEL`), and the invisible ones
/// that reorder or hide text — bidirectional marks, embeddings, overrides
/// and isolates (U+061C, U+200E/F, U+202A–E, U+2066–9), zero-width and
/// other invisible characters, line and paragraph separators — escaped
/// (`\u{a}`, `\u{1b}`, `\u{202e}`): what a client or a model chose cannot
/// move, hide or recolour what the terminal shows around it.
pub(crate) fn shown(text: &str) -> String {
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

/// JSON text (as `serde_json` writes it, on one line) with the characters
/// [`shown`] escapes written as JSON escapes (`\u202e`): the same value to
/// a program, nothing hidden on a terminal. Such characters stand only
/// inside strings there, where the escape means the character.
pub(crate) fn shown_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if hidden(c) {
            // None is beyond the Basic Multilingual Plane: one escape each.
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` is one [`shown`] escapes.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_direction_marks_are_escaped() {
        for (c, escaped) in [
            ('\u{1b}', "\\u{1b}"),
            ('\n', "\\u{a}"),
            ('\u{7f}', "\\u{7f}"),
            ('\u{9b}', "\\u{9b}"),
            ('\u{61c}', "\\u{61c}"),
            ('\u{200e}', "\\u{200e}"),
            ('\u{200f}', "\\u{200f}"),
            ('\u{202e}', "\\u{202e}"),
            ('\u{2066}', "\\u{2066}"),
            ('\u{2069}', "\\u{2069}"),
            ('\u{2028}', "\\u{2028}"),
        ] {
            assert_eq!(shown(&format!("a{c}b")), format!("a{escaped}b"));
        }
        assert_eq!(shown("plain text, déjà vu, 東京"), "plain text, déjà vu, 東京");
    }

    #[test]
    fn json_keeps_its_value_and_hides_nothing() {
        let value = serde_json::json!({"model": "x\u{202e}\u{9b}y\u{2067}z", "n": 1});
        let printed = shown_json(&serde_json::to_string(&value).unwrap_or_default());
        assert!(printed.is_ascii(), "{printed}");
        assert!(printed.contains("\\u202e") && printed.contains("\\u009b"), "{printed}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&printed).ok(), Some(value));
    }
}
