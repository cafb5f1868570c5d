//! The `Store` trait and its records: where runs are made durable. A run
//! writes its session and run rows at the start, a checkpoint whenever its
//! turn machine asks for one (the [`RunState`], the messages added and the
//! events emitted since the last one, in one write: before a turn's calls
//! run and before each tail call), a journal row before and after each call
//! of a tool that has side effects, and its final status. What is done with
//! stored runs (recovery, cancel, a session's history) is in
//! [`crate::recovery`]; see docs/architecture.md.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::audit::{AuditEntry, AuditQuery};
use crate::event::Event;
use crate::machine::RunState;
use crate::message::{Message, ToolCall};
use crate::metrics::RunMetrics;
use crate::status::{InvalidTransition, RunStatus};
use crate::tool_result::ToolResult;

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
    /// When it began executing, milliseconds since the Unix epoch; while
    /// it waits in a gateway's line, when it was accepted. The order of
    /// every list of runs.
    #[serde(alias = "started_ms")]
    pub started_ms: u64,
    /// When a gateway accepted it into its line (absent for a run started
    /// at once, from the command line or the library).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_ms: Option<u64>,
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
    /// Who the run belongs to: the name of the server token that started
    /// it (none for runs started from the command line or the library).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The run that started this one as a sub-agent (its `task` call), and
    /// the turn that called it; absent for a top-level run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
}

impl RunRecord {
    /// A run that has not ended, with nothing recorded of it yet: no owner,
    /// acceptance time, answer, metrics, workspace, principal or parent.
    pub fn new(
        run_id: impl Into<String>,
        session_id: impl Into<String>,
        prompt: impl Into<String>,
        model: impl Into<String>,
        status: RunStatus,
        started_ms: u64,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            session_id: session_id.into(),
            prompt: prompt.into(),
            model: model.into(),
            status,
            owner: String::new(),
            started_ms,
            accepted_ms: None,
            ended_ms: None,
            content: None,
            metrics: RunMetrics::default(),
            workspace: None,
            principal: None,
            parent: None,
        }
    }
}

/// Where a sub-agent's run hangs in its run tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    /// The parent run.
    pub run_id: String,
    /// The parent's turn whose `task` call started this run.
    pub turn_id: String,
}

/// What a request carrying an idempotency key led to
/// ([`Admissions::remember_request`]): a retry with the same key and payload gets
/// the same run, also from another process or after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedRequest {
    /// A digest of the request's payload, without the key: the same key with
    /// another payload is a conflict, not a retry.
    pub digest: u64,
    /// The run the request started (or joined).
    pub run_id: String,
}

/// Which runs to list ([`RunIndex::query_runs`]), newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Only the runs of this principal.
    pub principal: Option<String>,
    /// Only runs some principal owns (a server token's runs: not those
    /// started at the command line or by the library).
    pub owned: bool,
    /// Only runs in this status.
    pub status: Option<RunStatus>,
    /// Only the runs of this session.
    pub session_id: Option<String>,
    /// Only runs older than this one (its start time and id): the cursor
    /// of the next page.
    pub before: Option<(u64, String)>,
    /// At most this many.
    pub limit: usize,
}

impl RunQuery {
    /// Whether `run` is one the query asks for (the limit aside).
    pub fn matches(&self, run: &RunRecord) -> bool {
        self.principal
            .as_deref()
            .is_none_or(|p| run.principal.as_deref() == Some(p))
            && (!self.owned || run.principal.is_some())
            && self.status.is_none_or(|s| run.status == s)
            && self.session_id.as_deref().is_none_or(|s| run.session_id == s)
            && self
                .before
                .as_ref()
                .is_none_or(|(ms, id)| (run.started_ms, run.run_id.as_str()) < (*ms, id.as_str()))
    }
}

/// What a run adds since its last checkpoint, written in one transaction.
#[derive(Debug, Clone)]
pub struct Checkpoint<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The run's state: where it continues from, and its metrics.
    pub state: &'a RunState,
    /// Messages the turn added (appended after the stored ones).
    pub new_messages: &'a [Message],
    /// When the history was replaced (compression), the whole new history.
    pub replaced_history: Option<&'a [Message]>,
    /// Events emitted since the last checkpoint.
    pub events: &'a [Event],
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
    /// The run's state at its last checkpoint (with the run's metrics),
    /// if one was written. Read it with [`RunState::from_json`].
    pub state: Option<RunState>,
    /// Journaled calls of tools that have side effects.
    pub journal: Vec<JournalEntry>,
    /// The `seq` of the last stored event (0 when none): a resumed run
    /// continues numbering after it.
    pub last_seq: u64,
}

