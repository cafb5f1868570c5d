//! Runs executed by `loom worker` processes (a gateway on a cluster that
//! executes nothing itself, docs/cluster.md). Such a run is "launched" by
//! following it: one reader per gateway ([`EventTail`]) reads the stored
//! events of every run it follows and passes them to the feed as a run of
//! this process would; its controls go to whichever worker has it
//! ([`RunLeases::send_control`]); its end is its `lifecycle.end` in the
//! log — but an `INTERRUPTED` one only hands it to the next worker.
//! A run another gateway accepted is followed here too once a client of
//! this one asks for it ([`Service::adopt`]).

use std::collections::HashMap;

use loom_core::{ControlError, EventTail, LiveState, RunLeases};

use super::*;

/// What a gateway on a cluster reaches its runs with.
#[derive(Clone)]
pub struct Cluster {
    /// The leases: controls to the workers, cancels of runs none took yet.
    pub leases: Arc<dyn RunLeases>,
    /// The reader of the runs' stored events.
    pub tail: Arc<dyn EventTail>,
}

/// How long one read of the followed runs waits for an event: a run
/// followed meanwhile is read from the next read on.
const READ_WAIT: Duration = Duration::from_millis(100);

/// The runs a gateway follows, with the `seq` read so far and what each shows.
#[derive(Default)]
pub(super) struct Followed {
    runs: Mutex<HashMap<String, Arc<RemoteRun>>>,
    added: tokio::sync::Notify,
}

impl Followed {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<RemoteRun>>> {
        self.runs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

impl RunControl for RemoteRun {
    fn send(&self, control: Control) -> Result<(), ControlError> {
        // A gateway going away interrupts nothing its workers execute.
        if matches!(control, Control::Interrupt { .. }) {
            return Ok(());
        }
        if let Control::PermissionReply { request_id, .. } = &control {
            let waiting = self
                .state
                .borrow()
                .pending_asks
                .iter()
                .any(|ask| ask.request_id == *request_id);
            if !waiting {
                return Err(ControlError::UnknownRequest(request_id.clone()));
            }
        }
        let leases = self.leases.clone();
        let run_id = self.run_id.clone();
        let last_seq = self.state.borrow().last_seq;
        // Kept in the store until its worker's next renewal (within a
        // second); a cancel of a run no worker took yet ends it here.
        tokio::spawn(async move {
            if let Control::Cancel { reason } = &control {
                let turn = TurnIds {
                    turn_id: run_id.as_str().into(),
                    parent_turn_id: None,
                };
                let log = loom_core::recovery::cancelled_log(&run_id, last_seq, &turn, reason, &RunMetrics::default());
                match leases.withdraw(&run_id, &log).await {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(err) => tracing::warn!(run_id, error = %err, "could not withdraw a queued run"),
                }
            }
            if let Err(err) = leases.send_control(&run_id, &control).await {
                tracing::error!(run_id, error = %err, "a control could not be sent to the run's worker");
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

    /// Starts the gateway's one reader of its followed runs.
    pub(super) fn start_reading(&self) {
        let Some(cluster) = self.inner.cluster.clone() else {
            return;
        };
        let service = Arc::downgrade(&self.inner);
        let followed = self.inner.followed.clone();
        tokio::spawn(async move {
            loop {
                let Some(inner) = service.upgrade() else { return };
                let service = Service { inner };
                let runs: Vec<(String, u64)> = followed
                    .lock()
                    .iter()
                    .map(|(id, run)| (id.clone(), run.read.load(Ordering::SeqCst)))
                    .collect();
                if runs.is_empty() {
                    drop(service);
                    let added = followed.added.notified();
                    // Woken by a run followed, or now and then to see
                    // whether the gateway is gone.
                    let _ = tokio::time::timeout(Duration::from_secs(1), added).await;
                    continue;
                }
                match cluster.tail.read(&runs, READ_WAIT).await {
                    Ok(events) => {
                        for event in events {
                            service.on_followed_event(event);
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
        self.inner.followed.lock().insert(run_id.to_string(), remote);
        self.inner.followed.added.notify_one();
    }

    /// One stored event of a followed run.
    fn on_followed_event(&self, event: Event) {
        let run_id = event.run_id.to_string();
        let Some(remote) = self.inner.followed.lock().get(&run_id).cloned() else {
            return;
        };
        // Read twice (a read that raced a take-over): given once.
        if event.seq <= remote.read.load(Ordering::SeqCst) {
            return;
        }
        remote.read.store(event.seq, Ordering::SeqCst);
        remote.state.send_if_modified(|state| state.follow(&run_id, &event));
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
            self.inner.followed.lock().remove(&run_id);
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
        if !active || record.principal.as_deref() != Some(principal.name()) || record.parent.is_some() {
            return Ok(());
        }
        let events = store.events(run_id, 0).await.map_err(store_error)?;
        let mut state = LiveState::default();
        for event in &events {
            state.follow(run_id, event);
        }
        {
            let mut registry = self.registry();
            if registry.runs.contains_key(run_id) {
                return Ok(());
            }
            let (done, _) = watch::channel(None);
            registry.add(LiveRun {
                run_id: record.run_id.clone(),
                session_id: record.session_id.clone(),
                principal: principal.clone(),
                prompt: record.prompt.clone(),
                model: record.model.clone(),
                started_ms: record.started_ms,
                queued: false,
                start: None,
                stored: true,
                controller: None,
                cancel_requested: false,
                asks_counted: 0,
                on_worker: true,
                done,
            });
            self.inner.feed.open(run_id, state.last_seq);
        }
        self.follow(run_id, state);
        Ok(())
    }
}
