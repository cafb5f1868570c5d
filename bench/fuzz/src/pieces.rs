//! Cutting one input into the pieces a network or a model stream would
//! deliver: the first byte chooses the sizes, so the fuzzer explores every
//! cut (inside a UTF-8 character, a line ending, a field name).

/// `data` without its first byte, cut into pieces whose sizes the first
/// byte chooses: below 128, 1 to 16 bytes (every cut inside a field);
/// from 128, 1 to 2048 (as a network delivers). Sizes wander so that no
/// cut repeats at one offset. No first byte: no piece.
pub fn cut(data: &[u8]) -> Vec<Vec<u8>> {
    let Some((&seed, body)) = data.split_first() else {
        return Vec::new();
    };
    let span = if seed < 128 { 16 } else { 2048 };
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut size = usize::from(seed) % span + 1;
    while at < body.len() {
        let end = (at + size).min(body.len());
        pieces.push(body[at..end].to_vec());
        at = end;
        size = (size * 5 + usize::from(seed)) % span + 1;
    }
    pieces
}

/// [`cut`], each piece as text (a model's text chunks are always whole
/// characters: invalid bytes become U+FFFD).
pub fn cut_text(data: &[u8]) -> Vec<String> {
    let Some((&seed, body)) = data.split_first() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(body);
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut size = usize::from(seed % 16) + 1;
    while at < chars.len() {
        let end = (at + size).min(chars.len());
        pieces.push(chars[at..end].iter().collect());
        at = end;
        size = (size * 5 + usize::from(seed)) % 16 + 1;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pieces_are_the_input() {
        for seed in 0..=255u8 {
            let mut data = vec![seed];
            data.extend_from_slice("data: {\"é\": 1}\n\n".as_bytes());
            assert_eq!(cut(&data).concat(), &data[1..]);
            assert_eq!(cut_text(&data).concat(), String::from_utf8_lossy(&data[1..]));
        }
        assert!(cut(&[]).is_empty());
    }
}
