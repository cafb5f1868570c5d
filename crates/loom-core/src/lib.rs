//! Loom's engine.
//!
//! A run is a chain of turns. The engine's `tt` handles exactly one turn —
//! control checks, one streamed model call, the tool pipeline — and ends in a
//! base case (answer, cancel, deadline, turn limit, fatal error) or a tail
//! call with the next immutable [`TurnState`]. A driver trampolines the tail
//! calls, so depth costs no stack and every turn has a clear save point.
//!
//! Start with [`Agent::builder`]; read the run through its [`RunHandle`].

#![warn(missing_docs)]

pub mod agent;
pub mod assembly;
pub mod context;
mod engine;
pub mod event;
pub mod feedback;
pub mod handle;
pub mod history;
pub mod hooks;
pub mod json_strict;
pub mod llm;
pub mod memory;
pub mod message;
pub mod metrics;
pub mod owner;
pub mod permission;
pub mod pipeline;
pub mod resume;
pub mod retrieval;
pub mod status;
pub mod store;
pub mod tokens;
pub mod tool;
pub mod tool_result;
pub mod turn_state;

pub use agent::{Agent, AgentBuilder, BuildError, ResumeError, RunRequest, DEFAULT_SYSTEM_PROMPT};
pub use assembly::{ContextAssembler, ContextComponent, Priority};
pub use context::{Deadline, Limits, PersonWait, RunContext, StopCause};
pub use engine::{StopReason, TimeoutKind, TurnOutcome};
pub use event::{CallSummary, Event, EventKind};
pub use feedback::{MonitorConfig, ResultAnalysis, TaskHandler, Termination};
pub use handle::{Control, ControlError, RunController, RunHandle, RunOutcome};
pub use history::{validate_history, HistoryError};
pub use hooks::{HookCall, HookDecision, PermissionHook, ToolHook};
pub use llm::{FinishReason, GuidancePlacement, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, ToolSpec, Usage};
pub use memory::{Memory, MemoryConfig};
pub use message::{Message, ToolCall};
pub use metrics::{Pricing, RunMetrics, ToolStats};
pub use permission::{Decision, PermissionDecision, PermissionPolicy, PolicyError};
pub use pipeline::{is_secret_name, PipelineConfig, Redactor};
pub use retrieval::{RetrievalError, RetrievedDoc, Retriever};
pub use status::{InvalidTransition, RunStatus};
pub use store::{Checkpoint, JournalEntry, RunRecord, RunSnapshot, Store, StoreError};
pub use tokens::{TiktokenCounter, TokenCounter};
pub use tool::{DynTool, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
pub use tool_result::{StageTimings, ToolResult, ToolStatus};
pub use turn_state::TurnState;

// Re-exported so tool authors use the same versions as the engine.
pub use async_trait::async_trait;
pub use schemars;
pub use tokio_util::sync::CancellationToken;
