//! The typed event stream of a run (docs/events.md).
//!
//! Every event is one JSON object: the common fields (`runId`, `turnId`,
//! `parentTurnId`, `depth`, `seq`, `ts`) plus `type` and the fields of its
//! kind, all in camelCase.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::codes::{ErrorCode, WarningCode};
use crate::llm::Usage;
use crate::metrics::RunMetrics;
use crate::status::RunStatus;
use crate::tool_result::{StageTimings, ToolStatus};

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The run the event belongs to.
    pub run_id: Arc<str>,
    /// The turn that produced it.
    pub turn_id: Arc<str>,
    /// The turn before it (or, for a sub-agent's first turn, the parent's turn).
    pub parent_turn_id: Option<Arc<str>>,
    /// 0 for the top-level run, 1 for its sub-agents, and so on.
    pub depth: u32,
    /// The run that started this one (a sub-agent's parent); absent for a
    /// top-level run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Arc<str>>,
    /// Strictly increasing within a run, starting at 1.
    pub seq: u64,
    /// RFC 3339 time with milliseconds, UTC.
    pub ts: String,
    /// The event's name and its own fields.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Declares [`EventKind`] with each variant's wire name written once: serde
/// reads and writes it as `type`, and [`EventKind::name`] returns it.
macro_rules! event_kinds {
    (
        $(#[$meta:meta])*
        pub enum EventKind {
            $( $(#[$variant_meta:meta])* $wire:literal => $variant:ident { $($fields:tt)* } ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum EventKind {
            $( $(#[$variant_meta])* #[serde(rename = $wire)] $variant { $($fields)* } ),*
        }

        impl Event {
    /// [`Event::ts`] in milliseconds since the Unix epoch (`None` for a
    /// time that is not RFC 3339).
    pub fn ts_ms(&self) -> Option<u64> {
        let time = humantime::parse_rfc3339(&self.ts).ok()?;
        let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
        u64::try_from(since.as_millis()).ok()
    }
}

impl EventKind {
            /// Every event's wire name.
            pub const NAMES: &'static [&'static str] = &[$($wire),*];

            /// The event's wire name (its `type`).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant { .. } => $wire),*
                }
            }
        }
    };
}

crate::wire::wire_enum! {
    /// A phase of a turn, as named in `phase.start` and `phase.end`.
    pub enum Phase {
        /// The model call.
        Llm = "llm",
        /// The tool calls.
        Tools = "tools",
        /// History compression.
        Compression = "compression",
    }
}

crate::wire::wire_enum! {
    /// Why a permission ask was settled without a person's answer (in
    /// `permission.resolved`; the decision is then `deny`).
    pub enum Unanswered {
        /// No answer within the permission timeout.
        Timeout = "timeout",
        /// The run was cancelled while it waited (logs written before
        /// this was a type say it in words).
        #[serde(alias = "the run was cancelled")]
        Cancelled = "cancelled",
        /// Nobody could answer: whoever would have was gone.
        #[serde(alias = "nobody can answer")]
        NobodyToAsk = "nobody_to_ask",
    }
}

/// A tool call as announced in `tool_calls.start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallSummary {
    /// The call id.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as the model gave them.
    pub args: Value,
}

/// Where a run came from when it was forked from another, or continues a
/// rewound one (`forkedFrom` in `lifecycle.start`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkLink {
    /// The run it came from.
    pub run_id: String,
    /// The step of that run its conversation (and workspace) starts from.
    pub step: u32,
}

