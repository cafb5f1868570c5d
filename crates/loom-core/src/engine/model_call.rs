//! One model call: start the stream, turn chunks into events, assemble the
//! answer and its tool calls, and stop at once when the run is cancelled.

use std::collections::HashMap;

use futures_util::StreamExt;
use serde_json::Value;

use crate::event::{EventKind, Phase, TurnIds};
use crate::llm::{FinishReason, LlmChunk, LlmError, LlmRequest, Usage};
use crate::machine::{guidance_block, Answer, ModelCall, TurnMachine};
use crate::message::ToolCall;
use crate::outcome::{ErrorCode, StopReason, WarningCode};

use super::driver::cancelled;
use super::Driver;

/// A complete answer of the model.
#[derive(Debug, Default)]
pub(crate) struct ModelResponse {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped, when it said.
    pub finish: Option<FinishReason>,
    /// The tokens the provider counted, when it said.
    pub usage: Option<Usage>,
    /// What the call cost, when prices are known.
    pub cost_usd: Option<f64>,
}

/// Why a model call produced no answer.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The run was cancelled (or timed out) while the call was in flight.
    Cancelled,
    /// The model failed.
    Llm(LlmError),
    /// The model's stream failed after it began (the transport retries
    /// only before that).
    BrokeOff(LlmError),
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

impl Driver {
    /// Phases 1–2 of a turn: the context (compression when needed), then
    /// the model call with this request's guidance; the answer goes to the
    /// machine. A "context length exceeded" answer compresses and retries once.
    pub(super) async fn call_model(&mut self, machine: &mut TurnMachine, call: ModelCall) {
        let engine = self.engine.clone();
        self.refresh_tools().await;
        let offered = self.tools.clone();
        let tools = if call.tools { offered.registry().specs() } else { &[] };
        let turn = machine.ids().clone();
        self.prepare_context(machine, tools, false).await;
        let guidance = guidance_block(&call.guidance);
        for part in call.guidance {
            self.events.emit(
                &turn,
                EventKind::GuidanceInjected {
                    reason: part.reason,
                    content: part.content,
                },
            );
        }
        let mut retried = false;
        let mut asked_again = false;
        let mut must_call = call.must_call && !tools.is_empty() && !self.caches.tool_choice_refused;
        loop {
            self.phase(&turn, Phase::Llm, true);
            let started = std::time::Instant::now();
            let request = LlmRequest::new(machine.memory().messages(), tools)
                .with_guidance(guidance.as_deref())
                .with_tool_call_required(must_call)
                // Asked again after a stream that broke off: at once, so a
                // server whose streaming parser failed uses its other one.
                .with_unstreamed(asked_again);
            let called = self.stream_answer(&engine, request, call.final_answer, &turn).await;
            let metrics = machine.metrics_mut();
            metrics.llm_calls += 1;
            metrics.llm_ms += started.elapsed().as_millis() as u64;
            self.phase(&turn, Phase::Llm, false);
            match called {
                Ok(response) => {
                    if let Some(usage) = &response.usage {
                        metrics.add_usage(usage);
                        if let Some(cost) = response.cost_usd {
                            *metrics.cost_usd.get_or_insert(0.0) += cost;
                        }
                        self.budget.charge(
                            usage.input_tokens,
                            usage.output_tokens,
                            response.cost_usd.unwrap_or(0.0),
                        );
                        let tokens = usage.input_tokens.saturating_add(usage.output_tokens);
                        let memory = machine.memory_mut();
                        memory.record_reported(memory.messages().len(), usize::try_from(tokens).unwrap_or(usize::MAX));
                    }
                    machine.answered(Answer {
                        content: response.content,
                        tool_calls: response.tool_calls,
                        finish: response.finish,
                    });
                    return;
                }
                Err(CallError::Cancelled) => {
                    machine.stop(self.stop_reason().unwrap_or_else(cancelled));
                    return;
                }
                Err(
                    CallError::Llm(LlmError::ContextLengthExceeded(message))
                    | CallError::BrokeOff(LlmError::ContextLengthExceeded(message)),
                ) if !retried => {
                    retried = true;
                    metrics.record_error(ErrorCode::LlmContextLength.as_str());
                    self.events.emit(
                        &turn,
                        EventKind::Error {
                            code: ErrorCode::LlmContextLength,
                            message: format!("{message}; compressing the history and retrying"),
                            recoverable: true,
                        },
                    );
                    self.prepare_context(machine, tools, true).await;
                }
                Err(CallError::Llm(err @ LlmError::BadRequest(_))) if must_call => {
                    // A server that refuses to be held to a tool call
                    // (`tool_choice`) is asked again without it, and is not
                    // asked to again in this run; the guidance's words still
                    // say what to do. A refusal for another reason fails
                    // again, and ends the run then.
                    must_call = false;
                    self.caches.tool_choice_refused = true;
                    metrics.record_error(err.code().as_str());
                    self.events.emit(
                        &turn,
                        EventKind::Error {
                            code: err.code(),
                            message: format!("{err}; asking again without requiring a tool call"),
                            recoverable: true,
                        },
                    );
                }
                Err(CallError::BrokeOff(
                    err @ (LlmError::Server { .. } | LlmError::Connection(_) | LlmError::Protocol(_)),
                )) if !asked_again => {
                    // The server failed after the answer began (before it,
                    // the transport retries): llama.cpp's streaming parser
                    // sends 500 "Invalid diff", a server that crashed cuts
                    // the stream. Nothing of the answer was used, so it is
                    // asked for once more, from the start, and not streamed
                    // (the same request streamed meets the same parser).
                    asked_again = true;
                    metrics.record_error(err.code().as_str());
                    self.events.emit(
                        &turn,
                        EventKind::Error {
                            code: err.code(),
                            message: format!("{err}; the answer broke off, asking the model again (not streamed)"),
                            recoverable: true,
                        },
                    );
                }
                Err(CallError::Llm(err) | CallError::BrokeOff(err)) => {
                    metrics.record_error(err.code().as_str());
                    machine.stop(StopReason::error(err.code(), err.to_string()));
                    return;
                }
            }
        }
    }

