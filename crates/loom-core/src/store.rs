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

/// A run as stored. In JSON its fields are camelCase, like every JSON Loom
/// prints (`runId`, `startedMs`, …); the older snake_case names are read too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// The run.
    #[serde(alias = "run_id")]
    pub run_id: String,
    /// Its session.
    #[serde(alias = "session_id")]
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
    #[serde(alias = "started_ms")]
    pub started_ms: u64,
    /// End, when it ended.
    #[serde(alias = "ended_ms")]
    pub ended_ms: Option<u64>,
    /// The answer, when there is one.
    pub content: Option<String>,
    /// The metrics at the last checkpoint or at the end.
    pub metrics: RunMetrics,
    /// The directory the run's tools were confined to (unknown for runs
    /// recorded before schema 2).
    #[serde(default)]
    pub workspace: Option<String>,
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
    /// The `seq` of the last stored event (0 when none): a resumed run
    /// continues numbering after it.
    pub last_seq: u64,
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

    /// Runs that claim to be executing or about to (`QUEUED`, `RUNNING`,
    /// `WAITING_PERMISSION`): each names the process that owns it.
    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// Marks an active run `INTERRUPTED` if it is still owned by `owner`
    /// (whose process is known to be dead). Returns whether it changed.
    async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError>;

    /// Takes an `INTERRUPTED` run over: `RUNNING` again, owned by `owner`.
    async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError>;

    /// The runs of a session, oldest first.
    async fn session_runs(&self, session_id: &str) -> Result<Vec<RunRecord>, StoreError>;

    /// The files this store writes, if it writes local files: tools are
    /// kept away from them (a tool writing into the database would break
    /// the run that records it).
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
}

/// Marks every active run whose owner process is known to be dead as
/// `INTERRUPTED` (DESIGN 4.2) and returns their ids. Runs owned by live
/// processes, other hosts or workers are left alone.
pub async fn recover_interrupted_runs(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    let mut interrupted = Vec::new();
    for run in store.active_runs().await? {
        if crate::owner::liveness(&run.owner) == crate::owner::Liveness::Dead
            && store.mark_interrupted(&run.run_id, &run.owner).await?
        {
            interrupted.push(run.run_id);
        }
    }
    Ok(interrupted)
}

/// The conversation so far of a session, to continue it: the history of
/// its latest run without its system prompt (a new run writes its own),
/// with any call that run left without a result closed (see
/// [`crate::resume::close_dangling`]). Empty for a new session.
pub async fn session_history(store: &dyn Store, session_id: &str) -> Result<Vec<Message>, StoreError> {
    // The latest run that wrote anything: a run whose process died before
    // its first checkpoint holds no messages.
    for run in store.session_runs(session_id).await?.iter().rev() {
        let snapshot = store.load_run(&run.run_id).await?;
        if snapshot.messages.is_empty() {
            continue;
        }
        let mut messages = snapshot.messages;
        if matches!(messages.first(), Some(Message::System { .. })) {
            messages.remove(0);
        }
        crate::resume::close_dangling(&mut messages, &snapshot.journal);
        return Ok(messages);
    }
    Ok(Vec::new())
}

/// Cancels a stored run that no process executes (`QUEUED`, or
/// `INTERRUPTED` after its process died): its event log is closed with
/// `execution.cancelled` and `lifecycle.end`, continuing its `seq`, so the
/// log ends like every other run's. A run a live process executes must be
/// cancelled through that process instead.
pub async fn close_cancelled(store: &dyn Store, run_id: &str, reason: &str) -> Result<(), StoreError> {
    use crate::event::{EventEmitter, EventKind, TurnIds};

    let snapshot = store.load_run(run_id).await?;
    let state = snapshot.next_turn.unwrap_or_else(|| TurnState::initial(1));
    // Nobody listens: the events only go to the log.
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let events = EventEmitter::new(run_id.into(), 0, tx)
        .continuing_after(snapshot.last_seq)
        .with_log();
    let turn = TurnIds::of(&state);
    events.emit(
        &turn,
        EventKind::ExecutionCancelled {
            reason: reason.to_string(),
        },
    );
    events.emit(
        &turn,
        EventKind::LifecycleEnd {
            status: RunStatus::Canceled,
            content: None,
            metrics: snapshot.run.metrics.clone(),
        },
    );
    store
        .finish_run(
            run_id,
            RunStatus::Canceled,
            None,
            &snapshot.run.metrics,
            &events.take_log(),
        )
        .await
}
