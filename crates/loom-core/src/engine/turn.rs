//! `tt`: one turn of the run (seed 000), ending in a base case or a tail call.

use crate::context::{Deadline, RunContext, StopCause};
use crate::event::{CallSummary, EventKind, TurnIds};
use crate::feedback::{Stop, Termination, MAX_ITERATIONS_MESSAGE};
use crate::llm::{FinishReason, LlmError};
use crate::memory::Memory;
use crate::message::{Message, ToolCall};
use crate::pipeline::{BatchEnv, ToolPipeline};
use crate::resume::CallRepair;
use crate::tool_result::ToolResult;
use crate::turn_state::TurnState;

use super::guidance::GuidancePart;
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
    /// The recursion monitor ended the tool phase (repetition, a loop, too
    /// many errors) and the final call gave no answer either.
    Monitor(Stop),
    /// The process is going away (SIGTERM, SIGHUP, its output closed): the
    /// run stopped and stays resumable (`INTERRUPTED`).
    Interrupted(String),
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

/// Turn metadata key set when the monitor ends the tool phase: `{reason, detail}`.
const TERMINATE_KEY: &str = "loom.terminate";

/// Guidance of a retry after an empty answer.
const EMPTY_ANSWER_NUDGE: &str = "Your last reply was empty. Reply now: answer the user's request in text, \
or call a tool if you need one.";

/// Guidance of a request that continues an answer cut off by the output limit.
const CONTINUE_ANSWER: &str = "Your previous reply was cut off because it reached the output token limit. \
Continue exactly where it stopped, without repeating anything; do not start over.";

/// Why a turn's model call offers no tools.
#[derive(Debug, Clone)]
enum FinalAnswer {
    /// The step limit.
    MaxSteps,
    /// A verdict of the recursion monitor.
    Monitor(Stop),
}

impl FinalAnswer {
    /// As named in events: `max_steps`, or the monitor's reason.
    fn reason(&self) -> &'static str {
        match self {
            Self::MaxSteps => "max_steps",
            Self::Monitor(stop) => stop.termination.reason(),
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::MaxSteps => MAX_ITERATIONS_MESSAGE,
            Self::Monitor(stop) => stop.termination.message(),
        }
    }
}

