//! What a tool may ask of the run that calls it: to hand part of the task
//! to a sub-agent (the `task` tool). The engine implements [`SubAgents`];
//! a tool sees it in [`crate::tool::ToolContext::sub_agents`].

use crate::metrics::RunMetrics;

/// The name of the tool that starts sub-agents (loom-tools' `Task`): a
/// child at the nesting limit does not get it, and people's views show
/// its calls as sub-agents.
pub const TASK_TOOL: &str = "task";

/// A sub-agent to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRequest {
    /// The calling tool call (the child's run id is derived from it, so a
    /// resumed parent finds the same child).
    pub call_id: String,
    /// A few words on what the child does (for people).
    pub description: String,
    /// The child's task: the first message of its fresh conversation.
    pub prompt: String,
    /// Tools the child may use (each also the parent's); `None`: the
    /// parent's read-only tools.
    pub tools: Option<Vec<String>>,
    /// The child's step limit (default 10; never more than the parent has left).
    pub max_steps: Option<u32>,
    /// The agent defined in a file that the child is, when the call named one.
    pub agent: Option<ChildAgent>,
}

/// A sub-agent defined in a file (docs/agents.md), as a child gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildAgent {
    /// Its name.
    pub name: String,
    /// Its instructions: added to the child's system prompt.
    pub instructions: String,
    /// Its model, when not the parent's.
    pub model: Option<String>,
    /// With no `tools` in the request: every tool of the parent's (but
    /// `task` at the nesting limit) rather than its read-only ones.
    pub all_tools: bool,
}

/// How a sub-agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildEnd {
    /// It answered.
    Completed,
    /// It was cancelled (its parent was, or a person cancelled it).
    Cancelled,
    /// A budget of its own or of an ancestor was used up.
    BudgetExhausted,
    /// It stopped without an answer for any other reason (an error, a
    /// timeout, its step limit).
    Failed,
}

impl ChildEnd {
    /// The word the tool result uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
            Self::BudgetExhausted => "budget exhausted",
            Self::Failed => "failed",
        }
    }
}

/// What a sub-agent did.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildReport {
    /// The child's run.
    pub run_id: String,
    /// How it ended; never `Completed` for a child that stopped early.
    pub end: ChildEnd,
    /// Its answer, when it gave one.
    pub answer: Option<String>,
    /// Why it stopped, when it did not answer.
    pub reason: Option<String>,
    /// What it (and its own sub-agents) used.
    pub metrics: RunMetrics,
}

/// Why no sub-agent could be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelegateError {
    /// A requested tool is not the parent's, or is not allowed in a child.
    #[error("{0}")]
    Tools(String),
    /// The parent stopped before the child could start.
    #[error("cancelled before the sub-agent started")]
    Cancelled,
    /// The child's own model cannot be made.
    #[error("{0}")]
    Model(String),
    /// The parent has no steps, tokens or money left for a child.
    #[error("{0}")]
    NothingLeft(String),
    /// The child a crash left behind could not be looked up or taken over.
    #[error("{0}")]
    Resume(String),
}

/// Starts sub-agents of the calling run.
#[async_trait::async_trait]
pub trait SubAgents: Send + Sync + std::fmt::Debug {
    /// Runs a child to its end and reports how it went. `cancel` is the
    /// call's: cancelling it (or the calling run) cancels the child, and
    /// the calling run does not end before the child has.
    async fn run_child(
        &self,
        request: ChildRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<ChildReport, DelegateError>;
}

/// A child's run id: the same for the same parent and call, so a resumed
/// parent finds the child its crash left behind.
pub fn child_run_id(parent_run_id: &str, call_id: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parent_run_id.bytes().chain([0]).chain(call_id.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{parent_run_id}.{hash:016x}")
}
