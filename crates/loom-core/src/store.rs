//! The `Store` trait: where runs are made durable. A run writes its
//! session and run rows at the start, one checkpoint per turn (the next
//! `TurnState`, the turn's new messages and events, in one write, before the
//! tail call), a journal row before and after each call of a tool that is
//! not read-only, and its final status.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::message::{Message, ToolCall};
use crate::metrics::RunMetrics;
use crate::status::{InvalidTransition, RunStatus};
use crate::tool_result::ToolResult;
use crate::turn_state::TurnState;

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// The user's request.
    pub prompt: String,
    /// The model, `provider:name`.
    pub model: String,
    /// Its status.
    pub status: RunStatus,
    /// Who runs it (a process id and host, or a worker id).
    pub owner: String,
    /// Start, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// End, when it ended.
    pub ended_ms: Option<u64>,
    /// The answer, when there is one.
    pub content: Option<String>,
    /// The metrics at the last checkpoint or at the end.
    pub metrics: RunMetrics,
}

/// What one turn adds, written in one transaction before the tail call.
#[derive(Debug, Clone)]
pub struct Checkpoint<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The state the next turn starts from.
    pub next: &'a TurnState,
    /// Messages the turn added (appended after the stored ones).
    pub new_messages: &'a [Message],
    /// When the history was replaced (compression), the whole new history.
    pub replaced_history: Option<&'a [Message]>,
    /// Events emitted since the last checkpoint.
    pub events: &'a [Event],
    /// The run's metrics so far.
    pub metrics: &'a RunMetrics,
}

/// A tool call journaled before it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The call.
    pub call: ToolCall,
    /// Its result, once it finished.
    pub result: Option<ToolResult>,
}

/// Everything needed to look at, or resume, a run.
#[derive(Debug, Clone)]
pub struct RunSnapshot {
    /// The run row.
    pub run: RunRecord,
    /// The history as of the last checkpoint.
    pub messages: Vec<Message>,
    /// The state the next turn starts from, if a turn was checkpointed.
    pub next_turn: Option<TurnState>,
    /// Journaled calls of tools that are not read-only.
    pub journal: Vec<JournalEntry>,
}

/// A store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An illegal status transition (DESIGN 4.2).
    #[error(transparent)]
    InvalidState(#[from] InvalidTransition),
    /// No such run.
    #[error("no run with id '{0}'")]
    NotFound(String),
    /// The database was written by a newer Loom.
    #[error("the database has schema version {found}, newer than this Loom understands ({supported}); upgrade Loom")]
    NewerSchema {
        /// The database's version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// The file is not a database, or is damaged.
    #[error("the database {path} is not usable: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// What SQLite said.
        message: String,
    },
    /// Another process held the database longer than the busy timeout.
    #[error("the database is locked by another process (waited {waited_ms} ms)")]
    Locked {
        /// How long we waited.
        waited_ms: u64,
    },
    /// Anything else the backend reported.
    #[error("store error: {0}")]
    Backend(String),
}

/// Durable storage of sessions, runs, messages, checkpoints, events and
/// the tool journal.
#[async_trait]
pub trait Store: Send + Sync {
    /// Records a new run (and its session, if new) with status `QUEUED`.
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError>;

    /// Moves a run to `to`, refusing transitions DESIGN 4.2 does not allow.
    async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError>;

    /// Writes one turn's checkpoint atomically.
    async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError>;

    /// Records that `call` is about to run (before it runs).
    async fn journal_intent(&self, run_id: &str, call: &ToolCall) -> Result<(), StoreError>;

    /// Records the result of a journaled call.
    async fn journal_result(&self, run_id: &str, result: &ToolResult) -> Result<(), StoreError>;

    /// Ends a run: its status, answer, metrics, and the last events.
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        content: Option<&str>,
        metrics: &RunMetrics,
        events: &[Event],
    ) -> Result<(), StoreError>;

    /// A run with its history, last checkpoint and journal.
    async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError>;

    /// The newest runs first.
    async fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError>;

    /// A run's events with `seq` greater than `after_seq`.
    async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError>;
}
