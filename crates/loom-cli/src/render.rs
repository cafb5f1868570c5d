//! Showing a run in the terminal: the answer on stdout, tool activity on
//! stderr, or every event as a JSON line.

use std::collections::HashMap;
use std::io::{self, Write};

use loom::{Event, EventKind};

/// Turns events into output.
pub trait Renderer {
    fn event(&mut self, event: &Event) -> io::Result<()>;
}

/// One JSON object per line on stdout.
pub struct JsonLines;

impl Renderer for JsonLines {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        let mut out = io::stdout().lock();
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// The answer as it streams, and one stderr line per tool call.
#[derive(Default)]
pub struct Human {
    args: HashMap<String, String>,
    open_line: bool,
}

const ARGS_SHOWN: usize = 80;

impl Renderer for Human {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        match &event.kind {
            EventKind::LlmDelta { text } => {
                let mut out = io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
                self.open_line = !text.ends_with('\n');
            }
            EventKind::LlmFinish { .. } => self.end_line()?,
            EventKind::ToolCallsStart { calls } => {
                for call in calls {
                    self.args.insert(call.call_id.clone(), summarize_args(&call.args));
                }
            }
            EventKind::ToolResult {
                call_id,
                name,
                status,
                content,
                duration_ms,
                ..
            } => {
                let args = self.args.remove(call_id).unwrap_or_default();
                let mark = if status.is_failure() { "✗" } else { "✓" };
                let took = if *duration_ms == 0 {
                    "<1".to_string()
                } else {
                    duration_ms.to_string()
                };
                let mut line = format!("  {mark} {name}({args}) {took} ms");
                if status.as_str() != "success" {
                    let first = content.lines().next().unwrap_or_default();
                    line.push_str(&format!(" — {}: {}", status.as_str(), clip(first, 160)));
                }
                eprintln!("{line}");
            }
            EventKind::MaxIterationsReached { max_iterations, .. } => {
                self.end_line()?;
                eprintln!("loom: step limit ({max_iterations}) reached; asking the model for its final answer");
            }
            EventKind::ExecutionCancelled { reason } => {
                self.end_line()?;
                eprintln!("loom: cancelled: {reason}");
            }
            EventKind::Error { code, message, .. } => {
                self.end_line()?;
                eprintln!("loom: error [{code}]: {message}");
            }
            _ => {}
        }
        Ok(())
    }
}

impl Human {
    fn end_line(&mut self) -> io::Result<()> {
        if self.open_line {
            let mut out = io::stdout().lock();
            out.write_all(b"\n")?;
            out.flush()?;
            self.open_line = false;
        }
        Ok(())
    }
}

/// Arguments as `key=value, …`, cut to one short line.
pub fn summarize_args(args: &serde_json::Value) -> String {
    let text = match args.as_object() {
        Some(map) => map
            .iter()
            .map(|(key, value)| match value.as_str() {
                Some(text) => format!("{key}={}", clip(text, 40)),
                None => format!("{key}={value}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        None => args.to_string(),
    };
    clip(&text, ARGS_SHOWN)
}

fn clip(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', "⏎");
    match one_line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}
