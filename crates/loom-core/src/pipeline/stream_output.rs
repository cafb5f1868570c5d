//! A call's streamed output (`tool.output`), redacted before anyone sees
//! it. Each piece is redacted like a result is; a private key's PEM block,
//! which spans lines and so several pieces, is held back until its END
//! line (or the end of the call) so no piece of it leaks on its own.

use crate::emitter::EventEmitter;
use crate::event::{EventKind, TurnIds};
use crate::tool::OutputStream;

use super::Redactor;

/// Bytes of an unfinished key block held back at most; past that the
/// block is dropped whole.
const MAX_HELD: usize = 64 * 1024;

/// Turns one call's output into events.
pub(crate) struct StreamedOutput<'a> {
    call_id: &'a str,
    redactor: &'a Redactor,
    events: &'a EventEmitter,
    turn: &'a TurnIds,
    /// Text held back per stream (stdout, stderr).
    held: [String; 2],
}

impl<'a> StreamedOutput<'a> {
    pub(crate) fn new(call_id: &'a str, redactor: &'a Redactor, events: &'a EventEmitter, turn: &'a TurnIds) -> Self {
        Self {
            call_id,
            redactor,
            events,
            turn,
            held: [String::new(), String::new()],
        }
    }

    /// One piece of output.
    pub(crate) fn push(&mut self, stream: OutputStream, text: String) {
        let held = &mut self.held[index(stream)];
        held.push_str(&text);
        match open_key_block(held) {
            None => {
                let ready = std::mem::take(held);
                self.emit(stream, &ready);
            }
            Some(_) if held.len() <= MAX_HELD => {}
            Some(start) => {
                let mut ready = std::mem::take(held);
                ready.truncate(start);
                ready.push_str(super::REDACTED);
                ready.push('\n');
                self.emit(stream, &ready);
            }
        }
    }

    /// The call ended: what is held goes out, an unfinished key block as
    /// a redaction marker.
    pub(crate) fn finish(&mut self) {
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let mut rest = std::mem::take(&mut self.held[index(stream)]);
            // Most calls stream nothing: nothing to look through.
            if rest.is_empty() {
                continue;
            }
            if let Some(start) = open_key_block(&rest) {
                rest.truncate(start);
                rest.push_str(super::REDACTED);
            }
            self.emit(stream, &rest);
        }
    }

    fn emit(&self, stream: OutputStream, text: &str) {
        if text.is_empty() {
            return;
        }
        self.events.emit(
            self.turn,
            EventKind::ToolOutput {
                call_id: self.call_id.to_string(),
                stream,
                text: self.redactor.redact(text).into_owned(),
            },
        );
    }
}

fn index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
    }
}

/// Where an unfinished private-key block starts in `text`: a `-----BEGIN`
/// whose line is not finished yet or names a private key, with no
/// `-----END` after it.
fn open_key_block(text: &str) -> Option<usize> {
    let start = text.rfind("-----BEGIN")?;
    let after = &text[start..];
    if after.contains("-----END") {
        return None;
    }
    let line_done = after.contains('\n');
    let first_line = after.lines().next().unwrap_or("");
    (!line_done || first_line.contains("PRIVATE KEY")).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use tokio::sync::mpsc;

    /// What a `StreamedOutput` borrows, and the receiver of its events.
    fn parts() -> (EventEmitter, TurnIds, Redactor, mpsc::UnboundedReceiver<Box<Event>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let events = EventEmitter::new("r".into(), 0, tx);
        let turn = TurnIds {
            turn_id: "t".into(),
            parent_turn_id: None,
        };
        (events, turn, Redactor::with_secrets(Vec::new()), rx)
    }

    fn texts(rx: &mut mpsc::UnboundedReceiver<Box<Event>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(event) = rx.try_recv() {
            if let EventKind::ToolOutput { text, .. } = event.kind {
                out.push(text);
            }
        }
        out
    }

    #[test]
    fn a_key_block_split_across_pieces_never_streams_its_body() {
        let (events, turn, redactor, mut rx) = parts();
        let mut output = StreamedOutput::new("c", &redactor, &events, &turn);
        output.push(OutputStream::Stdout, "config:\n-----BEGIN RSA PRIV".to_string());
        output.push(OutputStream::Stdout, "ATE KEY-----\nMIIEsecretbody\n".to_string());
        assert_eq!(texts(&mut rx), Vec::<String>::new(), "held back until the block ends");
        output.push(
            OutputStream::Stdout,
            "-----END RSA PRIVATE KEY-----\nnext line\n".to_string(),
        );
        let shown = texts(&mut rx).concat();
        assert!(!shown.contains("MIIEsecretbody"), "{shown}");
        assert!(shown.contains("config:") && shown.contains("next line"), "{shown}");

        output.push(OutputStream::Stderr, "-----BEGIN PRIVATE KEY-----\nhalf".to_string());
        output.finish();
        let shown = texts(&mut rx).concat();
        assert!(!shown.contains("half"), "{shown}");
        assert!(shown.contains(super::super::REDACTED));
    }

    #[test]
    fn other_begin_lines_are_not_held() {
        let (events, turn, redactor, mut rx) = parts();
        let mut output = StreamedOutput::new("c", &redactor, &events, &turn);
        output.push(OutputStream::Stdout, "-----BEGIN CERTIFICATE-----\nMIIC\n".to_string());
        assert_eq!(texts(&mut rx).concat(), "-----BEGIN CERTIFICATE-----\nMIIC\n");
    }
}
