//! Lifecycle hooks (docs/extending.md): code outside the run — in the
//! `loom` binary, a configured command — asked at six points of a run.
//! This module holds what they are told and what they may answer; the
//! engine asks them (the driver at a run's start and end, the pipeline
//! around each tool call) and reports every answer as a `hook.result`
//! event.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::tool_result::ToolStatus;
use crate::wire::wire_enum;

wire_enum! {
    /// A point of a run where hooks are asked.
    pub enum HookEvent {
        /// A run begins a new session (no earlier conversation); top-level runs only.
        SessionStart = "session_start",
        /// A run's prompt is about to reach the model; top-level runs only.
        UserPromptSubmit = "user_prompt_submit",
        /// A tool call is about to be authorized.
        PreToolUse = "pre_tool_use",
        /// A tool call finished; its result is about to reach the model.
        PostToolUse = "post_tool_use",
        /// A top-level run is about to end with an answer.
        Stop = "stop",
        /// A sub-agent is about to end with an answer.
        SubAgentStop = "sub_agent_stop",
    }
}

impl HookEvent {
    /// The event named `name` (`pre_tool_use`, …).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|event| event.as_str() == name)
    }

    /// Whether the event is about one tool call (a matcher applies).
    pub fn is_about_a_tool(self) -> bool {
        matches!(self, Self::PreToolUse | Self::PostToolUse)
    }

    /// The name Claude Code gives the same point, so its hooks can be reused.
    pub fn claude_code_name(self) -> &'static str {
        match self {
            Self::SessionStart => "SessionStart",
            Self::UserPromptSubmit => "UserPromptSubmit",
            Self::PreToolUse => "PreToolUse",
            Self::PostToolUse => "PostToolUse",
            Self::Stop => "Stop",
            Self::SubAgentStop => "SubagentStop",
        }
    }
}

wire_enum! {
    /// What a hook decided (`decision` in `hook.result`).
    pub enum HookVerdict {
        /// Run the call without asking (an explicit deny rule still holds).
        Allow = "allow",
        /// Refuse the call, block the prompt, or refuse the ending.
        Deny = "deny",
        /// Ask a person about the call.
        Ask = "ask",
    }
}

/// What hooks are told: one JSON object on a command's stdin. Field names
/// follow Claude Code's where the two agree (`session_id`, `cwd`,
/// `hook_event_name`, `tool_name`, `tool_input`, `prompt`,
/// `stop_hook_active`).
#[derive(Debug, Clone, Serialize)]
pub struct HookInput {
    /// The point.
    pub event: HookEvent,
    /// The same, as Claude Code names it.
    pub hook_event_name: &'static str,
    /// The run.
    pub run_id: String,
    /// The run's session.
    pub session_id: String,
    /// The workspace (also `cwd`: hooks run in it).
    pub workspace: PathBuf,
    /// The workspace again, under Claude Code's name.
    pub cwd: PathBuf,
    /// 0 for a top-level run, 1 for its sub-agents, …
    pub depth: u32,
    /// The run's prompt (`user_prompt_submit`, `session_start`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The tool (tool events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// The call's id (tool events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The call's arguments, validated (tool events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_input: Option<Value>,
    /// What the call returned, as the model would read it (`post_tool_use`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_result: Option<String>,
    /// How the call ended (`post_tool_use`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_status: Option<ToolStatus>,
    /// The answer the run is about to end with (`stop`, `sub_agent_stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// True when a stop hook already sent this run back once (`stop`,
    /// `sub_agent_stop`): a hook can let it end this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_hook_active: Option<bool>,
}

impl HookInput {
    /// The input for `event` of run `run_id`; the event's own fields are
    /// set by the caller.
    pub fn new(event: HookEvent, run_id: &str, session_id: &str, workspace: &std::path::Path, depth: u32) -> Self {
        Self {
            event,
            hook_event_name: event.claude_code_name(),
            run_id: run_id.to_string(),
            session_id: session_id.to_string(),
            workspace: workspace.to_path_buf(),
            cwd: workspace.to_path_buf(),
            depth,
            prompt: None,
            tool_name: None,
            tool_call_id: None,
            tool_input: None,
            tool_result: None,
            tool_status: None,
            answer: None,
            stop_hook_active: None,
        }
    }
}

/// What the hooks of one point answered together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookAnswer {
    /// The strongest decision: deny over ask over allow; `None` when no
    /// hook decided.
    pub verdict: Option<HookVerdict>,
    /// Why (the deciding hook's reason): what the model or a person reads.
    pub reason: Option<String>,
    /// New arguments for the call (`pre_tool_use`): validated again.
    pub arguments: Option<Value>,
    /// Text the model reads with the prompt or the result.
    pub context: Option<String>,
}

/// One hook's run, as `hook.result` tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct HookReport {
    /// The hook (its command).
    pub hook: String,
    /// What it decided, if it decided.
    pub verdict: Option<HookVerdict>,
    /// Its reason.
    pub reason: Option<String>,
    /// Whether it rewrote the call's arguments.
    pub rewrote_arguments: bool,
    /// The context it added.
    pub context: Option<String>,
    /// Why it failed (non-zero exit other than 2, a timeout, output that is
    /// not the expected JSON): the run goes on as if it had not run.
    pub error: Option<String>,
    /// How long it ran.
    pub duration_ms: u64,
}

/// The hooks of every point and what they answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookRun {
    /// Their answers together.
    pub answer: HookAnswer,
    /// One report per hook that ran, in order.
    pub reports: Vec<HookReport>,
}

/// Where a hook runs: what stops it and what it must not touch (the same
/// as for the run's tools, [`crate::tool::ToolContext`]).
#[derive(Debug, Clone, Copy)]
pub struct HookScope<'a> {
    /// Cancelled with the run.
    pub cancel: &'a CancellationToken,
    /// Loom's own state: hidden from a hook's command where it can be.
    pub protected: &'a Arc<[PathBuf]>,
    /// Configuration a hook may read but not change.
    pub read_only: &'a Arc<[PathBuf]>,
}

/// Hooks asked at the points of a run ([`HookEvent`]).
#[async_trait]
pub trait LifecycleHooks: Send + Sync + 'static {
    /// Whether any hook runs at `event` (for a tool event, for `tool`):
    /// cheap, so a run without hooks builds no input.
    fn wants(&self, event: HookEvent, tool: Option<&str>) -> bool;

    /// Runs the hooks of `input.event`, in order, and combines their
    /// answers.
    async fn run(&self, input: &HookInput, scope: HookScope<'_>) -> HookRun;
}
