//! The runs this gateway holds: queued and executing runs with their
//! controls, idempotency keys, and (without a store) the finished runs
//! kept in memory. Plain data under one lock;
//! [`crate::service`] does the IO around it, and [`crate::queue`] decides
//! which runs execute.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use loom_core::{Agent, LiveState, Message, ResumingRun, RunRecord, RunRequest, RunStatus};
use tokio::sync::watch;

use crate::auth::Principal;
use crate::control::RunControl;
use crate::protocol::RunView;
use crate::queue::Ticket;

/// A run the gateway holds, queued or executing. What it shows of itself
/// once it has controls — status, asks, usage, last seq — it publishes
/// ([`RunControl::state`]); the gateway keeps no copy.
pub(crate) struct LiveRun {
    pub(crate) run_id: String,
    pub(crate) session_id: String,
    pub(crate) principal: Principal,
    pub(crate) prompt: String,
    pub(crate) model: String,
    /// When it began executing (its `lifecycle.start`, the time its record
    /// keeps), once it has; none while it waits.
    pub(crate) started_ms: Option<u64>,
    /// When a gateway accepted it (none for a run it took over from the
    /// command line's store).
    pub(crate) accepted_ms: Option<u64>,
    /// Waiting in the gateway's line: the queue has not let it start.
    pub(crate) queued: bool,
    /// What starts it, until it is launched.
    pub(crate) start: Option<Start>,
    /// Whether its record is in the store (always, without one): the queue
    /// may let it start before, but it is launched only after.
    pub(crate) stored: bool,
    /// Its controls: once started (a run taken back after a restart has
    /// them while it waits, to show and take answers to the asks it left open).
    pub(crate) controller: Option<Arc<dyn RunControl>>,
    /// A cancel that came before the controls did.
    pub(crate) cancel_requested: bool,
    /// Its asks counted in the `loom_permission_pending` gauge.
    pub(crate) asks_counted: usize,
    /// Executed by a worker (docs/cluster.md): it shows `QUEUED` until a
    /// worker starts it, rather than as soon as this gateway lets it go.
    pub(crate) on_worker: bool,
    /// The `seq` of its last event, once it has stopped.
    pub(crate) done: watch::Sender<Option<(u64, RunStatus)>>,
}

impl LiveRun {
    /// Its record in the store, with `status` (no owner: nobody executes it yet).
    pub(crate) fn record(&self, status: RunStatus) -> RunRecord {
        RunRecord {
            principal: Some(self.principal.name().to_string()),
            accepted_ms: self.accepted_ms,
            ..RunRecord::new(
                &self.run_id,
                &self.session_id,
                &self.prompt,
                &self.model,
                status,
                self.listed_ms(),
            )
        }
    }

    /// Where it stands in lists: its start, or, until it has begun, its
    /// acceptance (as stores order runs).
    pub(crate) fn listed_ms(&self) -> u64 {
        self.started_ms.or(self.accepted_ms).unwrap_or_default()
    }

    /// It began at `started_ms` (its first `lifecycle.start`; a resumed
    /// run keeps the start it had).
    pub(crate) fn began(&mut self, event: &loom_core::Event) {
        if let (loom_core::EventKind::LifecycleStart { resumed: false, .. }, Some(ms)) = (&event.kind, event.ts_ms()) {
            self.started_ms.get_or_insert(ms);
        }
    }

    /// What the run shows now: its own state, once it has controls.
    pub(crate) fn state(&self) -> LiveState {
        let mut state = self.controller.as_ref().map(|c| c.state()).unwrap_or_default();
        state.status = self.shown(&state);
        state
    }

    /// Its status now (read in place: the run's whole state is not copied).
    pub(crate) fn status(&self) -> RunStatus {
        match &self.controller {
            Some(controller) => self.shown(&controller.watch_state().borrow()),
            None => self.shown(&LiveState::default()),
        }
    }

    /// The status to show for the run's own `state`.
    fn shown(&self, state: &LiveState) -> RunStatus {
        match (self.queued, state.status) {
            (true, _) => RunStatus::Queued,
            // Let go by the queue, its loop not started yet (a run taken
            // back after a restart may show asks it left open).
            (false, RunStatus::Queued) if !state.pending_asks.is_empty() => RunStatus::WaitingPermission,
            (false, RunStatus::Queued) if self.on_worker => RunStatus::Queued,
            (false, RunStatus::Queued) => RunStatus::Running,
            (false, status) => status,
        }
    }

    pub(crate) fn view(&self, queue_position: Option<usize>) -> RunView {
        let state = self.state();
        RunView {
            run_id: self.run_id.clone(),
            session_id: self.session_id.clone(),
            status: state.status,
            prompt: self.prompt.clone(),
            model: self.model.clone(),
            started_ms: self.started_ms,
            accepted_ms: self.accepted_ms,
            ended_ms: None,
            content: state.content,
            metrics: state.metrics,
            pending_asks: state.pending_asks,
            queue_position,
            last_seq: state.last_seq,
            // A live sub-agent is not in the registry's runs.
            parent_run_id: None,
        }
    }
}

/// How a queued run starts.
pub(crate) enum Start {
    /// A new run.
    New(Agent, Box<RunRequest>),
    /// A run a previous process left interrupted, from its checkpoint.
    Resume(Box<ResumingRun>),
}

/// A run that may start now.
pub(crate) struct Launch {
    pub(crate) run_id: String,
    pub(crate) start: Start,
}