impl Run {
    /// Handles exactly one turn.
    pub(crate) async fn tt(&mut self, memory: &mut Memory, state: &TurnState, ctx: &RunContext) -> TurnOutcome {
        let turn = TurnIds::of(state);

        // Phase 0: control.
        if let Some(reason) = self.stop_reason(ctx) {
            return stop(reason, Vec::new());
        }
        let run_deadline = ctx.run_deadline();
        if run_deadline.as_ref().is_some_and(Deadline::passed) {
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

        // The step deadline covers the model call and the turn's tools; like
        // the run's, its clock stops while a person is asked.
        let step_deadline = ctx.step_deadline();
        let work = async {
            // The hard step limit comes first; then a verdict of the monitor
            // (never given for the turn after the last step).
            if state.is_final() {
                self.events.emit(
                    &turn,
                    EventKind::MaxIterationsReached {
                        turn_counter: state.turn_counter(),
                        max_iterations: state.max_iterations(),
                    },
                );
                self.final_answer_turn(memory, FinalAnswer::MaxSteps, &turn, ctx).await
            } else if let Some(verdict) = monitor_verdict(state) {
                self.final_answer_turn(memory, FinalAnswer::Monitor(verdict), &turn, ctx)
                    .await
            } else {
                self.tool_turn(memory, state, &turn, ctx).await
            }
        };
        tokio::pin!(work);
        let cause = tokio::select! {
            biased;
            outcome = &mut work => return outcome,
            () = expired(step_deadline.as_ref()) => StopCause::StepTimeout,
            () = expired(run_deadline.as_ref()) => StopCause::RunTimeout,
        };
        // Stop the run, then let the turn wind down so every running tool
        // gets a result and the transcript stays valid.
        ctx.stop(cause);
        work.await
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
        let (response, compacted) = match self.answer_phase(memory, tools, None, turn, ctx).await {
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
        self.announce_calls(turn, &calls);
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

        // Announced again for whoever follows the resumed run: the first
        // announcement may be in a log they never read.
        self.announce_calls(&turn, &dangling);
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

        // Phase 4: feedback for the next request only (never stored).
        self.monitor.observe(content, calls, &results);
        let verdict = self.monitor.check(state.turn_counter() + 1, state.max_iterations());
        if self.engine.context.feedback {
            let warned_of_errors = verdict
                .warnings
                .iter()
                .any(|(reason, _)| *reason == "error_rate_warning");
            if let Some(part) = self
                .feedback(&results, state)
                .filter(|p| !(warned_of_errors && p.reason == "error"))
            {
                self.guidance.push(part);
            }
            self.guidance.extend(
                verdict
                    .warnings
                    .into_iter()
                    .map(|(reason, content)| GuidancePart::new(reason, content)),
            );
        }
        new_messages.extend(self.take_steering().into_iter().map(Message::user));
        let mut outcome = self.recurse(state, turn, new_messages, compacted);
        // At the step limit the tools end anyway: the limit says so, and a
        // verdict would only contradict it.
        let verdict = verdict
            .terminate
            .filter(|_| state.turn_counter() + 1 < state.max_iterations());
        if let (Some(verdict), TurnOutcome::Recurse { next, .. }) = (verdict, &mut outcome) {
            self.events.emit(
                turn,
                EventKind::Warning {
                    code: "MONITOR_STOP".to_string(),
                    message: format!(
                        "the recursion monitor ended the tool phase ({}: {}); the model is asked for its final answer without tools",
                        verdict.termination.reason(),
                        verdict.detail
                    ),
                },
            );
            *next = next.with_metadata(
                TERMINATE_KEY,
                serde_json::json!({"reason": verdict.termination.reason(), "detail": verdict.detail}),
            );
        }
        outcome
    }

    /// One last call without tools (seed 004): at the step limit, or when
    /// the monitor ended the tool phase. Its instruction is guidance: part of
    /// this request only, never of the history.
    async fn final_answer_turn(
        &mut self,
        memory: &mut Memory,
        why: FinalAnswer,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> TurnOutcome {
        let instruction = GuidancePart::new(why.reason(), format!("{}\n{FINAL_ANSWER_SUFFIX}", why.message()));
        let (response, _) = match self.answer_phase(memory, &[], Some(instruction), turn, ctx).await {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };
        let answer = response.content;
        if answer.trim().is_empty() {
            let reason = match why {
                FinalAnswer::MaxSteps => StopReason::MaxStepsWithoutAnswer,
                FinalAnswer::Monitor(verdict) => StopReason::Monitor(verdict),
            };
            return stop(reason, Vec::new());
        }
        TurnOutcome::Finish {
            content: answer.clone(),
            new_messages: vec![Message::assistant(answer)],
        }
    }

    /// The model's answer, checked: an answer cut off by the output limit is
    /// continued (up to `max_continuations` times, each with a `warning`), a
    /// filtered one ends the run (`CONTENT_FILTERED`), and an empty one is
    /// retried once with a nudge, then ends the run (`EMPTY_ANSWER`) — but
    /// not on a final-answer call (`instruction`: its guidance; its emptiness
    /// is the caller's to judge). Returns the answer (continued pieces
    /// joined) and whether the history was compressed.
    async fn answer_phase(
        &mut self,
        memory: &mut Memory,
        tools: &[crate::llm::ToolSpec],
        instruction: Option<GuidancePart>,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> Result<(ModelResponse, bool), TurnOutcome> {
        // While an answer is continued, what it said so far is the last
        // message, so the model sees it (one message: a chat template may
        // insist that turns alternate). It leaves memory on every way out:
        // the caller stores the whole answer once, or nothing.
        let mut so_far = String::new();
        let answered = self
            .answer_loop(memory, tools, instruction, &mut so_far, turn, ctx)
            .await;
        if !so_far.is_empty() && is_partial(memory, &so_far) {
            memory.pop();
        }
        answered
    }

    async fn answer_loop(
        &mut self,
        memory: &mut Memory,
        tools: &[crate::llm::ToolSpec],
        instruction: Option<GuidancePart>,
        so_far: &mut String,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> Result<(ModelResponse, bool), TurnOutcome> {
        let final_answer = instruction.as_ref().map(|part| part.reason.clone());
        let retry_empty = instruction.is_none();
        let mut extra = instruction;
        let max_continuations = self.engine.max_continuations;
        let mut continued = 0;
        let mut compacted = false;
        let mut nudged = false;
        loop {
            let (mut response, compressed) = self
                .model_phase(memory, tools, extra.take(), final_answer.as_deref(), turn, ctx)
                .await?;
            compacted |= compressed;
            let cut_off = response.finish == Some(FinishReason::Length);
            let has_text = !response.content.trim().is_empty();
            if cut_off && has_text && response.tool_calls.is_empty() && continued < max_continuations {
                continued += 1;
                self.warn(
                    turn,
                    "OUTPUT_LIMIT",
                    format!(
                        "the answer reached the model's output token limit (finish reason: length); asking the model to continue ({continued} of at most {max_continuations})"
                    ),
                );
                if is_partial(memory, so_far) {
                    memory.pop();
                }
                so_far.push_str(&response.content);
                memory.push(Message::assistant(so_far.clone()));
                extra = Some(GuidancePart::new("continue_answer", CONTINUE_ANSWER));
                continue;
            }
            if response.finish == Some(FinishReason::ContentFilter) {
                return Err(stop(
                    StopReason::Error {
                        code: "CONTENT_FILTERED".to_string(),
                        message: "the provider's content filter stopped the model's answer (finish reason: content_filter, or an Anthropic refusal); what streamed before it is not kept".to_string(),
                    },
                    Vec::new(),
                ));
            }
            if cut_off && (has_text || !so_far.is_empty()) {
                self.warn(
                    turn,
                    "OUTPUT_LIMIT",
                    if response.tool_calls.is_empty() {
                        "the answer reached the model's output token limit and may be incomplete".to_string()
                    } else {
                        "the answer reached the model's output token limit; its last tool call may be cut short"
                            .to_string()
                    },
                );
            }
            if !so_far.is_empty() {
                response.content = format!("{so_far}{}", response.content);
            }
            let empty = response.content.trim().is_empty() && response.tool_calls.is_empty();
            if empty && retry_empty {
                // A model that spent its whole output limit before writing
                // anything (thinking, say) needs a higher limit, not a nudge.
                let why = if cut_off {
                    "the model reached its output token limit before writing anything (finish reason: length); raise max_tokens"
                } else {
                    "the model answered with nothing (no text, no tool call)"
                };
                if !nudged {
                    nudged = true;
                    self.warn(turn, "EMPTY_ANSWER", format!("{why}; asking once more"));
                    extra = Some(GuidancePart::new("empty_answer", EMPTY_ANSWER_NUDGE));
                    continue;
                }
                return Err(stop(
                    StopReason::Error {
                        code: "EMPTY_ANSWER".to_string(),
                        message: format!("{why}, twice"),
                    },
                    Vec::new(),
                ));
            }
            return Ok((response, compacted));
        }
    }

    /// Phases 1–2: context (compression when needed), then the model call
    /// with the guidance for this request. A "context length exceeded"
    /// answer compresses and retries once.
    async fn model_phase(
        &mut self,
        memory: &mut Memory,
        tools: &[crate::llm::ToolSpec],
        extra: Option<GuidancePart>,
        final_answer: Option<&str>,
        turn: &TurnIds,
        ctx: &RunContext,
    ) -> Result<(ModelResponse, bool), TurnOutcome> {
        let mut compacted = self.prepare_context(memory, tools, turn, ctx, false).await;
        let guidance = self.take_guidance(turn, extra);
        let mut retried = false;
        loop {
            self.phase(turn, "llm", true);
            let called = self
                .call_model(memory.messages(), tools, guidance.as_deref(), final_answer, turn)
                .await;
            self.phase(turn, "llm", false);
            match called {
                Ok(response) => {
                    if let Some(usage) = response.usage {
                        let tokens = usage.input_tokens.saturating_add(usage.output_tokens);
                        memory.record_reported(memory.messages().len(), usize::try_from(tokens).unwrap_or(usize::MAX));
                    }
                    return Ok((response, compacted));
                }
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

    /// A `warning` event.
    fn warn(&self, turn: &TurnIds, code: &str, message: String) {
        self.events.emit(
            turn,
            EventKind::Warning {
                code: code.to_string(),
                message,
            },
        );
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
            protected: &self.engine.protected,
        };
        let results = pipeline.run_batch(calls, &env).await;
        for result in &results {
            self.record_tool_metrics(result);
        }
        results
    }

    /// `tool_calls.start` for `calls`.
    fn announce_calls(&self, turn: &TurnIds, calls: &[ToolCall]) {
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
            Some(StopCause::Interrupted(reason)) => StopReason::Interrupted(reason.clone()),
            None => cancelled(),
        })
    }

    /// Waits while the run is paused. Returns false when cancelled meanwhile.
    async fn wait_while_paused(&mut self, ctx: &RunContext) -> bool {
        if !*self.pause_rx.borrow() {
            return true;
        }
        // A paused run waits for a person: its clocks stop meanwhile.
        let _person = ctx.wait_for_person();
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

/// Whether the last message is the answer so far of a continued answer.
fn is_partial(memory: &Memory, so_far: &str) -> bool {
    !so_far.is_empty()
        && matches!(
            memory.messages().last(),
            Some(Message::Assistant { content, tool_calls }) if content == so_far && tool_calls.is_empty()
        )
}

/// The monitor's verdict carried by a turn's state, if any.
fn monitor_verdict(state: &TurnState) -> Option<Stop> {
    let verdict = state.metadata().get(TERMINATE_KEY)?;
    Some(Stop {
        termination: Termination::from_reason(verdict.get("reason")?.as_str()?)?,
        detail: verdict
            .get("detail")
            .and_then(|d| d.as_str())
            .unwrap_or_default()
            .to_string(),
    })
}

/// Completes when `deadline` passes; never without one.
async fn expired(deadline: Option<&Deadline>) {
    match deadline {
        Some(deadline) => deadline.expired().await,
        None => std::future::pending().await,
    }
}

fn stop(reason: StopReason, new_messages: Vec<Message>) -> TurnOutcome {
    TurnOutcome::Stop { reason, new_messages }
}

fn cancelled() -> StopReason {
    StopReason::Cancelled("cancelled".to_string())
}
