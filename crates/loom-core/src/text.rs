//! Small text helpers shared by every crate: cutting text at a character
//! boundary, and a digest that is the same in every process.

/// `text` cut to `max` characters followed by `marker` (`"…"`, `"… [cut]"`)
/// when something was cut; as it is otherwise. Cuts between characters,
/// never inside one.
pub fn clip(text: &str, max: usize, marker: &str) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}{marker}", &text[..cut]),
        None => text.to_string(),
    }
}

/// FNV-1a over `bytes`: stable across processes, machines and Rust
/// releases (the std hasher is none of these), for ids and digests that
/// are stored or sent.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::{clip, fnv1a};

    #[test]
    fn clips_at_a_character_boundary_and_marks_the_cut() {
        assert_eq!(clip("héllo", 2, "…"), "hé…");
        assert_eq!(clip("hi", 2, "…"), "hi");
        assert_eq!(clip("abc", 1, " [cut]"), "a [cut]");
    }

    #[test]
    fn the_digest_is_fnv_1a() {
        // Published FNV-1a 64-bit test vectors.
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(*b"foobar"), 0x8594_4171_f739_67e8);
    }
}
