//! Cutting oversized tool output, visibly.

/// `text` cut to about `max_chars` characters: the head and the tail are
/// kept (errors are often at the end) and a marker says how much was cut.
pub fn truncate(text: &str, max_chars: usize) -> Option<String> {
    let total = text.chars().count();
    if total <= max_chars {
        return None;
    }
    let head_chars = max_chars * 2 / 3;
    let tail_chars = max_chars - head_chars;
    let head_end = text.char_indices().nth(head_chars).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(total - tail_chars)
        .map_or(text.len(), |(i, _)| i);
    let cut = total - head_chars - tail_chars;
    Some(format!(
        "{}\n\n[… output truncated: {cut} of {total} characters cut here …]\n\n{}",
        &text[..head_end],
        &text[tail_start..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_head_and_tail_and_says_how_much_was_cut() {
        assert_eq!(truncate("short", 10), None);
        let text: String = ('a'..='z').cycle().take(1000).collect();
        let out = truncate(&text, 90).unwrap();
        assert!(out.starts_with(&text[..60]));
        assert!(out.ends_with(&text[970..]));
        assert!(out.contains("910 of 1000 characters cut"), "{out}");
        let wide = "é".repeat(50);
        assert!(truncate(&wide, 10).unwrap().contains("40 of 50"));
    }
}
