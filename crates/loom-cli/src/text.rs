//! Text shaped for a terminal line.

/// `text` cut to `max` characters, with `…` when something was cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    loom::text::clip(text, max, "…")
}
