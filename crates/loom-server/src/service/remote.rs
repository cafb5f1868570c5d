//! Runs executed by `loom worker` processes (a gateway on a cluster that
//! executes nothing itself, docs/cluster.md). Such a run is "launched" by
//! following it: one reader per gateway ([`EventTail`]) reads the stored
//! events of every run it follows — and of their sub-agents, found as
//! they start — and passes them to the feed as a run of this process
//! would; its controls are stored for whichever worker has it
//! ([`RunLeases::send_control`]) before a client hears they were taken;
//! its end is its `lifecycle.end` in the log — but an `INTERRUPTED` one
//! only hands it to the next worker. A run another gateway accepted is
//! followed here too once a client of this one asks for it
//! ([`Service::adopt`]).

use std::collections::{HashMap, HashSet};

use loom_core::{ControlError, EventTail, LiveState, RunLeases, Tailed};

use super::*;

/// What a gateway on a cluster reaches its runs with.
#[derive(Clone)]
pub struct Cluster {
    /// The leases: controls to the workers, cancels of runs none took yet.
    pub leases: Arc<dyn RunLeases>,
    /// The reader of the runs' stored events.
    pub tail: Arc<dyn EventTail>,
    /// The workspaces' lines: a rewind's files restored by a worker of
    /// the machine that holds them.
    pub jobs: Arc<dyn loom_core::WorkspaceJobs>,
}

/// How long one read of the followed runs waits for an event: a run
/// followed meanwhile is read from the next read on.
const READ_WAIT: Duration = Duration::from_millis(100);

/// How often runs with `task` calls open are asked for new sub-agents.
const DISCOVER_EVERY: Duration = Duration::from_millis(200);
/// How often a cluster gateway counts the cluster's runs for its gauges.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// The runs a gateway follows: its top-level runs, their sub-agents, and
/// the runs whose `task` calls may start sub-agents now.
#[derive(Default)]
pub(super) struct Followed {
    state: Mutex<FollowedState>,
    added: tokio::sync::Notify,
}

#[derive(Default)]
struct FollowedState {
    roots: HashMap<String, Arc<RemoteRun>>,
    /// The sub-agents found, until their root ends (one that ended stays
    /// known, so that it is not found and read again).
    children: HashMap<String, ChildCursor>,
    /// Runs (roots or sub-agents) with `task` calls running.
    parents: HashSet<String>,
}

/// A followed sub-agent.
struct ChildCursor {
    root: String,
    /// The last `seq` read of its log.
    read: u64,
    /// Its log has ended: not read any more.
    ended: bool,
}

impl Followed {
    fn lock(&self) -> MutexGuard<'_, FollowedState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every followed log with the last `seq` read of it.
    fn cursors(&self) -> Vec<(String, u64)> {
        let state = self.lock();
        state
            .roots
            .iter()
            .map(|(id, run)| (id.clone(), run.read.load(Ordering::SeqCst)))
            .chain(
                state
                    .children
                    .iter()
                    .filter(|(_, child)| !child.ended)
                    .map(|(id, child)| (id.clone(), child.read)),
            )
            .collect()
    }

    /// The root of a followed run, if it is followed.
    fn root_of(&self, run_id: &str) -> Option<String> {
        let state = self.lock();
        if state.roots.contains_key(run_id) {
            return Some(run_id.to_string());
        }
        state.children.get(run_id).map(|child| child.root.clone())
    }
}

/// A run executed elsewhere, as this gateway sees and controls it.
pub(super) struct RemoteRun {
    run_id: String,
    leases: Arc<dyn RunLeases>,
    state: watch::Sender<LiveState>,
    /// The last `seq` read of its log.
    read: std::sync::atomic::AtomicU64,
}

impl RemoteRun {
    /// Stores `control` for the run's worker; returns once it is stored.
    pub(super) async fn deliver(&self, control: Control) -> Result<(), StoreError> {
        let last_seq = self.state.borrow().last_seq;
        store_control(self.leases.as_ref(), &self.run_id, last_seq, &control).await
    }

    /// Whether an ask with this id is shown waiting.
    pub(super) fn asks(&self, request_id: &str) -> bool {
        self.state
            .borrow()
            .pending_asks
            .iter()
            .any(|ask| ask.request_id == request_id)
    }
}

/// Stores `control` for the worker of `run_id` (whose last event shown is
/// `last_seq`). A cancel of a run no worker took yet ends it here.
async fn store_control(
    leases: &dyn RunLeases,
    run_id: &str,
    last_seq: u64,
    control: &Control,
) -> Result<(), StoreError> {
    if let Control::Cancel { reason } = control {
        let turn = TurnIds {
            turn_id: run_id.into(),
            parent_turn_id: None,
        };
        let log = loom_core::recovery::cancelled_log(run_id, last_seq, &turn, reason, &RunMetrics::default());
        if leases.withdraw(run_id, &log).await? {
            return Ok(());
        }
    }
    leases.send_control(run_id, control).await
}

