//! What the server answers: one type per method ([`Answer`]), and the
//! views of runs.

use loom_core::{PermissionDecision, RunMetrics, RunStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::Request;

/// `run.file`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotFile {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u32,
    /// The path.
    pub path: String,
    /// Whether the snapshot holds the file.
    pub exists: bool,
    /// Its text (`null` when absent or not UTF-8); at most 256 KiB.
    pub content: Option<String>,
    /// True when the text was cut at 256 KiB.
    pub truncated: bool,
}

/// `run.rewind`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rewound {
    /// The run.
    pub run_id: String,
    /// The step.
    pub to_step: u32,
    /// True when nothing was changed.
    pub dry_run: bool,
    /// Files written (or that would be).
    pub write: Vec<String>,
    /// Files removed (or that would be).
    pub remove: Vec<String>,
    /// Files among those changed outside Loom (a rewind without `force`
    /// is refused when there are any).
    pub changed_outside: Vec<String>,
    /// The run the session now continues from.
    pub continued_by: Option<String>,
}

/// `run.fork`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    /// The run forked from.
    pub run_id: String,
    /// The step.
    pub step: u32,
    /// The new session.
    pub session_id: String,
    /// Its first run: the one holding the conversation (`forkedFrom`).
    pub fork_run_id: String,
    /// Files restored.
    pub write: Vec<String>,
    /// Files removed.
    pub remove: Vec<String>,
    /// The run the prompt started, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<RunAccepted>,
}

/// The answer to a started run.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAccepted {
    /// The run (for `onBusy: steer`, the live run the prompt joined).
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// `QUEUED` or `RUNNING` (or where a run of an idempotent retry is now).
    pub status: RunStatus,
    /// Its place in the queue, 1 first, while `QUEUED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// True when the prompt joined a live run (`onBusy: steer`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steered: bool,
}

/// An ask waiting for an answer, as the run shows it.
pub use loom_core::PendingAsk;

/// A run as `run.get` and `run.list` show it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Its status.
    pub status: RunStatus,
    /// The task.
    pub prompt: String,
    /// The model.
    pub model: String,
    /// When it began executing (its `lifecycle.start`), ms since the
    /// epoch; absent until then (while `QUEUED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When the gateway accepted it (absent for a run started elsewhere,
    /// such as from the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_ms: Option<u64>,
    /// End.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// The answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Steps, tokens, cost, tools.
    pub metrics: RunMetrics,
    /// Asks waiting for an answer.
    pub pending_asks: Vec<PendingAsk>,
    /// Its place in the queue while `QUEUED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// The `seq` of its last event seen by the server.
    pub last_seq: u64,
    /// The run whose `task` call started it, for a sub-agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
}

impl RunView {
    /// Where the run stands in a list of runs (newest first) and in a
    /// cursor: its start, or, while it waits, its acceptance — the time
    /// every store orders its runs by.
    pub fn listed_ms(&self) -> u64 {
        self.started_ms.or(self.accepted_ms).unwrap_or_default()
    }
}

/// A page of `run.list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunPage {
    /// Newest first.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to a cancel: given once the run has stopped.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Always true.
    pub cancelled: bool,
    /// The `seq` of the run's last event (`lifecycle.end`).
    pub final_seq: u64,
}

/// `agent.steer`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Steered {
    /// The run.
    pub run_id: String,
    /// Always true: the message joins at the run's next turn.
    pub accepted: bool,
}

/// `permission.respond`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Responded {
    /// The run.
    pub run_id: String,
    /// The ask.
    pub request_id: String,
    /// The answer given.
    pub decision: PermissionDecision,
}

/// `permission.list`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Asks {
    /// Oldest first.
    pub asks: Vec<PendingAsk>,
}

/// `run.subscribe`'s answer; the events follow.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subscribed {
    /// The run.
    pub run_id: String,
    /// Events after this seq follow.
    pub after_seq: u64,
}

/// `run.unsubscribe`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unsubscribed {
    /// The run.
    pub run_id: String,
    /// Always true.
    pub unsubscribed: bool,
}

/// The answer to a [`Request`], one type per method.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Answer {
    /// `agent.run`.
    Accepted(RunAccepted),
    /// `agent.cancel`.
    Cancelled(Cancelled),
    /// `agent.steer`.
    Steered(Steered),
    /// `permission.respond`.
    Responded(Responded),
    /// `permission.list`.
    Asks(Asks),
    /// `run.get`.
    Run(Box<RunView>),
    /// `run.list`.
    Page(RunPage),
    /// `run.subscribe`.
    Subscribed(Subscribed),
    /// `run.unsubscribe`.
    Unsubscribed(Unsubscribed),
    /// `run.rewind`.
    Rewound(Rewound),
    /// `run.fork`.
    Forked(Box<Forked>),
    /// `run.file`.
    File(SnapshotFile),
}
