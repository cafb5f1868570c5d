//! One model call: start the stream, turn chunks into events, assemble the
//! answer and its tool calls, and stop at once when the run is cancelled.

use futures_util::StreamExt;
use serde_json::Value;

use crate::event::{EventKind, TurnIds};
use crate::llm::{FinishReason, LlmChunk, LlmError, LlmRequest, ToolSpec, Usage};
use crate::message::{Message, ToolCall};

use super::Run;

/// A complete answer of the model.
#[derive(Debug, Default)]
pub(crate) struct ModelResponse {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// Why a model call produced no answer.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The run was cancelled (or timed out) while the call was in flight.
    Cancelled,
    /// The model failed.
    Llm(LlmError),
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

impl Run {
    /// Streams one answer from the model for `messages`, offering `tools`.
    pub(crate) async fn call_model(
        &mut self,
        messages: &[Message],
        tools: &[ToolSpec],
        turn: &TurnIds,
    ) -> Result<ModelResponse, CallError> {
        let engine = self.engine.clone();
        let cancel = self.ctx.cancel_token().clone();
        self.metrics.llm_calls += 1;
        let started = std::time::Instant::now();
        let answer = self.stream_answer(&engine, &cancel, messages, tools, turn).await;
        self.metrics.llm_ms += started.elapsed().as_millis() as u64;
        answer
    }

    async fn stream_answer(
        &mut self,
        engine: &super::Engine,
        cancel: &tokio_util::sync::CancellationToken,
        messages: &[Message],
        tools: &[ToolSpec],
        turn: &TurnIds,
    ) -> Result<ModelResponse, CallError> {
        self.events.emit(
            turn,
            EventKind::LlmStart {
                model: engine.llm.model_name().to_string(),
                message_count: messages.len(),
                tools_offered: !tools.is_empty(),
            },
        );
        if cancel.is_cancelled() {
            return Err(CallError::Cancelled);
        }
        let request = LlmRequest { messages, tools };
        let mut stream = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
            started = engine.llm.stream(request) => started.map_err(CallError::Llm)?,
        };

        let mut content = String::new();
        let mut calls: Vec<PartialCall> = Vec::new();
        let mut usage: Option<Usage> = None;
        let mut finish: Option<FinishReason> = None;
        loop {
            let chunk = tokio::select! {
                biased;
                // Dropping the stream aborts the provider's request.
                _ = cancel.cancelled() => return Err(CallError::Cancelled),
                chunk = stream.next() => chunk,
            };
            match chunk {
                None => break,
                Some(Err(err)) => return Err(CallError::Llm(err)),
                Some(Ok(LlmChunk::Text(text))) => {
                    if text.is_empty() {
                        continue;
                    }
                    content.push_str(&text);
                    self.events.emit(turn, EventKind::LlmDelta { text });
                }
                Some(Ok(LlmChunk::ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                })) => {
                    if calls.len() <= index {
                        calls.resize_with(index + 1, PartialCall::default);
                    }
                    let call = &mut calls[index];
                    if let Some(id) = id.filter(|id| !id.is_empty()) {
                        call.id = Some(id);
                    }
                    if let Some(name) = name {
                        call.name.push_str(&name);
                    }
                    call.arguments.push_str(&arguments);
                }
                Some(Ok(LlmChunk::Usage(reported))) => {
                    usage = Some(reported);
                }
                Some(Ok(LlmChunk::Finish(reason))) => finish = Some(reason),
            }
        }

        let mut cost_usd = None;
        if let Some(reported) = &usage {
            self.metrics.add_usage(reported);
            if let Some(pricing) = &engine.pricing {
                let cost = pricing.cost(reported);
                cost_usd = Some(cost);
                *self.metrics.cost_usd.get_or_insert(0.0) += cost;
            }
        }
        let tool_calls: Vec<ToolCall> = calls
            .into_iter()
            .enumerate()
            // A provider may leave holes in the indices; a hole is no call.
            .filter(|(_, call)| call.id.is_some() || !call.name.is_empty() || !call.arguments.is_empty())
            .map(|(index, call)| finish_call(index, call, turn))
            .collect();
        self.events.emit(
            turn,
            EventKind::LlmFinish {
                content: content.clone(),
                usage,
                finish_reason: finish.map(|reason| reason.as_str().to_string()),
                cost_usd,
                tool_call_count: tool_calls.len(),
            },
        );
        Ok(ModelResponse { content, tool_calls })
    }
}

fn finish_call(index: usize, call: PartialCall, turn: &TurnIds) -> ToolCall {
    let arguments = if call.arguments.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        // Invalid JSON is kept as text; the validate stage reports it to the model.
        crate::json_strict::parse_strict(&call.arguments).unwrap_or(Value::String(call.arguments))
    };
    let id = call.id.unwrap_or_else(|| {
        let turn_prefix: String = turn.turn_id.chars().take(8).collect();
        format!("call_{turn_prefix}_{index}")
    });
    ToolCall {
        id,
        name: call.name,
        arguments,
    }
}