/// A run a gateway accepted and has not started, as it is stored: so
/// that a restart — after a crash too — starts it rather than losing it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRun {
    /// Its record: status `QUEUED`, `owner` empty (nobody executes it yet).
    pub record: RunRecord,
    /// What starts it: the request as the gateway took it (JSON).
    pub request: String,
}

/// A store failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An illegal status transition (docs/architecture.md, run status).
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
    /// The store cannot be reached now (its server is down, restarting or
    /// too slow to answer): the same request may succeed later.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// Too many runs are waiting: the run was not taken (a bounded line).
    #[error("too many runs are waiting (at most {limit}); try again later")]
    QueueFull {
        /// The bound.
        limit: usize,
    },
    /// The write was for a run this process no longer holds: another
    /// process took it over, or this one gave it up (docs/cluster.md,
    /// leases). Nothing was written.
    #[error("the run {0} is no longer held by this process; nothing was written")]
    Fenced(String),
    /// Anything else the backend reported.
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether the run that met this error should stop resumable
    /// (`INTERRUPTED`) rather than fail: the store is out of reach for now
    /// (down, its disk full, its database held by another process past the
    /// busy timeout), or another process holds the run — the run is not
    /// broken, and it goes on from its last checkpoint (docs/cluster.md).
    pub fn interrupts(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Locked { .. } | Self::Fenced(_))
    }
}

/// What [`RunLog::append_events_then`] calls once the events are stored or
/// refused, handing them back.
pub type EventsStored = Box<dyn FnOnce(Vec<Event>, Result<(), StoreError>) + Send>;

/// A run's own record and log, as the run writes it and a reader of one
/// run reads it: its row, status and owner, events, checkpoints and the
/// journal of its tool calls.
#[async_trait]
pub trait RunLog: Send + Sync + 'static {
    /// Records a new run (and its session, if new) with its status — or,
    /// for a run the store holds `QUEUED` (see [`Admissions::queue_run`]), moves
    /// that record to `run`'s status, owner and start time (its acceptance
    /// time and request stay). Any other run of that id is an error.
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError>;

    /// Appends events to `run_id`'s log (events already there are kept as
    /// they are). A run's events are appended as they happen, in small
    /// groups, before anybody sees them.
    async fn append_events(&self, run_id: &str, events: &[Event]) -> Result<(), StoreError>;

    /// [`RunLog::append_events`] with nobody waiting: `then` gets the events
    /// back once they are stored or refused, on whatever thread the store
    /// finished on (so it must not block), possibly before this returns.
    /// A run's event log writes this way so that its events become visible
    /// the moment the store has them, rather than once a task woken to hear
    /// so gets its turn: on a busy gateway every woken task waits behind
    /// all the others ready to run, and each event paid that wait once
    /// more. A store that answers from a writer thread of its own should
    /// call `then` there; the default awaits `append_events` on a task.
    fn append_events_then(self: Arc<Self>, run_id: Arc<str>, events: Vec<Event>, then: EventsStored) {
        tokio::spawn(async move {
            let result = self.append_events(&run_id, &events).await;
            then(events, result);
        });
    }

    /// Moves a run to `to`, refusing transitions docs/architecture.md does not allow.
    async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError>;

    /// Writes one turn's checkpoint atomically.
    async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError>;

    /// Records that `call`, of a tool with side effects, is about to run
    /// (before it runs).
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

    /// A run's events with `seq` greater than `after_seq`.
    async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError>;

    /// At most `limit` of a run's events with `seq` greater than
    /// `after_seq`, in order: a long log read page by page. The default
    /// reads the whole log and keeps the page.
    async fn events_page(&self, run_id: &str, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut events = self.events(run_id, after_seq).await?;
        events.truncate(limit);
        Ok(events)
    }

    /// The `seq` of each run's last recorded event (0 for none), in the
    /// order of `run_ids`: what a run list reports as `lastSeq`. The
    /// default reads each log; a store with an index does better.
    async fn last_seqs(&self, run_ids: &[String]) -> Result<Vec<u64>, StoreError> {
        let mut seqs = Vec::with_capacity(run_ids.len());
        for run_id in run_ids {
            let events = self.events(run_id, 0).await?;
            seqs.push(events.last().map_or(0, |event| event.seq));
        }
        Ok(seqs)
    }

    /// Marks an active run `INTERRUPTED` if it is still owned by `owner`
    /// (whose process is known to be dead). Returns whether it changed.
    async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError>;

    /// Takes an `INTERRUPTED` run over: `RUNNING` again, owned by `owner`.
    async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError>;

    /// Whether the store keeps anything. Only the store of a run without
    /// one says no; its callers then skip the calls that would do nothing
    /// (a journal row per tool call, a checkpoint per turn) — same path,
    /// no cost.
    fn keeps_anything(&self) -> bool {
        true
    }

    /// The lease this store's writes are fenced by (a worker's store of a
    /// run it holds, docs/cluster.md), if any.
    fn write_fence(&self) -> Option<crate::fence::WriteFence> {
        None
    }
}

