//! `--record`: wraps a model and writes its answers in the scripted-model
//! format (docs/library.md, the scripted model), so a real run replays offline with `scripted:PATH`.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::stream::{self, StreamExt};
use loom_core::{json_strict, Llm, LlmChunk, LlmError, LlmRequest, LlmStream};
use serde_json::Value;

use crate::scripted::{ScriptToolCall, ScriptTurn, ScriptUsage};

/// A model whose every complete answer is appended to a script file.
pub struct Recorder {
    inner: Arc<dyn Llm>,
    path: PathBuf,
    turns: Arc<tokio::sync::Mutex<Vec<ScriptTurn>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("model", &self.inner.model_name())
            .field("path", &self.path)
            .finish()
    }
}

impl Recorder {
    /// Records `inner`'s answers to `path` (rewritten after each answer).
    pub fn new(inner: Arc<dyn Llm>, path: impl Into<PathBuf>) -> Self {
        Self {
            inner,
            path: path.into(),
            turns: Arc::default(),
        }
    }
}

#[derive(Default)]
struct Answer {
    chunks: Vec<String>,
    calls: Vec<(Option<String>, String, String)>,
    /// The provider's index of each of `calls`.
    indices: Vec<usize>,
    usage: Option<ScriptUsage>,
    finish: Option<String>,
    model: Option<String>,
}

impl Answer {
    fn add(&mut self, chunk: &LlmChunk) {
        match chunk {
            LlmChunk::Text(text) => self.chunks.push(text.clone()),
            LlmChunk::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                // Calls in the order they first appear; the index (from the
                // network) only identifies them.
                let slot = match self.indices.iter().position(|known| known == index) {
                    Some(slot) => slot,
                    None => {
                        self.indices.push(*index);
                        self.calls.push(Default::default());
                        self.calls.len() - 1
                    }
                };
                let call = &mut self.calls[slot];
                if id.is_some() {
                    call.0 = id.clone();
                }
                if let Some(name) = name {
                    call.1.push_str(name);
                }
                call.2.push_str(arguments);
            }
            LlmChunk::Usage(usage) => {
                self.usage = Some(ScriptUsage {
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    cache_read_input_tokens: usage.cache_read_input_tokens,
                    cache_creation_input_tokens: usage.cache_creation_input_tokens,
                })
            }
            LlmChunk::Model(model) => self.model = Some(model.clone()),
            LlmChunk::Finish(reason) => self.finish = Some(reason.as_str().to_string()),
        }
    }

    fn into_turn(self) -> ScriptTurn {
        let content: String = self.chunks.concat();
        ScriptTurn {
            content: Some(content),
            chunks: Some(self.chunks),
            tool_calls: self
                .calls
                .into_iter()
                .map(|(id, name, arguments)| ScriptToolCall {
                    name,
                    // Arguments that were not valid JSON are kept as text, so
                    // the replay shows the model the same mistake.
                    arguments: if arguments.trim().is_empty() {
                        Value::Object(Default::default())
                    } else {
                        json_strict::parse_strict(&arguments).unwrap_or(Value::String(arguments))
                    },
                    id,
                })
                .collect(),
            finish_reason: self.finish,
            delay_ms: None,
            usage: self.usage,
            model: self.model,
        }
    }
}

struct Recording {
    inner: LlmStream,
    answer: Answer,
    turns: Arc<tokio::sync::Mutex<Vec<ScriptTurn>>>,
    path: PathBuf,
    done: bool,
}

#[async_trait]
impl Llm for Recorder {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    async fn stream(&self, request: LlmRequest<'_>) -> Result<LlmStream, LlmError> {
        let inner = self.inner.stream(request).await?;
        let state = Recording {
            inner,
            answer: Answer::default(),
            turns: self.turns.clone(),
            path: self.path.clone(),
            done: false,
        };
        Ok(stream::unfold(state, |mut state| async move {
            if state.done {
                return None;
            }
            match state.inner.next().await {
                Some(Ok(chunk)) => {
                    state.answer.add(&chunk);
                    Some((Ok(chunk), state))
                }
                Some(Err(err)) => {
                    // A failed answer is not recorded: a replay would not
                    // know what the model would have said.
                    state.done = true;
                    Some((Err(err), state))
                }
                None => {
                    state.done = true;
                    let answer = std::mem::take(&mut state.answer);
                    let text = {
                        let mut turns = state.turns.lock().await;
                        turns.push(answer.into_turn());
                        serde_json::to_string_pretty(&*turns)
                    };
                    let written = match text {
                        Ok(text) => tokio::fs::write(&state.path, text + "\n")
                            .await
                            .map_err(|e| e.to_string()),
                        Err(err) => Err(err.to_string()),
                    };
                    match written {
                        Ok(()) => None,
                        Err(err) => Some((
                            Err(LlmError::Protocol(format!(
                                "cannot write the recording {}: {err}",
                                state.path.display()
                            ))),
                            state,
                        )),
                    }
                }
            }
        })
        .boxed())
    }
}
