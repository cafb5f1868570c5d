//! The scripted model (docs/library.md): plays a list of answers in order, so
//! runs can be tested and demonstrated without a real model or API key.
//!
//! ```json
//! [
//!   {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
//!   {"content": "The README says hello.", "delay_ms": 50, "usage": {"input_tokens": 120, "output_tokens": 8}}
//! ]
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{self, StreamExt};
use loom_core::{validate_history, FinishReason, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, Message, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One answer the scripted model gives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    /// The text of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The text as it was streamed, piece by piece (written by `--record`;
    /// when present it is played instead of splitting `content` into words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<String>>,
    /// Tools the answer asks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptToolCall>,
    /// Why the answer ended (`stop`, `tool_calls`, `length`, …); derived when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Wait this long before the answer starts (simulates a slow model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Token counts to report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ScriptUsage>,
    /// The model to say answered (a recorded provider's own name for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A tool call in a script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (an object; a string is sent as raw argument text).
    #[serde(default = "empty_object")]
    pub arguments: Value,
    /// The call id; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Token counts in a script; OpenAI's names are accepted too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptUsage {
    /// Prompt tokens.
    #[serde(default, alias = "prompt_tokens")]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default, alias = "completion_tokens")]
    pub output_tokens: u64,
    /// Prompt tokens read from a prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_input_tokens: u64,
    /// Prompt tokens written to a prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_creation_input_tokens: u64,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause (said in the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The file is not a valid script.
    #[error("invalid script {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, with the position when known.
        message: String,
    },
}

/// A model that plays a script.
#[derive(Debug)]
pub struct ScriptedModel {
    name: String,
    source: String,
    turns: Arc<[ScriptTurn]>,
    cursor: AtomicUsize,
    check_history: bool,
}

impl ScriptedModel {
    /// A model playing `turns`, named `scripted:inline`.
    pub fn new(turns: Vec<ScriptTurn>) -> Self {
        Self {
            name: "scripted:inline".to_string(),
            source: "the inline script".to_string(),
            turns: turns.into(),
            cursor: AtomicUsize::new(0),
            check_history: true,
        }
    }

    /// Loads a JSON or YAML script (YAML when the name ends in `.yaml`/`.yml`).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| ScriptError::Io {
            path: shown.clone(),
            cause,
        })?;
        let yaml = matches!(path.extension().and_then(|e| e.to_str()), Some("yaml") | Some("yml"));
        let turns = parse_script(&text, yaml).map_err(|message| ScriptError::Invalid {
            path: shown.clone(),
            message,
        })?;
        Ok(Self {
            name: format!("scripted:{shown}"),
            source: shown,
            ..Self::new(turns)
        })
    }

    /// Whether each request is checked, as real providers do, for a valid
    /// message order (on by default; the check reads the whole history).
    pub fn check_history(mut self, on: bool) -> Self {
        self.check_history = on;
        self
    }

    /// Turns played so far.
    pub fn played(&self) -> usize {
        self.cursor.load(Ordering::SeqCst).min(self.turns.len())
    }

    /// Turns in the script.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether the script has no turns.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

/// Parses script text: a list of turns, or `{"turns": [...]}`. An error
/// names the turn that is wrong (counting from 1) and what is wrong with it.
pub fn parse_script(text: &str, yaml: bool) -> Result<Vec<ScriptTurn>, String> {
    // A value first: syntax errors keep their line and column, and each turn
    // is then read on its own, so an error can say which.
    let value: Value = if yaml {
        serde_yaml::from_str(text).map_err(|err| err.to_string())?
    } else {
        serde_json::from_str(text).map_err(|err| err.to_string())?
    };
    let list = match value {
        Value::Array(list) => list,
        Value::Object(mut object) if object.contains_key("turns") => match object.remove("turns") {
            Some(Value::Array(list)) => list,
            _ => return Err("\"turns\" must be a list of turns like [{\"content\": \"…\"}]".to_string()),
        },
        _ => return Err("expected a list of turns like [{\"content\": \"…\"}] (or {\"turns\": [...]})".to_string()),
    };
    let mut turns = Vec::with_capacity(list.len());
    for (index, value) in list.into_iter().enumerate() {
        let number = index + 1;
        let turn: ScriptTurn = serde_json::from_value(value).map_err(|err| format!("turn {number}: {err}"))?;
        if turn.content.is_none() && turn.chunks.is_none() && turn.tool_calls.is_empty() {
            return Err(format!("turn {number} has neither \"content\" nor \"tool_calls\""));
        }
        turns.push(turn);
    }
    Ok(turns)
}

