//! `tt`: one turn of the run (seed 000), ending in a base case or a tail call.

use std::time::Instant;

use crate::context::{RunContext, StopCause};
use crate::event::{CallSummary, EventKind, TurnIds};
use crate::feedback::MAX_ITERATIONS_MESSAGE;
use crate::llm::LlmError;
use crate::memory::Memory;
use crate::message::{Message, ToolCall};
use crate::pipeline::{BatchEnv, ToolPipeline};
use crate::resume::CallRepair;
use crate::tool_result::ToolResult;
use crate::turn_state::TurnState;

use super::model_call::{CallError, ModelResponse};
use super::Run;

/// How one turn ended. The driver appends `new_messages` to the history in
/// every case, so the transcript stays valid even when a run is stopped.
#[derive(Debug)]
pub enum TurnOutcome {
    /// Tail call: run the next turn with this state.
    Recurse {
        /// The next turn's state.
        next: TurnState,
        /// Messages this turn added.
        new_messages: Vec<Message>,
    },
    /// Base case: the model answered.
    Finish {
        /// The answer.
        content: String,
        /// Messages this turn added.
        new_messages: Vec<Message>,
    },
    /// Base case: the run must end without an answer.
    Stop {
        /// Why.
        reason: StopReason,
        /// Messages this turn added.
        new_messages: Vec<Message>,
    },
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// The whole run's limit.
    Run,
    /// One turn's limit.
    Step,
}

/// Why a run ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Cancelled from outside.
    Cancelled(String),
    /// A deadline passed.
    Timeout(TimeoutKind),
    /// The turn limit was reached and the final call gave no answer either.
    MaxStepsWithoutAnswer,
    /// A fatal error (the model failed).
    Error {
        /// Machine-readable code.
        code: String,
        /// What happened.
        message: String,
    },
}

/// Added to the final-answer instruction: what the model must do now.
const FINAL_ANSWER_SUFFIX: &str = "Do not call any more tools. Using only the information you already have, \
give your best final answer now, and say briefly what remains unfinished, if anything.";

/// Turn metadata key set when the monitor ends the tool phase.
const TERMINATE_KEY: &str = "loom.terminate";

impl Run {
    /// Handles exactly one turn.
    pub(crate) async fn tt(&mut self, memory: &mut Memory, state: &TurnState, ctx: &RunContext) -> TurnOutcome {
        let turn = TurnIds::of(state);

        // Phase 0: control.
        if let Some(reason) = self.stop_reason(ctx) {
            return stop(reason, Vec::new());
        }
        if ctx.deadline().is_some_and(|deadline| Instant::now() >= deadline) {
            ctx.stop(StopCause::RunTimeout);
            return stop(StopReason::Timeout(TimeoutKind::Run), Vec::new());
        }
        if !self.wait_while_paused(ctx).await {
            return stop(self.stop_reason(ctx).unwrap_or_else(cancelled), Vec::new());
        }

        self.metrics.iterations += 1;
        self.events.emit(
            &turn,
            EventKind::IterationStart {
                iteration: state.turn_counter(),
            },
        );

        // The step deadline covers the model call and the turn's tools.
        let step_deadline = ctx
            .limits()
            .step_timeout
            .map(|limit| (Instant::now() + limit, StopCause::StepTimeout));
        let deadline = match (step_deadline, ctx.deadline()) {
            (Some((step, _)), Some(run)) if run < step => Some((run, StopCause::RunTimeout)),
            (None, Some(run)) => Some((run, StopCause::RunTimeout)),
            (step, _) => step,
        };

        let terminate = state
            .metadata()
            .get(TERMINATE_KEY)
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let work = async {
            // The hard step limit comes first; then a verdict of the monitor.
            if state.is_final() {
                self.events.emit(
                    &turn,
                    EventKind::MaxIterationsReached {
                        turn_counter: state.turn_counter(),
                        max_iterations: state.max_iterations(),
                    },
                );
                self.final_answer_turn(memory, MAX_ITERATIONS_MESSAGE, state, &turn, ctx)
                    .await
            } else if let Some(message) = terminate {
                self.final_answer_turn(memory, &message, state, &turn, ctx).await
            } else {
                self.tool_turn(memory, state, &turn, ctx).await
            }
        };
        tokio::pin!(work);
        let Some((at, cause)) = deadline else {
            return work.await;
        };
        tokio::select! {
            biased;
            outcome = &mut work => outcome,
            _ = tokio::time::sleep_until(at.into()) => {
                // Stop the run, then let the turn wind down so every running
                // tool gets a result and the transcript stays valid.
                ctx.stop(cause);
                work.await
            }
        }
    }

