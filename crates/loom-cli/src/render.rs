//! Showing a run in the terminal: the answer on stdout, tool activity on
//! stderr, or every event as a JSON line.

use std::collections::HashMap;
use std::io::{self, Write};

use loom::{Event, EventKind};

/// Turns events into output.
pub(crate) trait Renderer {
    fn event(&mut self, event: &Event) -> io::Result<()>;
}

/// One JSON object per line on stdout.
pub(crate) struct JsonLines;

impl Renderer for JsonLines {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        // The whole line in one write, so nothing else on the terminal (a
        // permission question) can land inside it.
        let mut line = serde_json::to_vec(event)?;
        line.push(b'\n');
        let mut out = io::stdout().lock();
        out.write_all(&line)?;
        out.flush()
    }
}

/// The answer as it streams, and one stderr line per tool call.
#[derive(Default)]
pub(crate) struct Human {
    args: HashMap<String, String>,
    open_line: bool,
    verbose: bool,
}

impl Human {
    /// A renderer; `verbose` also shows guidance, compression and retrieval.
    pub(crate) fn new(verbose: bool) -> Self {
        Self {
            verbose,
            ..Self::default()
        }
    }
}

const ARGS_SHOWN: usize = 80;

impl Renderer for Human {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        if event.depth > 0 {
            return self.sub_agent_event(event);
        }
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
            EventKind::ToolResult { .. } => {
                let line = self.tool_line(event);
                say!("{line}");
            }
            EventKind::ToolOutput { text, .. } => {
                self.end_line()?;
                say_output(text, "  ");
            }
            EventKind::MaxIterationsReached { max_iterations, .. } => {
                self.end_line()?;
                say!("loom: step limit ({max_iterations}) reached; asking the model for its final answer");
            }
            EventKind::GuidanceInjected { reason, content } if self.verbose => {
                self.end_line()?;
                say!("  · guidance ({reason}): {}", clip(content, 120));
            }
            kind @ EventKind::CompressionApplied { .. } => {
                self.end_line()?;
                if let Some(note) = compression_note(kind) {
                    say!("loom: {note}");
                }
            }
            EventKind::ContextWarning { ratio, .. } if self.verbose => {
                self.end_line()?;
                say!("  · the context is {:.0}% full", ratio * 100.0);
            }
            EventKind::RetrievalComplete { doc_count, sources } if self.verbose => {
                say!("  · retrieved {doc_count} passages: {}", clip(&sources.join(", "), 120));
            }
            EventKind::ExecutionCancelled { reason } => {
                self.end_line()?;
                say!("loom: cancelled: {reason}");
            }
            EventKind::Error { code, message, .. } => {
                self.end_line()?;
                say!("loom: error [{code}]: {message}");
            }
            EventKind::Warning { code, message } => {
                self.end_line()?;
                say!("loom: warning [{code}]: {message}");
            }
            EventKind::SnapshotRecorded { step, skipped, .. } if !skipped.is_empty() => {
                self.end_line()?;
                let files: Vec<String> = skipped
                    .iter()
                    .map(|file| format!("{} ({} bytes)", file.path, file.bytes))
                    .collect();
                say!(
                    "loom: left out of the snapshot of step {step} for their size ([snapshots] max_file_bytes): {}",
                    clip(&files.join(", "), 300)
                );
            }
            EventKind::HookResult {
                hook_event: point,
                hook,
                decision,
                reason,
                arguments_rewritten,
                context,
                ..
            } => {
                // A hook that decided something is worth a line; one that
                // failed has its warning.
                let mut what: Vec<String> = decision.iter().map(|decision| decision.to_string()).collect();
                if *arguments_rewritten {
                    what.push("rewrote the arguments".to_string());
                }
                if context.is_some() {
                    what.push("added context".to_string());
                }
                if !what.is_empty() || self.verbose {
                    self.end_line()?;
                    let why = reason
                        .as_deref()
                        .map(|r| format!(": {}", clip(r, 120)))
                        .unwrap_or_default();
                    let what = if what.is_empty() {
                        "no opinion".to_string()
                    } else {
                        what.join(", ")
                    };
                    say!("  · {point} hook `{}` {what}{why}", clip(hook, 60));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Human {
    /// A sub-agent's activity, on stderr and indented by its depth; its
    /// text never reaches stdout (its answer comes back as the result of
    /// the `task` call that started it).
    fn sub_agent_event(&mut self, event: &Event) -> io::Result<()> {
        let indent = "  ".repeat(event.depth as usize + 1);
        let who = short_run_id(&event.run_id);
        match &event.kind {
            EventKind::LifecycleStart { prompt, .. } => {
                self.end_line()?;
                say!("{indent}↳ sub-agent {who}: {}", clip(prompt, 100));
            }
            EventKind::ToolCallsStart { calls } => {
                for call in calls {
                    self.args.insert(call.call_id.clone(), summarize_args(&call.args));
                }
            }
            EventKind::ToolResult { .. } => {
                let line = self.tool_line(event);
                self.end_line()?;
                say!("{line}");
            }
            EventKind::ToolOutput { text, .. } => {
                self.end_line()?;
                say_output(text, &indent);
            }
            EventKind::Error { code, message, .. } => {
                self.end_line()?;
                say!("{indent}sub-agent {who}: error [{code}]: {message}");
            }
            EventKind::Warning { code, message } => {
                self.end_line()?;
                say!("{indent}sub-agent {who}: warning [{code}]: {message}");
            }
            EventKind::LifecycleEnd { status, .. } => {
                self.end_line()?;
                say!("{indent}↳ sub-agent {who}: {}", status.as_str());
            }
            _ => {}
        }
        Ok(())
    }

    /// One tool call's line, indented by the depth of its run.
    fn tool_line(&mut self, event: &Event) -> String {
        let EventKind::ToolResult {
            call_id,
            name,
            status,
            content,
            duration_ms,
            ..
        } = &event.kind
        else {
            return String::new();
        };
        let indent = "  ".repeat(event.depth as usize + 1);
        let args = self.args.remove(call_id).unwrap_or_default();
        let mark = if status.is_failure() { "✗" } else { "✓" };
        let took = if *duration_ms == 0 {
            "<1".to_string()
        } else {
            duration_ms.to_string()
        };
        let mut line = format!("{indent}{mark} {name}({args}) {took} ms");
        if status.as_str() != "success" {
            let first = content.lines().next().unwrap_or_default();
            line.push_str(&format!(" — {}: {}", status.as_str(), clip(first, 160)));
        }
        line
    }

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
pub(crate) fn summarize_args(args: &serde_json::Value) -> String {
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

/// "history compressed (METHOD): A → B messages, C → D tokens", for the
/// live view and for `runs show --tree`.
pub(crate) fn compression_note(kind: &EventKind) -> Option<String> {
    let EventKind::CompressionApplied {
        messages_before,
        messages_after,
        tokens_before,
        tokens_after,
        method,
    } = kind
    else {
        return None;
    };
    Some(format!(
        "history compressed ({method}): {messages_before} → {messages_after} messages, {tokens_before} → {tokens_after} tokens"
    ))
}

fn clip(text: &str, max: usize) -> String {
    crate::text::clip(&text.replace('\n', "⏎"), max)
}

/// The run summary of `--verbose` (docs/context.md, run metrics).
pub(crate) fn summary(outcome: &loom::RunOutcome) -> String {
    let m = &outcome.metrics;
    let mut out = format!(
        "\n── run {} ─ {} in {:.1} s\nturns {}, model calls {} ({:.1} s), tokens {} in / {} out",
        outcome.run_id,
        outcome.status.as_str(),
        m.duration_ms as f64 / 1000.0,
        outcome.turns,
        m.llm_calls,
        m.llm_ms as f64 / 1000.0,
        m.input_tokens,
        m.output_tokens
    );
    if let Some(cost) = m.cost_usd {
        out.push_str(&format!(", cost ${cost:.4}"));
    }
    out.push('\n');
    for (name, stats) in &m.tools {
        out.push_str(&format!(
            "tool {name}: {} calls, {:.0}% ok, avg {:.0} ms, max {} ms\n",
            stats.calls,
            stats.success_rate * 100.0,
            stats.avg_ms,
            stats.max_ms
        ));
    }
    if m.compressions > 0 {
        out.push_str(&format!(
            "compressions {}, history kept at {:.0}%\n",
            m.compressions,
            m.compression_ratio.unwrap_or(1.0) * 100.0
        ));
    }
    if !m.errors.is_empty() {
        let errors: Vec<String> = m.errors.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        out.push_str(&format!("errors: {}\n", errors.join(", ")));
    }
    for suggestion in m.suggestions() {
        out.push_str(&format!("suggestion: {suggestion}\n"));
    }
    out
}

/// The part of a sub-agent's run id that tells it from its siblings.
fn short_run_id(run_id: &str) -> &str {
    run_id.rsplit('.').next().unwrap_or(run_id)
}

/// A streaming tool's output (the shell's), on stderr under a bar so it
/// reads as the tool's and not the model's.
fn say_output(text: &str, indent: &str) {
    let mut shown = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        shown.push_str(indent);
        shown.push_str("│ ");
        shown.push_str(line);
        shown.push('\n');
    }
    // One write, so a permission question never lands inside the output.
    let mut err = io::stderr().lock();
    let _ = err.write_all(shown.as_bytes());
}