event_kinds! {
/// The name and fields of an event. `type` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
pub enum EventKind {
    /// The run begins.
    "lifecycle.start" => LifecycleStart {
        /// The user's request.
        prompt: String,
        /// The model, as `provider:name`.
        model: String,
        /// The run's turn limit.
        max_steps: u32,
        /// True when a stored run is resumed after its process died; its
        /// events continue the stored `seq`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        resumed: bool,
        /// The run it was forked from, or the rewound run it continues
        /// (docs/rewind.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forked_from: Option<ForkLink>,
        /// The W3C trace context a client started the run tree with: the
        /// run's trace span is its child (a sub-agent's carries its root's).
        /// Stored with the run's log, told again when it is resumed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_parent: Option<crate::trace_context::TraceParent>,
        /// The agent defined in a file that the run is (a sub-agent started
        /// as one, docs/agents.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
    },
    /// The retriever is asked for context.
    "retrieval.start" => RetrievalStart {
        /// What was asked.
        query: String,
    },
    /// The retriever answered.
    "retrieval.complete" => RetrievalComplete {
        /// Passages found.
        doc_count: usize,
        /// Where they come from.
        sources: Vec<String>,
    },
    /// The request is getting close to the context window.
    "context.warning" => ContextWarning {
        /// Tokens the request would use.
        tokens: usize,
        /// The window.
        context_window: usize,
        /// `tokens / context_window`.
        ratio: f64,
    },
    /// History was compressed.
    "compression.applied" => CompressionApplied {
        /// Messages before.
        messages_before: usize,
        /// Messages after.
        messages_after: usize,
        /// Tokens before.
        tokens_before: usize,
        /// Tokens after.
        tokens_after: usize,
        /// `summary` (a model wrote the eight sections) or `fallback` (outputs and turns dropped).
        method: crate::memory::CompressionMethod,
    },
    /// Guidance was attached to the model request that follows (it is not
    /// stored in the history).
    "guidance.injected" => GuidanceInjected {
        /// Why (`error`, `repetition_warning`, `error_rate_warning`,
        /// `iteration_warning`, `max_steps`, `duplicate_tools`,
        /// `loop_detected`, `error_threshold`, `continue_answer`,
        /// `empty_answer`, `task_handler`).
        reason: crate::feedback::GuidanceReason,
        /// The message.
        content: String,
    },
    /// A turn begins.
    "iteration.start" => IterationStart {
        /// The turn counter (0-based).
        iteration: u32,
    },
    /// A phase of a turn begins (`llm`, `tools`, `compression`).
    "phase.start" => PhaseStart {
        /// The phase.
        phase: Phase,
    },
    /// A phase of a turn ends.
    "phase.end" => PhaseEnd {
        /// The phase.
        phase: Phase,
    },
    /// A model call begins.
    "llm.start" => LlmStart {
        /// The model, as `provider:name`.
        model: String,
        /// Messages sent.
        message_count: usize,
        /// Whether tools were offered.
        tools_offered: bool,
        /// Set on a final-answer call, which offers no tools: why
        /// (`max_steps`, or the monitor's `duplicate_tools`, `loop_detected`,
        /// `error_threshold`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        final_answer: Option<String>,
    },
    /// A piece of the model's text, as it arrives.
    "llm.delta" => LlmDelta {
        /// The new text.
        text: String,
    },
    /// A model call finished.
    "llm.finish" => LlmFinish {
        /// All text of the answer.
        content: String,
        /// Tokens used, when the model reported them.
        usage: Option<Usage>,
        /// Why the model stopped (`stop`, `tool_calls`, `length`, …).
        finish_reason: Option<String>,
        /// What the call cost, in US dollars, when prices are known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// Tool calls requested.
        tool_call_count: usize,
        /// The model that answered, as the provider named it, when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response_model: Option<String>,
    },
    /// The model asked for tools.
    "tool_calls.start" => ToolCallsStart {
        /// The calls, in the model's order.
        calls: Vec<CallSummary>,
    },
    /// One tool call finished.
    "tool.result" => ToolResult {
        /// The call id.
        call_id: String,
        /// The tool's name.
        name: String,
        /// How it ended.
        status: ToolStatus,
        /// What the model reads.
        content: String,
        /// Wall time of the call.
        duration_ms: u64,
        /// Microseconds per pipeline stage.
        stages: StageTimings,
        /// Who let the call run or refused it; absent for a call refused
        /// before it was authorized (unknown tool, invalid arguments).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decided_by: Option<crate::tool_result::Authority>,
    },
    /// A streaming tool (the shell) produced output while its call runs.
    /// Whole lines where possible, secrets redacted; the result still
    /// carries the (capped) output for the model.
    "tool.output" => ToolOutput {
        /// The call id.
        call_id: String,
        /// `stdout` or `stderr`.
        stream: crate::tool::OutputStream,
        /// The text.
        text: String,
    },
    /// A call needs a person's permission; answer through the `RunHandle`.
    "permission.request" => PermissionRequest {
        /// Quote it in the reply.
        request_id: String,
        /// The tool to run.
        tool: String,
        /// Its arguments.
        args: Value,
        /// The rule that asked, if a rule did.
        rule: Option<String>,
    },
    /// A permission request was answered (or timed out, or the run was cancelled).
    "permission.resolved" => PermissionResolved {
        /// The request.
        request_id: String,
        /// The tool.
        tool: String,
        /// `allow`, `deny` or `always`.
        decision: crate::control::PermissionDecision,
        /// Why, when it was not a person's answer.
        reason: Option<Unanswered>,
    },
    /// A hook ran ([`crate::hooks::HookEvent`]): what it decided, or why it
    /// failed (a failed hook also gets a `HOOK_FAILED` warning).
    "hook.result" => HookResult {
        /// The point it ran at (`pre_tool_use`, …); not `event`, which
        /// names the event itself in WebSocket frames and SSE.
        hook_event: crate::hooks::HookEvent,
        /// The hook (its command).
        hook: String,
        /// The call it was asked about (tool events).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// `allow`, `deny` or `ask`; `null` when it had no opinion or failed.
        decision: Option<crate::hooks::HookVerdict>,
        /// Its reason.
        reason: Option<String>,
        /// True when it replaced the call's arguments.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        arguments_rewritten: bool,
        /// Text it added for the model.
        context: Option<String>,
        /// Why it failed; the run went on as if it had not run.
        error: Option<String>,
        /// How long it ran.
        duration_ms: u64,
    },
    /// All calls of the turn are done.
    "tool_calls.complete" => ToolCallsComplete {
        /// Calls finished.
        count: usize,
    },
    /// Tail call to the next turn.
    "recursion" => Recursion {
        /// Counter of the turn that ends.
        from_turn: u32,
        /// Counter of the turn that begins; equal to the recursion depth.
        to_turn: u32,
        /// The recursion depth reached (the turn counter). Named apart from
        /// the common `depth`, which is the run's depth in the run tree.
        recursion_depth: u32,
    },
    /// A turn that used tools finished: a step.
    "step.completed" => StepCompleted {
        /// Tool turns completed so far.
        step: u32,
        /// The run's limit.
        max_steps: u32,
        /// Seconds since the run began.
        elapsed_seconds: f64,
    },
    /// The workspace was recorded (a top-level run: before its first tool
    /// call as step 0, after each step as that step), so it can be rewound
    /// to; the files the step changed since the snapshot before.
    "snapshot.recorded" => SnapshotRecorded {
        /// The step recorded.
        step: u32,
        /// Files created or changed.
        changed: Vec<String>,
        /// Files removed.
        removed: Vec<String>,
        /// Files left out: for their size (`[snapshots] max_file_bytes`),
        /// a secret in them, or unreadable.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        skipped: Vec<crate::snapshots::SkippedFile>,
        /// How long recording took (0 in logs written before it was told).
        #[serde(default)]
        duration_ms: u64,
    },
    /// The run was rewound after it ended (docs/rewind.md): its workspace
    /// restored to a step, its session continued from that step, or both.
    "run.rewound" => RunRewound {
        /// The step rewound to.
        to_step: u32,
        /// The files written or removed to restore it (empty when only the
        /// conversation was rewound).
        files: Vec<String>,
        /// The run the session continues from, holding the conversation as
        /// of that step (`null` when only the files were rewound).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        continued_by: Option<String>,
    },
    /// A new session was forked from this run at a step.
    "run.forked" => RunForked {
        /// The step forked from.
        step: u32,
        /// The new run.
        fork_run_id: String,
        /// Its session.
        fork_session_id: String,
    },
    /// The turn limit was hit; a final call without tools follows.
    "max_iterations.reached" => MaxIterationsReached {
        /// The turn counter at the limit.
        turn_counter: u32,
        /// The limit.
        max_iterations: u32,
    },
    /// The run was cancelled.
    "execution.cancelled" => ExecutionCancelled {
        /// Why.
        reason: String,
    },
    /// The model gave its final answer.
    "agent.finish" => AgentFinish {
        /// The answer.
        content: String,
        /// Turns used.
        turns: u32,
        /// The run's metrics.
        metrics: RunMetrics,
    },
    /// Something the user should know that does not end the run.
    "warning" => Warning {
        /// Machine-readable code (`OUTPUT_LIMIT`, `EMPTY_ANSWER`, `MONITOR_STOP`, `INTERRUPTED`).
        code: WarningCode,
        /// What happened, for people.
        message: String,
    },
    /// An error the run reports.
    "error" => Error {
        /// Machine-readable code (e.g. `LLM_TIMEOUT`, `RUN_TIMEOUT`).
        code: ErrorCode,
        /// What happened, for people.
        message: String,
        /// Whether the run goes on after it.
        recoverable: bool,
    },
    /// The run ended. Always the last event.
    "lifecycle.end" => LifecycleEnd {
        /// The final status.
        status: RunStatus,
        /// The answer, if there is one.
        content: Option<String>,
        /// The run's metrics.
        metrics: RunMetrics,
    },
}
}