impl RunControl for RemoteRun {
    /// For the few paths that cannot wait (a cancel asked while the run
    /// was being written, which its caller waits on the end of): stored
    /// on a task of its own. Clients' controls go through
    /// [`RemoteRun::deliver`].
    fn send(&self, control: Control) -> Result<(), ControlError> {
        // A gateway going away interrupts nothing its workers execute.
        if matches!(control, Control::Interrupt { .. }) {
            return Ok(());
        }
        if let Control::PermissionReply { request_id, .. } = &control {
            if !self.asks(request_id) {
                return Err(ControlError::UnknownRequest(request_id.clone()));
            }
        }
        let (leases, run_id) = (self.leases.clone(), self.run_id.clone());
        let last_seq = self.state.borrow().last_seq;
        tokio::spawn(async move {
            if let Err(err) = store_control(leases.as_ref(), &run_id, last_seq, &control).await {
                tracing::error!(run_id, error = %err, "a control could not be stored for the run's worker");
            }
        });
        Ok(())
    }

    fn state(&self) -> LiveState {
        self.state.borrow().clone()
    }

    fn watch_state(&self) -> watch::Receiver<LiveState> {
        self.state.subscribe()
    }
}

impl Service {
    /// Whether runs execute on workers rather than here.
    pub(super) fn on_workers(&self) -> bool {
        self.inner.cluster.is_some()
    }

    /// The followed run `run_id` of `principal`, if this gateway follows it.
    pub(super) fn followed_run(&self, principal: &Principal, run_id: &str) -> Option<Arc<RemoteRun>> {
        if !self.on_workers() || self.registry().run(principal, run_id).is_none() {
            return None;
        }
        self.inner.followed.lock().roots.get(run_id).cloned()
    }

    /// Where a run no worker took yet waits in the cluster's line (`None`
    /// when it does not, or the store cannot say now).
    pub(super) async fn cluster_position(&self, run_id: &str) -> Option<usize> {
        let cluster = self.inner.cluster.as_ref()?;
        match cluster.leases.queue_position(run_id).await {
            Ok(position) => position,
            Err(err) => {
                tracing::warn!(run_id, error = %err, "cannot read the run's place in line");
                None
            }
        }
    }