/// Every run the gateway holds.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) runs: HashMap<String, LiveRun>,
    /// Asks pending over all runs (kept up to date, so the gauge is O(1)).
    pending_total: usize,
    /// Sub-agents of live runs, by id: the run whose stream carries them
    /// (the root of their run tree), which answers their asks.
    pub(crate) sub_agents: HashMap<String, String>,
    /// The live runs of each session.
    by_session: HashMap<String, Vec<String>>,
    /// (principal, key) → (payload digest, run id).
    idempotency: HashMap<(Principal, String), (u64, String)>,
    idempotency_order: VecDeque<(Principal, String)>,
    /// Without a store: finished runs, and each session's conversation.
    pub(crate) finished: HashMap<String, (Principal, RunView)>,
    finished_order: VecDeque<String>,
    pub(crate) histories: HashMap<String, Vec<Message>>,
    histories_order: VecDeque<String>,
}

/// Idempotency keys remembered per gateway.
const IDEMPOTENCY_KEYS: usize = 100_000;

impl Registry {
    /// The run, if `principal` may see it (its own; an admin's, any).
    pub(crate) fn run(&self, principal: &Principal, run_id: &str) -> Option<&LiveRun> {
        self.runs.get(run_id).filter(|run| principal.reaches(&run.principal))
    }

    pub(crate) fn run_mut(&mut self, principal: &Principal, run_id: &str) -> Option<&mut LiveRun> {
        self.runs
            .get_mut(run_id)
            .filter(|run| principal.reaches(&run.principal))
    }

    /// Takes a run in.
    pub(crate) fn add(&mut self, run: LiveRun) {
        self.by_session
            .entry(run.session_id.clone())
            .or_default()
            .push(run.run_id.clone());
        self.pending_total += run.asks_counted;
        self.runs.insert(run.run_id.clone(), run);
    }

    /// The live runs of a session, executing first, then queued.
    pub(crate) fn on_session(&self, session_id: &str) -> Vec<&LiveRun> {
        let ids = self.by_session.get(session_id).map(Vec::as_slice).unwrap_or_default();
        let mut runs: Vec<&LiveRun> = ids.iter().filter_map(|id| self.runs.get(id)).collect();
        runs.sort_by_key(|run| (run.queued, run.listed_ms()));
        runs
    }

    pub(crate) fn remembered(&self, principal: &Principal, key: &str) -> Option<&(u64, String)> {
        self.idempotency.get(&(principal.clone(), key.to_string()))
    }

    pub(crate) fn remember(&mut self, principal: &Principal, key: String, digest: u64, run_id: String) {
        let entry = (principal.clone(), key);
        self.idempotency.insert(entry.clone(), (digest, run_id));
        self.idempotency_order.push_back(entry);
        while self.idempotency_order.len() > IDEMPOTENCY_KEYS {
            if let Some(old) = self.idempotency_order.pop_front() {
                self.idempotency.remove(&old);
            }
        }
    }

    /// The queue let these runs start: they are executing from now on.
    pub(crate) fn starting(&mut self, tickets: Vec<Ticket>) -> Vec<Launch> {
        let mut launches = Vec::new();
        for ticket in tickets {
            let Some(run) = self.runs.get_mut(&ticket.run_id) else {
                continue;
            };
            run.queued = false;
            launches.extend(Self::launch_of(run));
        }
        launches
    }

    /// What starts `run`, once it executes and is stored.
    fn launch_of(run: &mut LiveRun) -> Option<Launch> {
        if run.queued || !run.stored {
            return None;
        }
        let start = run.start.take()?;
        Some(Launch {
            run_id: run.run_id.clone(),
            start,
        })
    }

    /// `run_id`'s record is stored: it starts if the queue let it.
    pub(crate) fn stored(&mut self, run_id: &str) -> Option<Launch> {
        let run = self.runs.get_mut(run_id)?;
        run.stored = true;
        Self::launch_of(run)
    }

    /// Forgets an idempotency key (its run was not taken after all).
    pub(crate) fn forget_key(&mut self, principal: &Principal, key: &str) {
        self.idempotency.remove(&(principal.clone(), key.to_string()));
    }

    /// A run leaves the registry (it ended, or left the queue).
    pub(crate) fn remove(&mut self, run_id: &str) -> Option<LiveRun> {
        let run = self.runs.remove(run_id)?;
        self.pending_total = self.pending_total.saturating_sub(run.asks_counted);
        if let Some(ids) = self.by_session.get_mut(&run.session_id) {
            ids.retain(|id| id != run_id);
            if ids.is_empty() {
                self.by_session.remove(&run.session_id);
            }
        }
        Some(run)
    }

    /// Keeps a finished run in memory (without a store), `keep` at most.
    pub(crate) fn keep_finished(&mut self, principal: Principal, view: RunView, keep: usize) {
        let id = view.run_id.clone();
        self.finished.insert(id.clone(), (principal, view));
        self.finished_order.push_back(id);
        while self.finished_order.len() > keep {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    /// Keeps a session's conversation (without a store), for the
    /// `keep` most recently continued sessions.
    pub(crate) fn remember_history(&mut self, key: String, history: Vec<Message>, keep: usize) {
        if self.histories.insert(key.clone(), history).is_some() {
            self.histories_order.retain(|known| *known != key);
        }
        self.histories_order.push_back(key);
        while self.histories_order.len() > keep {
            if let Some(old) = self.histories_order.pop_front() {
                self.histories.remove(&old);
            }
        }
    }

    /// `run_id` has `now` asks waiting.
    pub(crate) fn count_asks(&mut self, run_id: &str, now: usize) {
        if let Some(run) = self.runs.get_mut(run_id) {
            self.pending_total = (self.pending_total + now).saturating_sub(run.asks_counted);
            run.asks_counted = now;
        }
    }

    /// Asks waiting over all runs.
    pub(crate) fn pending_total(&self) -> usize {
        self.pending_total
    }
}