    /// Streams one answer from the model, turning chunks into events, and
    /// stops at once when the run is cancelled. `final_answer` names why a
    /// call offers no tools (`max_steps`, a monitor verdict), for `llm.start`.
    async fn stream_answer(
        &mut self,
        engine: &super::Engine,
        request: LlmRequest<'_>,
        final_answer: Option<&str>,
        turn: &TurnIds,
    ) -> Result<ModelResponse, CallError> {
        let cancel = self.ctx.cancel_token().clone();
        self.events.emit(
            turn,
            EventKind::LlmStart {
                model: engine.llm.model_name().to_string(),
                message_count: request.messages.len(),
                tools_offered: !request.tools.is_empty(),
                final_answer: final_answer.map(str::to_string),
            },
        );
        if cancel.is_cancelled() {
            return Err(CallError::Cancelled);
        }
        let offered: Vec<String> = request.tools.iter().map(|tool| tool.name.clone()).collect();
        let mut stream = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
            started = engine.llm.stream(request) => started.map_err(CallError::Llm)?,
        };

        let mut content = String::new();
        let mut calls: Vec<PartialCall> = Vec::new();
        // The provider's call index → our slot (see `PartialCall::slot`).
        let mut slots: HashMap<usize, usize> = HashMap::new();
        let mut usage: Option<Usage> = None;
        let mut finish: Option<FinishReason> = None;
        let mut response_model: Option<String> = None;
        loop {
            let chunk = tokio::select! {
                biased;
                // Dropping the stream aborts the provider's request.
                _ = cancel.cancelled() => return Err(CallError::Cancelled),
                chunk = stream.next() => chunk,
            };
            match chunk {
                None => break,
                Some(Err(err)) => return Err(CallError::BrokeOff(err)),
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
                    let call = PartialCall::slot(&mut calls, &mut slots, index, id.as_deref(), name.as_deref());
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
                Some(Ok(LlmChunk::Model(model))) => response_model = Some(model),
                Some(Ok(LlmChunk::Finish(reason))) => finish = Some(reason),
            }
        }

        if calls.is_empty() && !offered.is_empty() {
            self.recover_written_calls(turn, &offered, &mut content, &mut calls, &mut finish);
        }
        // A stray `{` or `}` beside a call is no text: kept in the
        // history, the model reads it back and copies it.
        if !calls.is_empty() && !content.chars().any(char::is_alphanumeric) {
            content.clear();
        }
        let cost_usd = usage
            .as_ref()
            .and_then(|reported| engine.pricing.as_ref().map(|pricing| pricing.cost(reported)));
        let tool_calls: Vec<ToolCall> = calls
            .into_iter()
            // A provider may leave holes in the indices; a hole is no call.
            .filter(|call| call.id.is_some() || !call.name.is_empty() || !call.arguments.is_empty())
            .enumerate()
            .map(|(index, call)| finish_call(index, call, turn, &mut self.caches.call_ids))
            .collect();
        self.events.emit(
            turn,
            EventKind::LlmFinish {
                content: content.clone(),
                usage,
                finish_reason: finish.as_ref().map(|reason| reason.as_str().to_string()),
                cost_usd,
                tool_call_count: tool_calls.len(),
                response_model,
            },
        );
        Ok(ModelResponse {
            content,
            tool_calls,
            finish,
            usage,
            cost_usd,
        })
    }
}