/// The runs, listed and looked up: newest first, by query, by session,
/// by parent, and those that claim to be executing.
#[async_trait]
pub trait RunIndex: Send + Sync + 'static {
    /// The newest runs first.
    async fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError>;

    /// Runs that claim to be executing or about to (`QUEUED`, `RUNNING`,
    /// `WAITING_PERMISSION`): each names the process that owns it.
    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// The runs of a session, oldest first.
    async fn session_runs(&self, session_id: &str) -> Result<Vec<RunRecord>, StoreError>;

    /// The runs started as sub-agents of `parent_run_id`, oldest first. The
    /// default filters [`RunIndex::list_runs`]; a store with an index does better.
    async fn child_runs(&self, parent_run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs: Vec<RunRecord> = self
            .list_runs(usize::MAX)
            .await?
            .into_iter()
            .filter(|run| run.parent.as_ref().is_some_and(|parent| parent.run_id == parent_run_id))
            .collect();
        runs.sort_by(|a, b| (a.started_ms, &a.run_id).cmp(&(b.started_ms, &b.run_id)));
        Ok(runs)
    }

    /// The runs `query` asks for, newest first (by start time, then id
    /// descending). The default filters [`RunIndex::list_runs`]; a store with
    /// an index does better.
    async fn query_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs: Vec<RunRecord> = self
            .list_runs(usize::MAX)
            .await?
            .into_iter()
            .filter(|run| query.matches(run))
            .collect();
        runs.sort_by(|a, b| (b.started_ms, &b.run_id).cmp(&(a.started_ms, &a.run_id)));
        runs.truncate(query.limit);
        Ok(runs)
    }
}

/// What a gateway admitted and has not started, and what it answered:
/// queued runs with the requests that start them, and idempotency keys.
#[async_trait]
pub trait Admissions: Send + Sync + 'static {
    /// Records a run accepted and not started (`QUEUED`, no owner, its
    /// `started_ms` kept as its acceptance time, `accepted_ms`) with the
    /// request that starts it, and — in the same write — the idempotency
    /// key of the request that asked for it (`(key, request)`, owned by the
    /// run's principal). Once this returns, the run outlives the process.
    async fn queue_run(&self, run: &QueuedRun, key: Option<(&str, &KeyedRequest)>) -> Result<(), StoreError>;

    /// The runs [`Admissions::queue_run`] recorded that are still `QUEUED`, in
    /// the order they were accepted.
    async fn queued_runs(&self) -> Result<Vec<QueuedRun>, StoreError>;

    /// The request a gateway stored with the run ([`Admissions::queue_run`]),
    /// kept after it started: what a run resumed after a restart was
    /// allowed (its tools). `None` for runs no gateway queued.
    async fn run_request(&self, run_id: &str) -> Result<Option<String>, StoreError>;

    /// Remembers what `owner`'s request with idempotency `key` led to. The
    /// first answer for a key stays: remembering it again changes nothing.
    /// A store may forget keys after a day.
    async fn remember_request(&self, owner: &str, key: &str, request: &KeyedRequest) -> Result<(), StoreError>;

    /// What [`Admissions::remember_request`] kept for `owner`'s `key`.
    async fn remembered_request(&self, owner: &str, key: &str) -> Result<Option<KeyedRequest>, StoreError>;
}

