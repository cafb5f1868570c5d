//! Tool calls written as text, for models without native tool calling:
//! the tools are described in the system prompt, the model answers with
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, and this module
//! turns those blocks back into tool calls as the text streams in.

use std::collections::VecDeque;

use futures_util::stream::{self, StreamExt};
use loom_core::{FinishReason, LlmChunk, LlmError, LlmStream, ToolSpec};
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A call as the text-only model writes it: `<tool_call>{"name": …, "arguments": …}</tool_call>`.
pub(crate) fn write_call(f: &mut std::fmt::Formatter<'_>, call: &loom_core::ToolCall) -> std::fmt::Result {
    let name = serde_json::to_string(&call.name).map_err(|_| std::fmt::Error)?;
    write!(f, "{OPEN}{{\"name\":{name},\"arguments\":{}}}{CLOSE}", call.arguments)
}

/// A result as the text-only model reads it: a `<tool_result>` block.
pub(crate) fn write_result(f: &mut std::fmt::Formatter<'_>, name: &str, id: &str, content: &str) -> std::fmt::Result {
    write!(
        f,
        "<tool_result name=\"{name}\" id=\"{id}\">\n{content}\n</tool_result>"
    )
}

/// The instructions that describe `tools` to a text-only model (added to
/// the system prompt).
pub(crate) fn instructions(tools: &[ToolSpec]) -> String {
    let list: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    format!(
        "You can call tools. To call one, write exactly:\n{OPEN}{{\"name\": \"TOOL\", \"arguments\": {{...}}}}{CLOSE}\n\
         You may write several such blocks. After your calls, stop and wait: each result comes back \
         in a <tool_result> block. When you need no tool, answer in plain text.\nTools:\n{}",
        serde_json::to_string_pretty(&list).unwrap_or_default()
    )
}

/// Reads `<tool_call>` blocks out of a text stream.
pub struct TextToolCalls {
    inner: Option<LlmStream>,
    buffer: String,
    in_call: bool,
    calls: usize,
    pending: VecDeque<Result<LlmChunk, LlmError>>,
}

impl TextToolCalls {
    /// Wraps a provider's stream.
    pub fn wrap(inner: LlmStream) -> LlmStream {
        let state = Self {
            inner: Some(inner),
            buffer: String::new(),
            in_call: false,
            calls: 0,
            pending: VecDeque::new(),
        };
        stream::unfold(state, |mut state| async move {
            loop {
                if let Some(item) = state.pending.pop_front() {
                    return Some((item, state));
                }
                let inner = state.inner.as_mut()?;
                match inner.next().await {
                    Some(Ok(LlmChunk::Text(text))) => {
                        state.buffer.push_str(&text);
                        state.scan(false);
                    }
                    Some(Ok(LlmChunk::Finish(reason))) => {
                        state.scan(true);
                        let reason = match reason {
                            FinishReason::Stop if state.calls > 0 => FinishReason::ToolCalls,
                            other => other,
                        };
                        state.pending.push_back(Ok(LlmChunk::Finish(reason)));
                    }
                    Some(other) => state.pending.push_back(other),
                    None => {
                        state.scan(true);
                        state.inner = None;
                    }
                }
            }
        })
        .boxed()
    }

    /// Moves what is certain out of the buffer: text before a call, and
    /// whole calls. At the end (`flush`) everything left goes out.
    fn scan(&mut self, flush: bool) {
        loop {
            if self.in_call {
                match self.buffer.find(CLOSE) {
                    Some(end) => {
                        let body = self.buffer[..end].to_string();
                        self.buffer.drain(..end + CLOSE.len());
                        self.in_call = false;
                        self.emit_call(&body);
                    }
                    None if flush => {
                        // An unterminated block: still a call, probably cut short.
                        let body = std::mem::take(&mut self.buffer);
                        self.in_call = false;
                        self.emit_call(&body);
                        return;
                    }
                    None => return,
                }
            } else if let Some(start) = self.buffer.find(OPEN) {
                self.emit_text(start);
                self.buffer.drain(..OPEN.len());
                self.in_call = true;
            } else {
                // Hold back a tail that may be the start of "<tool_call>".
                let keep = if flush { 0 } else { partial_tag_len(&self.buffer) };
                self.emit_text(self.buffer.len() - keep);
                return;
            }
        }
    }

    fn emit_text(&mut self, upto: usize) {
        if upto > 0 {
            let text: String = self.buffer.drain(..upto).collect();
            if !text.trim().is_empty() || self.calls == 0 {
                self.pending.push_back(Ok(LlmChunk::Text(text)));
            }
        }
    }

    fn emit_call(&mut self, body: &str) {
        let parsed: Option<Value> = serde_json::from_str(body.trim()).ok();
        let (name, arguments) = match &parsed {
            Some(value) => (
                value["name"].as_str().unwrap_or_default().to_string(),
                match &value["arguments"] {
                    Value::Null => "{}".to_string(),
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                },
            ),
            // Not JSON: the validate stage tells the model what is wrong.
            None => (String::new(), body.trim().to_string()),
        };
        self.pending.push_back(Ok(LlmChunk::ToolCallDelta {
            index: self.calls,
            id: None,
            name: Some(name),
            arguments,
        }));
        self.calls += 1;
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `<tool_call>`.
fn partial_tag_len(text: &str) -> usize {
    (1..OPEN.len())
        .rev()
        .find(|&len| {
            text.len() >= len && text.is_char_boundary(text.len() - len) && OPEN.starts_with(&text[text.len() - len..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(pieces: &[&str]) -> Vec<LlmChunk> {
        let mut chunks: Vec<Result<LlmChunk, LlmError>> =
            pieces.iter().map(|p| Ok(LlmChunk::Text(p.to_string()))).collect();
        chunks.push(Ok(LlmChunk::Finish(FinishReason::Stop)));
        TextToolCalls::wrap(stream::iter(chunks).boxed())
            .map(|c| c.unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn reads_calls_split_across_pieces() {
        let out = run(&[
            "Let me look.\n<tool_",
            "call>{\"name\": \"read_file\", \"argu",
            "ments\": {\"path\": \"a.txt\"}}</tool_call><tool_call>{\"name\":\"list_dir\"}</tool_call>",
        ])
        .await;
        assert_eq!(out[0], LlmChunk::Text("Let me look.\n".into()));
        assert_eq!(
            out[1],
            LlmChunk::ToolCallDelta {
                index: 0,
                id: None,
                name: Some("read_file".into()),
                arguments: "{\"path\":\"a.txt\"}".into()
            }
        );
        assert!(
            matches!(&out[2], LlmChunk::ToolCallDelta { index: 1, name: Some(n), arguments, .. } if n == "list_dir" && arguments == "{}")
        );
        assert_eq!(out.last(), Some(&LlmChunk::Finish(FinishReason::ToolCalls)));
    }

    #[tokio::test]
    async fn plain_text_and_lookalikes_pass_through() {
        let out = run(&["a < b and <tool", " is not a tag"]).await;
        let text: String = out
            .iter()
            .filter_map(|c| match c {
                LlmChunk::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "a < b and <tool is not a tag");
        assert_eq!(out.last(), Some(&LlmChunk::Finish(FinishReason::Stop)));
    }
}