impl EventKind {
    /// The `tool_calls.start` event announcing `calls`.
    pub fn tool_calls_start(calls: &[crate::message::ToolCall]) -> Self {
        Self::ToolCallsStart {
            calls: calls
                .iter()
                .map(|call| CallSummary {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    args: call.arguments.clone(),
                })
                .collect(),
        }
    }

    /// The `tool.result` event of a finished call.
    pub fn tool_result(result: &crate::tool_result::ToolResult) -> Self {
        Self::ToolResult {
            call_id: result.call_id.clone(),
            name: result.name.clone(),
            status: result.status,
            content: result.content.clone(),
            duration_ms: result.metadata.duration_ms,
            stages: result.metadata.stages,
            decided_by: result.metadata.decided_by,
        }
    }
}

/// The turn an event is about.
#[derive(Debug, Clone)]
pub struct TurnIds {
    /// The turn's id.
    pub turn_id: Arc<str>,
    /// Its parent's id.
    pub parent_turn_id: Option<Arc<str>>,
}

impl TurnIds {
    /// Ids of a `TurnState`.
    pub fn of(state: &crate::turn_state::TurnState) -> Self {
        Self {
            turn_id: state.turn_id().into(),
            parent_turn_id: state.parent_turn_id().map(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolution_stored_before_its_reason_was_a_type_still_reads() {
        let stored = |reason: &str| {
            serde_json::json!({
                "runId": "r", "turnId": "t", "parentTurnId": null, "depth": 0, "seq": 3,
                "ts": "2026-11-20T00:00:00.000Z", "type": "permission.resolved",
                "requestId": "perm_1", "tool": "write_file", "decision": "deny", "reason": reason,
            })
        };
        for (old, now) in [
            ("the run was cancelled", Unanswered::Cancelled),
            ("nobody can answer", Unanswered::NobodyToAsk),
            ("timeout", Unanswered::Timeout),
        ] {
            let event: Event = serde_json::from_value(stored(old)).unwrap();
            let EventKind::PermissionResolved { reason, .. } = event.kind else {
                panic!("{event:?}")
            };
            assert_eq!(reason, Some(now));
            // Written anew, it has the new name.
            assert_eq!(serde_json::to_value(now).unwrap(), now.as_str());
        }
    }
}