    /// Starts the gateway's one reader of its followed runs, and the
    /// finder of their sub-agents.
    pub(super) fn start_reading(&self) {
        let Some(cluster) = self.inner.cluster.clone() else {
            return;
        };
        let service = Arc::downgrade(&self.inner);
        let followed = self.inner.followed.clone();
        tokio::spawn(async move {
            loop {
                let runs = followed.cursors();
                if runs.is_empty() {
                    let added = followed.added.notified();
                    // Woken by a run followed, or now and then to see
                    // whether the gateway is gone.
                    let _ = tokio::time::timeout(Duration::from_secs(1), added).await;
                    if service.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
                let read = cluster.tail.read(&runs, READ_WAIT).await;
                let Some(inner) = service.upgrade() else { return };
                let service = Service { inner };
                match read {
                    Ok(entries) => {
                        for entry in entries {
                            service.on_followed_entry(entry);
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot read the followed runs' events");
                        drop(service);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        // The gauges of runs: the cluster's, as the store counts them —
        // the same on every gateway of it, and true after a restart.
        let service = Arc::downgrade(&self.inner);
        let leases = cluster.leases.clone();
        tokio::spawn(async move {
            loop {
                if service.strong_count() == 0 {
                    return;
                }
                match leases.run_counts().await {
                    Ok(counts) => {
                        metrics::gauge!("loom_runs_active").set(counts.active as f64);
                        metrics::gauge!("loom_runs_queued").set(counts.queued as f64);
                    }
                    Err(err) => tracing::debug!(error = %err, "cannot count the cluster's runs"),
                }
                tokio::time::sleep(COUNT_EVERY).await;
            }
        });
        let service = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(DISCOVER_EVERY).await;
                let Some(inner) = service.upgrade() else { return };
                let service = Service { inner };
                let parents: Vec<String> = service.inner.followed.lock().parents.iter().cloned().collect();
                for parent in parents {
                    service.discover_children(&parent).await;
                }
            }
        });
    }

    /// Follows a run launched (or adopted) here: its controls join the
    /// registry, its stored events after `last_seq` go to the feed.
    pub(super) fn follow(&self, run_id: &str, state: LiveState) {
        let Some(cluster) = &self.inner.cluster else { return };
        let read = state.last_seq;
        let (state, _) = watch::channel(state);
        let remote = Arc::new(RemoteRun {
            run_id: run_id.to_string(),
            leases: cluster.leases.clone(),
            state,
            read: std::sync::atomic::AtomicU64::new(read),
        });
        {
            let mut registry = self.registry();
            if let Some(run) = registry.runs.get_mut(run_id) {
                let controller: Arc<dyn RunControl> = remote.clone();
                run.on_worker = true;
                if run.cancel_requested {
                    let _ = controller.send(Control::Cancel {
                        reason: "cancelled by the client".into(),
                    });
                }
                run.controller = Some(controller);
            }
        }
        self.inner.followed.lock().roots.insert(run_id.to_string(), remote);
        self.inner.followed.added.notify_one();
    }

    /// Follows the sub-agents of `parent` that started since it was last asked.
    async fn discover_children(&self, parent: &str) {
        let Some(store) = &self.inner.store else { return };
        let children = match store.child_runs(parent).await {
            Ok(children) => children,
            Err(err) => {
                tracing::warn!(run_id = parent, error = %err, "cannot read the run's sub-agents");
                return;
            }
        };
        let Some(root) = self.inner.followed.root_of(parent) else {
            return;
        };
        let mut followed = self.inner.followed.lock();
        let mut added = false;
        for child in children {
            if !followed.children.contains_key(&child.run_id) && !followed.roots.contains_key(&child.run_id) {
                followed.children.insert(
                    child.run_id,
                    ChildCursor {
                        root: root.clone(),
                        read: 0,
                        ended: false,
                    },
                );
                added = true;
            }
        }
        drop(followed);
        if added {
            self.inner.followed.added.notify_one();
        }
    }

    /// One stored entry of a followed log.
    fn on_followed_entry(&self, entry: Tailed) {
        let event = match entry {
            Tailed::Event(event) => *event,
            Tailed::Unreadable { run_id, seq, error } => {
                tracing::error!(run_id, seq, error, "a stored event cannot be read; it is passed over");
                self.advance(&run_id, seq);
                return;
            }
        };
        let run_id = event.run_id.to_string();
        // Read twice (a read that raced a take-over): given once.
        if !self.advance(&run_id, event.seq) {
            return;
        }
        self.watch_for_children(&run_id, &event);
        let root = self.inner.followed.lock().roots.get(&run_id).cloned();
        match root {
            Some(remote) => self.on_root_event(remote, event),
            None => self.on_child_event(event),
        }
    }

    /// Moves a followed log's cursor to `seq`; whether it moved (the entry is new).
    fn advance(&self, run_id: &str, seq: u64) -> bool {
        let mut followed = self.inner.followed.lock();
        if let Some(remote) = followed.roots.get(run_id) {
            return remote.read.fetch_max(seq, Ordering::SeqCst) < seq;
        }
        match followed.children.get_mut(run_id) {
            Some(child) if child.read < seq => {
                child.read = seq;
                true
            }
            _ => false,
        }
    }

    /// A run's `task` calls may start sub-agents while they run: it is
    /// asked for them until its calls are complete (and once more then).
    fn watch_for_children(&self, run_id: &str, event: &Event) {
        match &event.kind {
            EventKind::ToolCallsStart { calls }
                if calls.iter().any(|call| call.name == loom_core::delegate::TASK_TOOL) =>
            {
                self.inner.followed.lock().parents.insert(run_id.to_string());
            }
            EventKind::ToolCallsComplete { .. } | EventKind::LifecycleEnd { .. }
                if self.inner.followed.lock().parents.remove(run_id) =>
            {
                let service = self.clone();
                let parent = run_id.to_string();
                tokio::spawn(async move { service.discover_children(&parent).await });
            }
            _ => {}
        }
    }

    /// An event of a followed top-level run.
    fn on_root_event(&self, remote: Arc<RemoteRun>, event: Event) {
        let run_id = remote.run_id.clone();
        remote.state.send_if_modified(|state| state.follow(&run_id, &event));
        if matches!(event.kind, EventKind::LifecycleStart { .. }) {
            if let Some(run) = self.registry().runs.get_mut(&run_id) {
                run.began(&event);
            }
        }
        let mut model_started = None;
        crate::metrics::observe(&event, &mut model_started);
        let ended = match &event.kind {
            // An interrupted run goes on with the next worker.
            EventKind::LifecycleEnd { status, .. } if *status != RunStatus::Interrupted => Some(*status),
            _ => None,
        };
        let seq = event.seq;
        self.inner.feed.publish(Arc::new(event));
        if let Some(status) = ended {
            {
                let mut followed = self.inner.followed.lock();
                followed.roots.remove(&run_id);
                followed.children.retain(|_, child| child.root != run_id);
            }
            let state = remote.state.borrow().clone();
            let outcome = RunOutcome {
                run_id: run_id.clone(),
                status,
                content: state.content,
                stop_reason: None,
                turns: state.metrics.iterations,
                metrics: state.metrics,
                messages: Vec::new(),
            };
            self.on_end(&run_id, outcome, seq);
        }
    }

    /// An event of a followed sub-agent: its asks show in its root's
    /// state (the root answers them), its events in a feed of its own
    /// joined under its parent's, as for a run of this process.
    fn on_child_event(&self, event: Event) {
        let child = event.run_id.to_string();
        let Some(root) = self.inner.followed.root_of(&child) else {
            return;
        };
        if let Some(remote) = self.inner.followed.lock().roots.get(&root).cloned() {
            remote.state.send_if_modified(|state| state.follow(&root, &event));
        }
        if matches!(event.kind, EventKind::LifecycleEnd { status, .. } if status != RunStatus::Interrupted) {
            if let Some(cursor) = self.inner.followed.lock().children.get_mut(&child) {
                cursor.ended = true;
            }
        }
        self.on_sub_agent_event(&root, Arc::new(event));
    }

    /// Follows the live runs of `principal`'s session `session` that this
    /// gateway does not hold ([`Service::adopt`]).
    pub(super) async fn adopt_session(&self, principal: &Principal, session: &str) -> Result<(), ApiError> {
        let Some(store) = self.inner.store.as_ref().filter(|_| self.on_workers()) else {
            return Ok(());
        };
        let runs = store.session_runs(session).await.map_err(store_error)?;
        for run in runs
            .iter()
            .filter(|run| !run.status.is_terminal() && run.parent.is_none())
        {
            self.adopt(principal, &run.run_id).await?;
        }
        Ok(())
    }

    /// A run this gateway does not hold but the store shows active — one
    /// another gateway accepted, or one accepted here before a restart —
    /// joins the registry and is followed, so its subscribers get it live
    /// and its controls reach its worker. Nothing when it is not `principal`'s.
    pub(super) async fn adopt(&self, principal: &Principal, run_id: &str) -> Result<(), ApiError> {
        if !self.on_workers() || self.registry().runs.contains_key(run_id) {
            return Ok(());
        }
        let Some(store) = &self.inner.store else { return Ok(()) };
        let snapshot = match store.load_run(run_id).await {
            Ok(snapshot) => snapshot,
            Err(StoreError::NotFound(_)) => return Ok(()),
            Err(err) => return Err(store_error(err)),
        };
        let record = snapshot.run;
        let active = matches!(
            record.status,
            RunStatus::Queued | RunStatus::Running | RunStatus::WaitingPermission | RunStatus::Interrupted
        );
        if !active || !principal.reaches_owner(record.principal.as_deref()) || record.parent.is_some() {
            return Ok(());
        }
        // Held under its owner's name, whoever asked (an admin may).
        let owner = Principal::new(record.principal.as_deref().unwrap_or_default());
        let events = store.events(run_id, 0).await.map_err(store_error)?;
        let mut state = LiveState::default();
        for event in &events {
            state.follow(run_id, event);
        }
        // It ended between the two reads: its whole log is in the store.
        if state.status.is_terminal() {
            return Ok(());
        }
        {
            let mut registry = self.registry();
            if registry.runs.contains_key(run_id) {
                return Ok(());
            }
            let (done, _) = watch::channel(None);
            let mut run = LiveRun {
                run_id: record.run_id.clone(),
                session_id: record.session_id.clone(),
                principal: owner,
                prompt: record.prompt.clone(),
                model: record.model.clone(),
                started_ms: (record.status != RunStatus::Queued).then_some(record.started_ms),
                accepted_ms: record.accepted_ms,
                queued: false,
                start: None,
                stored: true,
                controller: None,
                cancel_requested: false,
                asks_counted: 0,
                on_worker: true,
                done,
            };
            // Begun after the record was read: its log says when.
            for event in &events {
                run.began(event);
            }
            registry.add(run);
            self.inner.feed.open(run_id, state.last_seq);
        }
        // Its sub-agents running now are found from its open `task` calls.
        if events
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::ToolCallsStart { calls } => {
                    Some(calls.iter().any(|call| call.name == loom_core::delegate::TASK_TOOL))
                }
                EventKind::ToolCallsComplete { .. } => Some(false),
                _ => None,
            })
            .unwrap_or(false)
        {
            self.inner.followed.lock().parents.insert(run_id.to_string());
        }
        self.follow(run_id, state);
        Ok(())
    }
}