/// The audit trail (docs/server.md, "Audit trail"): append-only.
#[async_trait]
pub trait AuditLog: Send + Sync + 'static {
    /// Appends `entry` to the audit trail (docs/server.md, "Audit
    /// trail"). Records are kept in the order they are appended and never
    /// changed.
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;

    /// The audit records `query` asks for, oldest first.
    async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;
}

/// Durable storage of sessions, runs, messages, checkpoints, events and
/// the tool journal: every role, and where the store lives. A caller that
/// needs one role takes that trait (the engine writes through [`RunLog`]);
/// `Arc<dyn Store>` coerces to each.
pub trait Store: RunLog + RunIndex + Admissions + AuditLog {
    /// The files this store writes, if it writes local files: tools are
    /// kept away from them (a tool writing into the database would break
    /// the run that records it).
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// Where this store lives when processes reach it over the network
    /// (Redis): what is kept beside the runs (their workspace snapshots)
    /// is kept there too. `None` for a store in local files ([`Store::files`]).
    fn address(&self) -> Option<StoreAddress> {
        None
    }
}

/// A store reached over the network ([`Store::address`]).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreAddress {
    /// Its URL (`redis://HOST:PORT/DB`; it may hold a password).
    pub url: String,
    /// The prefix of its keys.
    pub prefix: String,
}

impl std::fmt::Debug for StoreAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("StoreAddress")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RunSnapshot {
    /// The turn the run continues from, if a checkpoint was written.
    pub fn next_turn(&self) -> Option<&crate::turn_state::TurnState> {
        self.state.as_ref().map(RunState::turn)
    }
}

/// The store of a run that is not made durable: it keeps nothing, so a run
/// without a store takes the same path as one with a store.
#[derive(Debug, Default)]
pub(crate) struct NoStore;

#[async_trait]
impl RunLog for NoStore {
    fn keeps_anything(&self) -> bool {
        false
    }

    async fn create_run(&self, _run: &RunRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn append_events(&self, _run_id: &str, _events: &[Event]) -> Result<(), StoreError> {
        Ok(())
    }

    async fn set_status(&self, _run_id: &str, _to: RunStatus) -> Result<(), StoreError> {
        Ok(())
    }

    async fn checkpoint(&self, _checkpoint: &Checkpoint<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn journal_intent(&self, _run_id: &str, _call: &ToolCall) -> Result<(), StoreError> {
        Ok(())
    }

    async fn journal_result(&self, _run_id: &str, _result: &ToolResult) -> Result<(), StoreError> {
        Ok(())
    }

    async fn finish_run(
        &self,
        _run_id: &str,
        _status: RunStatus,
        _content: Option<&str>,
        _metrics: &RunMetrics,
        _events: &[Event],
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError> {
        Err(StoreError::NotFound(run_id.to_string()))
    }

    async fn events(&self, run_id: &str, _after_seq: u64) -> Result<Vec<Event>, StoreError> {
        Err(StoreError::NotFound(run_id.to_string()))
    }

    async fn mark_interrupted(&self, _run_id: &str, _owner: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn reclaim_run(&self, run_id: &str, _owner: &str) -> Result<(), StoreError> {
        Err(StoreError::NotFound(run_id.to_string()))
    }
}

#[async_trait]
impl RunIndex for NoStore {
    async fn list_runs(&self, _limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn session_runs(&self, _session_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }
}

#[async_trait]
impl Admissions for NoStore {
    async fn queue_run(&self, _run: &QueuedRun, _key: Option<(&str, &KeyedRequest)>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn queued_runs(&self) -> Result<Vec<QueuedRun>, StoreError> {
        Ok(Vec::new())
    }

    async fn run_request(&self, _run_id: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    async fn remember_request(&self, _owner: &str, _key: &str, _request: &KeyedRequest) -> Result<(), StoreError> {
        Ok(())
    }

    async fn remembered_request(&self, _owner: &str, _key: &str) -> Result<Option<KeyedRequest>, StoreError> {
        Ok(None)
    }
}

#[async_trait]
impl AuditLog for NoStore {
    async fn append_audit(&self, _entry: &AuditEntry) -> Result<(), StoreError> {
        Ok(())
    }

    async fn audit_entries(&self, _query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(Vec::new())
    }
}

impl Store for NoStore {}