#[async_trait]
impl Llm for ScriptedModel {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: LlmRequest<'_>) -> Result<LlmStream, LlmError> {
        if self.check_history {
            validate_history(request.messages, false).map_err(|err| LlmError::InvalidRequest(err.to_string()))?;
        }
        // A model joining a conversation that already holds answers (a
        // resumed run, a continued session, in a new process) goes on from
        // there: on its first request, the turns the history shows as
        // assistant messages count as played. (Only then: afterwards the
        // cursor is never behind, and counting would read the whole history
        // on every call.)
        let shown = if self.cursor.load(Ordering::SeqCst) == 0 {
            request
                .messages
                .iter()
                .filter(|message| matches!(message, Message::Assistant { .. }))
                .count()
        } else {
            0
        };
        let previous = self
            .cursor
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cursor| Some(cursor.max(shown) + 1))
            .unwrap_or_else(|cursor| cursor);
        let index = previous.max(shown);
        let Some(turn) = self.turns.get(index) else {
            return Err(LlmError::ScriptExhausted {
                played: self.turns.len(),
                script: self.source.clone(),
            });
        };
        // A model offered no tools cannot call any.
        let offer_tools = !request.tools.is_empty();
        let chunks = chunks_of(turn, index, offer_tools);
        let delay = turn.delay_ms.filter(|ms| *ms > 0).map(Duration::from_millis);
        let stream = stream::iter(chunks.into_iter().map(Ok));
        Ok(match delay {
            Some(delay) => stream::once(async move {
                tokio::time::sleep(delay).await;
                stream
            })
            .flatten()
            .boxed(),
            None => stream.boxed(),
        })
    }
}

fn chunks_of(turn: &ScriptTurn, turn_index: usize, offer_tools: bool) -> Vec<LlmChunk> {
    let mut chunks = Vec::new();
    match (&turn.chunks, &turn.content) {
        (Some(pieces), _) => chunks.extend(pieces.iter().map(|piece| LlmChunk::Text(piece.clone()))),
        (None, Some(content)) => chunks.extend(words(content).map(|word| LlmChunk::Text(word.to_string()))),
        (None, None) => {}
    }
    let calls: &[ScriptToolCall] = if offer_tools { &turn.tool_calls } else { &[] };
    for (index, call) in calls.iter().enumerate() {
        let arguments = match &call.arguments {
            Value::String(raw) => raw.clone(),
            other => other.to_string(),
        };
        chunks.push(LlmChunk::ToolCallDelta {
            index,
            id: Some(call.id.clone().unwrap_or_else(|| format!("call_{turn_index}_{index}"))),
            name: Some(call.name.clone()),
            arguments,
        });
    }
    if let Some(model) = &turn.model {
        chunks.push(LlmChunk::Model(model.clone()));
    }
    if let Some(usage) = turn.usage {
        chunks.push(LlmChunk::Usage(Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_input_tokens: usage.cache_read_input_tokens,
            cache_creation_input_tokens: usage.cache_creation_input_tokens,
        }));
    }
    chunks.push(LlmChunk::Finish(match turn.finish_reason.as_deref() {
        Some("stop") => FinishReason::Stop,
        Some("tool_calls") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
        None if calls.is_empty() => FinishReason::Stop,
        None => FinishReason::ToolCalls,
    }));
    chunks
}

/// Splits text into word-sized deltas that keep their trailing whitespace,
/// so the deltas concatenate to exactly the original text.
fn words(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let after_space = rest[word_end..]
            .find(|c: char| !c.is_whitespace())
            .map_or(rest.len(), |offset| word_end + offset);
        let (word, tail) = rest.split_at(after_space);
        rest = tail;
        Some(word)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_concatenate_to_the_original() {
        for text in ["Hello world", "  lead", "a\n\nb  c ", "", "one"] {
            assert_eq!(words(text).collect::<String>(), text);
        }
        assert_eq!(words("a b").count(), 2);
    }

    #[test]
    fn parses_json_yaml_and_wrapped_forms() {
        let json = r#"[{"content":"hi","usage":{"prompt_tokens":3,"completion_tokens":1}},{"tool_calls":[{"name":"t","arguments":{"x":1},"id":"c"}],"delay_ms":5}]"#;
        let turns = parse_script(json, false).unwrap();
        assert_eq!(turns.len(), 2);
        assert_eq!(turns[0].usage.unwrap().input_tokens, 3);
        assert_eq!(turns[1].tool_calls[0].id.as_deref(), Some("c"));
        let yaml = "turns:\n  - content: hi\n  - tool_calls:\n      - name: t\n        arguments: {x: 1}\n";
        assert_eq!(parse_script(yaml, true).unwrap().len(), 2);
    }

    #[test]
    fn rejects_malformed_scripts_with_a_position_or_reason() {
        let err = parse_script("[{\"content\": }]", false).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        let err = parse_script("[{\"content\": \"a\"}, {\"contnet\": \"x\"}]", false).unwrap_err();
        assert!(err.starts_with("turn 2: unknown field `contnet`"), "{err}");
        let err = parse_script("[{\"content\": \"a\"}, {\"tool_calls\": [{\"arguments\": {}}]}]", false).unwrap_err();
        assert!(err.starts_with("turn 2: missing field `name`"), "{err}");
        let err = parse_script("turns:\n  - content: a\n  - delay_ms: fast\n", true).unwrap_err();
        assert!(err.starts_with("turn 2: invalid type"), "{err}");
        let err = parse_script("[{}]", false).unwrap_err();
        assert!(err.contains("turn 1"), "{err}");
        let err = parse_script("{\"content\": \"x\"}", false).unwrap_err();
        assert!(err.contains("expected a list of turns"), "{err}");
    }
}