impl Driver {
    /// Calls the model wrote as text to offered tools (its server did not
    /// parse them: see [`crate::written_calls`]) become the answer's calls,
    /// and the text keeps what is left; a `warning` says so.
    fn recover_written_calls(
        &self,
        turn: &TurnIds,
        offered: &[String],
        content: &mut String,
        calls: &mut Vec<PartialCall>,
        finish: &mut Option<FinishReason>,
    ) {
        let Some(written) = crate::written_calls::recover(content, |name| offered.iter().any(|tool| tool == name))
        else {
            return;
        };
        let names: Vec<&str> = written.calls.iter().map(|(name, _)| name.as_str()).collect();
        self.events.emit(
            turn,
            EventKind::Warning {
                code: WarningCode::CallsFromText,
                message: format!(
                    "the model wrote {} tool call{} as text ({}); {} made as calls",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", "),
                    if names.len() == 1 { "it is" } else { "they are" },
                ),
            },
        );
        *calls = written
            .calls
            .into_iter()
            .map(|(name, arguments)| PartialCall {
                id: None,
                name,
                arguments: arguments.to_string(),
            })
            .collect();
        *content = written.rest;
        if *finish == Some(FinishReason::Stop) {
            *finish = Some(FinishReason::ToolCalls);
        }
    }
}

impl PartialCall {
    /// The call a delta for the provider's call `index` belongs to. Some
    /// servers number every call 0: a delta that brings a name and a new id
    /// for an index whose call already has another id and a name starts a
    /// new call. (The index comes from the network: it only keys a map.)
    fn slot<'a>(
        calls: &'a mut Vec<PartialCall>,
        slots: &mut HashMap<usize, usize>,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
    ) -> &'a mut PartialCall {
        let current = slots.get(&index).copied();
        let starts_another = name.is_some_and(|n| !n.is_empty())
            && id.filter(|id| !id.is_empty()).is_some_and(|id| {
                current
                    .and_then(|slot| calls.get(slot))
                    .is_some_and(|call| !call.name.is_empty() && call.id.as_deref().is_some_and(|known| known != id))
            });
        let slot = match current {
            Some(slot) if !starts_another => slot,
            // Calls keep the order in which they first appear.
            _ => {
                calls.push(PartialCall::default());
                slots.insert(index, calls.len() - 1);
                calls.len() - 1
            }
        };
        &mut calls[slot]
    }
}

/// An id for a call the provider gave none (or a used one): nine letters
/// and digits, the only shape Mistral's chat templates accept (they raise
/// on any other), taken from the turn's random id and the call's index.
fn invented_call_id(turn_id: &str, index: usize, attempt: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let window: String = turn_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .skip(attempt)
        .take(7)
        .collect();
    let mut id = window.clone();
    id.push(DIGITS[(index / 36) % 36] as char);
    id.push(DIGITS[index % 36] as char);
    if window.len() < 7 || index >= 36 * 36 {
        // Out of windows or of two-digit indexes (never in practice): longer, still unique.
        id.push_str(&format!("{index}x{attempt}"));
    }
    id
}

/// The finished call, with an id that is unique in the run: a provider's id
/// that is missing, empty or already used (in this answer or earlier) is
/// replaced, so every result pairs with the right call.
fn finish_call(
    index: usize,
    call: PartialCall,
    turn: &TurnIds,
    taken: &mut std::collections::HashSet<String>,
) -> ToolCall {
    let arguments = if call.arguments.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        // Invalid JSON is kept as text; the validate stage reports it to the model.
        crate::json_strict::parse_strict(&call.arguments).unwrap_or(Value::String(call.arguments))
    };
    // Arguments copied from an escaped earlier call, read back into the
    // object the model meant: the history keeps that, so the model is not
    // shown its own escaped copy to copy again.
    let arguments = crate::escaped_args::repaired(&arguments).unwrap_or(arguments);
    let id = match call.id {
        Some(id) if !id.trim().is_empty() && !taken.contains(&id) => id,
        _ => (0..)
            .map(|attempt| invented_call_id(&turn.turn_id, index, attempt))
            .find(|id| !taken.contains(id))
            .unwrap_or_default(),
    };
    taken.insert(id.clone());
    ToolCall {
        id,
        name: call.name,
        arguments,
    }
}
