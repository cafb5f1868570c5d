//! Loom's engine.
//!
//! A run is a chain of turns. A turn machine without IO ([`machine`])
//! holds the run's whole state — the immutable [`TurnState`] chain, the
//! history, the steps, the monitor, the metrics, the mode — and says what
//! happens next: call the model, run these calls, checkpoint, finish or
//! stop. One driver does all the IO (model streams, the tool pipeline,
//! events, the store) and is the only place that checkpoints; a checkpoint
//! is the machine's state, and resume re-enters the machine from it.
//! docs/architecture.md has the map.
//!
//! Start with [`Agent::builder`]; read the run through its [`RunHandle`].

#![warn(missing_docs)]

pub mod agent;
pub mod assembly;
pub mod audit;
pub mod budget;
pub mod codes;
pub mod context;
pub mod control;
pub mod delegate;
pub mod emitter;
mod engine;
mod escaped_args;
pub mod event;
pub mod feedback;
mod fence;
#[doc(hidden)]
pub mod fuzzing;
pub mod handle;
pub mod history;
pub mod hooks;
pub mod json_strict;
pub mod lease;
pub mod live_state;
pub mod llm;
pub mod machine;
pub mod memory;
pub mod message;
pub mod metrics;
pub mod model_source;
pub mod observe;
pub mod outcome;
pub mod owner;
pub mod permission;
pub mod pipeline;
pub mod recovery;
pub mod resume;
pub mod retrieval;
pub mod rewind;
pub mod snapshots;
pub mod status;
pub mod store;
pub mod text;
mod timestamp;
pub mod tokens;
pub mod tool;
pub mod tool_result;
pub mod tool_schema;
pub mod tool_source;
pub mod trace_context;
pub mod turn_state;
mod wire;
pub mod workspace_jobs;
pub mod written_calls;

pub use agent::{Agent, AgentBuilder, BuildError, ResumingRun, RunRequest, DEFAULT_SYSTEM_PROMPT, LEGACY_STATE};
pub use assembly::{ContextAssembler, ContextComponent, Priority};
pub use audit::{AuditEntry, AuditQuery};
pub use budget::{Budget, BudgetKind, Spending};
pub use context::{Deadline, Limits, PersonWait, RunContext, StopCause};
pub use control::{Control, PermissionDecision};
pub use delegate::{ChildAgent, ChildEnd, ChildReport, ChildRequest, DelegateError, SubAgents};
pub use engine::SubAgentSettings;
pub use event::{CallSummary, Event, EventKind, ForkLink, Phase};
pub use feedback::{MonitorConfig, ResultAnalysis, TaskHandler, Termination};
pub use fence::{LeaseGuard, WriteFence};
pub use handle::{ControlError, RunController, RunHandle};
pub use history::{validate_history, HistoryError};
pub use hooks::{
    HookAnswer, HookCall, HookDecision, HookEvent, HookInput, HookReport, HookRun, HookScope, HookVerdict,
    LifecycleHooks, ToolHook,
};
pub use lease::{Claim, ClusterRunCounts, EventTail, Lease, Nudge, Renewal, RunLeases, Tailed};
pub use live_state::{LiveState, PendingAsk};
pub use llm::{FinishReason, GuidancePlacement, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, ToolSpec, Usage};
pub use machine::RunState;
pub use memory::{CompressionMethod, Memory, MemoryConfig};
pub use message::{Message, ToolCall};
pub use metrics::{Pricing, RunMetrics, ToolStats};
pub use model_source::{ModelSource, SourcedModel};
pub use observe::EventObserver;
pub use outcome::{ErrorCode, RunOutcome, StopReason, TimeoutKind, WarningCode};
pub use permission::{Decision, Mode, PermissionPolicy, PolicyError, SessionGrant};
pub use pipeline::{is_secret_name, remember_secrets, PipelineConfig, Redactor};
pub use recovery::ResumeError;
pub use retrieval::{RetrievalError, RetrievedDoc, Retriever};
pub use snapshots::{RestorePlan, SkipReason, SkippedFile, SnapshotError, StepFiles, WorkspaceSnapshots};
pub use status::{InvalidTransition, RunStatus};
pub use store::{
    Admissions, AuditLog, Checkpoint, EventsStored, JournalEntry, KeyedRequest, ParentLink, QueuedRun, RunIndex,
    RunLog, RunQuery, RunRecord, RunSnapshot, Store, StoreAddress, StoreError,
};
pub use tokens::{TiktokenCounter, TokenCounter};
pub use tool::{
    DynTool, OutputReceiver, OutputSink, OutputStream, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry,
};
pub use tool_result::{Authority, ErrorKind, StageTimings, ToolResult, ToolStatus};
pub use tool_source::ToolSource;
pub use trace_context::{InvalidTraceParent, TraceParent};
pub use turn_state::TurnState;
pub use workspace_jobs::{workspace_line, JobOutcome, WorkspaceJob, WorkspaceJobs};

// Re-exported so tool authors use the same versions as the engine.
pub use async_trait::async_trait;
pub use schemars;
pub use tokio_util::sync::CancellationToken;