    async fn tool_turn(
        &mut self,
        memory: &mut Memory,
        state: &TurnState,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> TurnOutcome {
        let engine = self.engine.clone();
        let tools = engine.pipeline.registry().specs();
        let (response, compacted) = match self.model_phase(memory, None, tools, turn, ctx).await {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };

        if response.tool_calls.is_empty() {
            let mut new_messages = vec![Message::assistant(response.content.clone())];
            let steering = self.take_steering();
            if steering.is_empty() {
                return TurnOutcome::Finish {
                    content: response.content,
                    new_messages,
                };
            }
            // The person spoke while the model answered: their message gets a turn.
            new_messages.extend(steering.into_iter().map(Message::user));
            return self.recurse(state, turn, new_messages, compacted);
        }

        let calls = response.tool_calls;
        self.events.emit(
            turn,
            EventKind::ToolCallsStart {
                calls: calls
                    .iter()
                    .map(|call| CallSummary {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        args: call.arguments.clone(),
                    })
                    .collect(),
            },
        );
        let assistant = Message::Assistant {
            content: response.content.clone(),
            tool_calls: calls.clone(),
        };
        // With a store, the calls are saved before any of them runs, so a
        // crash mid-tools leaves the calls (and the journal) to resume from.
        let saved_early = engine.store.is_some();
        if saved_early {
            memory.push(assistant.clone());
            if let Err(reason) = self.checkpoint(memory, state).await {
                return stop(reason, Vec::new());
            }
        }
        self.phase(turn, "tools", true);
        let results = self.run_tools(&engine.pipeline, &calls, turn, ctx).await;
        self.phase(turn, "tools", false);
        self.events
            .emit(turn, EventKind::ToolCallsComplete { count: results.len() });
        let new_messages = if saved_early { Vec::new() } else { vec![assistant] };
        self.after_tools(
            state,
            turn,
            ctx,
            &response.content,
            &calls,
            results,
            new_messages,
            compacted,
        )
    }

    /// Finishes a turn whose calls were checkpointed but whose process died
    /// before their results were (see [`crate::resume`]): recorded results
    /// are reused, calls that may have had an effect get an "interrupted"
    /// result, and only calls that never started or are read-only run.
    pub(crate) async fn resume_tool_turn(
        &mut self,
        memory: &mut Memory,
        state: &TurnState,
        ctx: &RunContext,
        journal: &[crate::store::JournalEntry],
    ) -> TurnOutcome {
        let engine = self.engine.clone();
        let turn = TurnIds::of(state);
        let content = match memory.messages().last() {
            Some(Message::Assistant { content, .. }) => content.clone(),
            _ => String::new(),
        };
        let dangling = crate::resume::dangling_calls(memory.messages());
        let repairs = crate::resume::plan(&dangling, journal);
        let rerun: Vec<ToolCall> = repairs
            .iter()
            .filter_map(|repair| match repair {
                CallRepair::Rerun(call) => Some(call.clone()),
                _ => None,
            })
            .collect();

        self.phase(&turn, "tools", true);
        let mut rerun_results = self.run_tools(&engine.pipeline, &rerun, &turn, ctx).await.into_iter();
        let mut results = Vec::with_capacity(repairs.len());
        for repair in repairs {
            let result = match repair {
                // The pipeline answers every call; the fallback only keeps the
                // history valid should it ever not.
                CallRepair::Rerun(call) => rerun_results
                    .next()
                    .unwrap_or_else(|| crate::resume::not_run_result(&call)),
                CallRepair::Recorded(result) | CallRepair::Interrupted(result) => {
                    self.record_tool_metrics(&result);
                    self.events.emit(&turn, EventKind::tool_result(&result));
                    result
                }
            };
            results.push(result);
        }
        self.phase(&turn, "tools", false);
        self.events
            .emit(&turn, EventKind::ToolCallsComplete { count: results.len() });
        // Calls answered before the checkpoint (none with Loom's own
        // checkpoints, but a history may come from elsewhere) stay as they are.
        self.after_tools(state, &turn, ctx, &content, &dangling, results, Vec::new(), false)
    }

    /// Phases 3–4 after the calls ran: tool messages, the step, feedback,
    /// steering, and the tail call.
    #[allow(clippy::too_many_arguments)]
    fn after_tools(
        &mut self,
        state: &TurnState,
        turn: &TurnIds,
        ctx: &RunContext,
        content: &str,
        calls: &[ToolCall],
        results: Vec<ToolResult>,
        mut new_messages: Vec<Message>,
        compacted: bool,
    ) -> TurnOutcome {
        new_messages.reserve(results.len() + 4);
        new_messages.extend(
            results
                .iter()
                .map(|result| Message::tool(&result.call_id, &result.name, &result.content)),
        );

        if let Some(reason) = self.stop_reason(ctx) {
            return stop(reason, new_messages);
        }
        self.steps += 1;
        self.events.emit(
            turn,
            EventKind::StepCompleted {
                step: self.steps,
                max_steps: state.max_iterations(),
                elapsed_seconds: ctx.elapsed().as_secs_f64(),
            },
        );

        // Phase 4: feedback, placed after the tool messages (seed 003).
        self.monitor.observe(content, calls, &results);
        new_messages.extend(self.guidance(&results, state, turn));
        let verdict = self.monitor.check(state.turn_counter() + 1, state.max_iterations());
        for (reason, message) in verdict.warnings {
            self.events.emit(
                turn,
                EventKind::GuidanceInjected {
                    reason: reason.to_string(),
                    content: message.clone(),
                },
            );
            new_messages.push(Message::system(message));
        }
        new_messages.extend(self.take_steering().into_iter().map(Message::user));
        let mut outcome = self.recurse(state, turn, new_messages, compacted);
        if let (Some(termination), TurnOutcome::Recurse { next, .. }) = (verdict.terminate, &mut outcome) {
            self.events.emit(
                turn,
                EventKind::GuidanceInjected {
                    reason: termination.reason().to_string(),
                    content: termination.message().to_string(),
                },
            );
            *next = next.with_metadata(
                TERMINATE_KEY,
                serde_json::Value::String(termination.message().to_string()),
            );
        }
        outcome
    }

    /// One last call without tools (seed 004): at the step limit, or when
    /// the monitor ended the tool phase.
    async fn final_answer_turn(
        &mut self,
        memory: &mut Memory,
        reason: &str,
        _state: &TurnState,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> TurnOutcome {
        let instruction = Message::system(format!("{reason}\n{FINAL_ANSWER_SUFFIX}"));
        let (response, _) = match self.model_phase(memory, Some(&instruction), &[], turn, ctx).await {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };
        let answer = response.content;
        let new_messages = vec![instruction, Message::assistant(answer.clone())];
        if answer.trim().is_empty() {
            return stop(StopReason::MaxStepsWithoutAnswer, new_messages);
        }
        TurnOutcome::Finish {
            content: answer,
            new_messages,
        }
    }

    /// Phases 1–2: context (compression when needed), then the model call.
    /// A "context length exceeded" answer compresses and retries once.
    async fn model_phase(
        &mut self,
        memory: &mut Memory,
        extra: Option<&Message>,
        tools: &[crate::llm::ToolSpec],
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> Result<(ModelResponse, bool), TurnOutcome> {
        let mut compacted = self.prepare_context(memory, tools, turn, ctx, false).await;
        let mut retried = false;
        loop {
            self.phase(turn, "llm", true);
            let called = match extra {
                Some(extra) => {
                    let mut messages = memory.messages().to_vec();
                    messages.push(extra.clone());
                    self.call_model(&messages, tools, turn).await
                }
                None => self.call_model(memory.messages(), tools, turn).await,
            };
            self.phase(turn, "llm", false);
            match called {
                Ok(response) => return Ok((response, compacted)),
                Err(CallError::Cancelled) => {
                    return Err(stop(self.stop_reason(ctx).unwrap_or_else(cancelled), Vec::new()))
                }
                Err(CallError::Llm(LlmError::ContextLengthExceeded(message))) if !retried => {
                    retried = true;
                    self.metrics.record_error("LLM_CONTEXT_LENGTH");
                    self.events.emit(
                        turn,
                        EventKind::Error {
                            code: "LLM_CONTEXT_LENGTH".to_string(),
                            message: format!("{message}; compressing the history and retrying"),
                            recoverable: true,
                        },
                    );
                    compacted |= self.prepare_context(memory, tools, turn, ctx, true).await;
                }
                Err(CallError::Llm(err)) => {
                    self.metrics.record_error(err.code());
                    return Err(stop(
                        StopReason::Error {
                            code: err.code().to_string(),
                            message: err.to_string(),
                        },
                        Vec::new(),
                    ));
                }
            }
        }
    }

    /// Runs the turn's calls through the pipeline; every call gets exactly
    /// one result, in call order, also when the run is cancelled.
    async fn run_tools(
        &mut self,
        pipeline: &ToolPipeline,
        calls: &[ToolCall],
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> Vec<ToolResult> {
        let env = BatchEnv {
            ctx,
            workspace: &self.workspace,
            events: &self.events,
            turn,
            gate: &self.gate,
            store: self.engine.store.as_ref(),
        };
        let results = pipeline.run_batch(calls, &env).await;
        for result in &results {
            self.record_tool_metrics(result);
        }
        results
    }

    fn record_tool_metrics(&mut self, result: &ToolResult) {
        self.metrics.record_tool(
            &result.name,
            result.status.is_failure(),
            result.metadata.error_kind.as_deref(),
            result.metadata.duration_ms,
        );
    }

    fn recurse(
        &mut self,
        state: &TurnState,
        turn: &TurnIds,
        new_messages: Vec<Message>,
        compacted: bool,
    ) -> TurnOutcome {
        let next = state.next_turn(compacted);
        self.events.emit(
            turn,
            EventKind::Recursion {
                from_turn: state.turn_counter(),
                to_turn: next.turn_counter(),
                recursion_depth: next.turn_counter(),
            },
        );
        TurnOutcome::Recurse { next, new_messages }
    }

    pub(crate) fn phase(&self, turn: &TurnIds, phase: &str, start: bool) {
        let phase = phase.to_string();
        let kind = if start {
            EventKind::PhaseStart { phase }
        } else {
            EventKind::PhaseEnd { phase }
        };
        self.events.emit(turn, kind);
    }

    /// Why the run must stop now, if it must.
    fn stop_reason(&self, ctx: &RunContext) -> Option<StopReason> {
        if !ctx.is_cancelled() {
            return None;
        }
        Some(match ctx.stop_cause() {
            Some(StopCause::Cancelled(reason)) => StopReason::Cancelled(reason.clone()),
            Some(StopCause::RunTimeout) => StopReason::Timeout(TimeoutKind::Run),
            Some(StopCause::StepTimeout) => StopReason::Timeout(TimeoutKind::Step),
            None => cancelled(),
        })
    }

    /// Waits while the run is paused. Returns false when cancelled meanwhile.
    async fn wait_while_paused(&mut self, ctx: &RunContext) -> bool {
        while *self.pause_rx.borrow_and_update() {
            tokio::select! {
                biased;
                _ = ctx.cancel_token().cancelled() => return false,
                changed = self.pause_rx.changed() => {
                    if changed.is_err() {
                        // Nobody can resume us any more; carry on.
                        return true;
                    }
                }
            }
        }
        true
    }
}

fn stop(reason: StopReason, new_messages: Vec<Message>) -> TurnOutcome {
    TurnOutcome::Stop { reason, new_messages }
}

fn cancelled() -> StopReason {
    StopReason::Cancelled("cancelled".to_string())
}
