//! What a command printed, kept within a bound: the first and the last
//! bytes of each stream and how many were dropped between them — the start
//! of a build says what ran, its end says how it failed.

use std::collections::VecDeque;

/// One stream's output, capped at `head + tail` bytes.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
}

impl HeadTail {
    /// Keeps at most `cap` bytes: half from the start, half from the end.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap: cap / 2,
            tail_cap: cap - cap / 2,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let taken = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
        }
        if bytes.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + bytes.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.dropped += overflow as u64;
        self.tail.extend(bytes);
    }

    /// Bytes dropped between head and tail.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The kept text, with a marker where bytes were dropped.
    pub(crate) fn render(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            text.push_str(&format!("\n[… {} bytes dropped …]\n", self.dropped));
        }
        let (front, back) = self.tail.as_slices();
        let mut tail = Vec::with_capacity(self.tail.len());
        tail.extend_from_slice(front);
        tail.extend_from_slice(back);
        text.push_str(&String::from_utf8_lossy(&tail));
        text
    }
}

/// Cuts a stream into pieces worth an event: whole lines as they come, a
/// long line without an end in pieces, the rest when the stream ends.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// A line longer than this is streamed without waiting for its end.
    const MAX_PENDING: usize = 4096;

    /// The complete lines `bytes` finishes (with what was pending).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<String> {
        self.pending.extend_from_slice(bytes);
        let cut = match self.pending.iter().rposition(|&b| b == b'\n') {
            Some(newline) => newline + 1,
            // Not inside a character: a multi-byte one cut in two would
            // show as two replacement marks.
            None if self.pending.len() >= Self::MAX_PENDING => match std::str::from_utf8(&self.pending) {
                Err(err) if err.error_len().is_none() && err.valid_up_to() > 0 => err.valid_up_to(),
                _ => self.pending.len(),
            },
            None => return None,
        };
        let ready: Vec<u8> = self.pending.drain(..cut).collect();
        Some(String::from_utf8_lossy(&ready).into_owned())
    }

    /// Whatever is left when the stream ends.
    pub(crate) fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let rest = std::mem::take(&mut self.pending);
        Some(String::from_utf8_lossy(&rest).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut kept = HeadTail::new(20);
        kept.push(b"hello ");
        kept.push(b"world");
        assert_eq!(kept.render(), "hello world");
        assert_eq!(kept.dropped(), 0);
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_rest() {
        let mut kept = HeadTail::new(10);
        for chunk in [b"0123456789".as_slice(), b"abcdefghij", b"ABCDE"] {
            kept.push(chunk);
        }
        assert_eq!(kept.dropped(), 15);
        assert_eq!(kept.render(), "01234\n[… 15 bytes dropped …]\nABCDE");
        kept.push(b"xy");
        assert_eq!(kept.dropped(), 17);
        assert!(kept.render().ends_with("CDExy"));
    }

    #[test]
    fn lines_are_streamed_whole_and_the_rest_at_the_end() {
        let mut lines = LineSplitter::default();
        assert_eq!(lines.feed(b"one\ntw"), Some("one\n".to_string()));
        assert_eq!(lines.feed(b"o"), None);
        assert_eq!(lines.feed(b"\nthree"), Some("two\n".to_string()));
        assert_eq!(lines.finish(), Some("three".to_string()));
        assert_eq!(lines.finish(), None);
        let long = vec![b'x'; 5000];
        assert_eq!(lines.feed(&long).map(|text| text.len()), Some(5000));
        // A long line cut inside "é" keeps the character whole.
        let mut split = vec![b'x'; 4095];
        split.push(0xc3);
        assert_eq!(lines.feed(&split).map(|text| text.len()), Some(4095));
        assert_eq!(lines.feed(&[0xa9, b'\n']), Some("é\n".to_string()));
    }
}
