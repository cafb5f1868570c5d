//! `loom worker`: a process that executes runs and serves no clients
//! (docs/cluster.md). It takes runs from the store shared with the
//! gateways — queued ones, and those whose worker stopped renewing its
//! lease — up to its `max_runs`, executes each under a lease
//! (`keeper.rs` renews it and fences the worker when it cannot), and on
//! a stop (SIGTERM) interrupts its runs and hands them back at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{Claim, Nudge, RunLeases, RunStatus, Store};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::agents::{AgentFactory, Agents};

mod execution;
mod jobs;
mod keeper;
mod routes;

use keeper::Keeper;
pub use keeper::{ConnectLeases, LeaseTiming};
pub use routes::{router, serve_routes};

/// How long setting a run up (its agent: the model, MCP servers) may take.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// Failed starts of a run (on any worker) after which it is given up.
const MAX_FAILED_STARTS: u32 = 5;

/// A run's lease is renewed while its task holds this: however the task
/// ends (a panic included), the renewals stop, the lease runs out, and
/// another worker takes the run.
struct Holding<'a> {
    keeper: &'a Keeper,
    run_id: &'a str,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.keeper.forget(self.run_id);
    }
}

/// How a run's time on this worker ended.
enum Ending {
    /// It ended (or never started): nothing to hand back.
    Ended,
    /// Interrupted (the worker stops): handed back at once.
    Interrupted,
    /// Interrupted while it waited for a person: parked, unless a control
    /// numbered after the one given (the last it had heard when the
    /// worker decided to park it) came meanwhile.
    ToPark(u64),
}

/// A worker's settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Runs executed at once (`--max-runs`).
    pub max_runs: usize,
    /// How long leases last and how often they are renewed.
    pub leases: LeaseTiming,
    /// How often the store is asked for a run when none was found.
    pub poll_every: Duration,
    /// How long a stop waits for the runs to checkpoint and hand back.
    pub stop_patience: Duration,
    /// A run waiting this long for a person is parked: interrupted and
    /// left in the store, holding no worker, until the answer (or any
    /// control) comes (`None`: never).
    pub park_after: Option<Duration>,
    /// Who this worker is, as leases and run records name it.
    pub owner: String,
    /// Runs of one principal executing at once across the cluster (the
    /// gateways' `max_runs_per_token`; 0: no cap).
    pub per_principal: usize,
    /// Runs that ended longer ago than this are removed from the store
    /// (`None`: kept for ever).
    pub keep_finished: Option<Duration>,
    /// The permission modes the cluster's gateways allow (`[server]
    /// allowed_modes`): a run in any other is not executed.
    pub allowed_modes: Vec<loom_core::Mode>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            max_runs: 8,
            leases: LeaseTiming::default(),
            poll_every: Duration::from_millis(100),
            stop_patience: Duration::from_secs(30),
            park_after: Some(Duration::from_secs(5)),
            owner: loom_core::owner::this_process(),
            keep_finished: Some(Duration::from_secs(30 * 24 * 60 * 60)),
            per_principal: 0,
            allowed_modes: crate::config::DEFAULT_MODES.to_vec(),
        }
    }
}

/// A worker: runs taken from `leases`, executed with agents from the factory.
pub struct Worker {
    config: WorkerConfig,
    agents: Agents,
    store: Arc<dyn Store>,
    leases: Arc<dyn RunLeases>,
    /// The line of this worker's workspace: rewinds of its runs' files.
    jobs: Option<Arc<dyn loom_core::WorkspaceJobs>>,
    /// Held (shared) while a run is claimed and set going; held alone
    /// while a rewind restores the workspace's files, so no run is taken
    /// meanwhile (`jobs.rs`).
    claiming: tokio::sync::RwLock<()>,
    keeper: Keeper,
    runs: TaskTracker,
    /// Woken when a run ends (a slot is free).
    ended: Notify,
    /// A run became claimable (a nudge from the store).
    work: Notify,
    stopping: AtomicBool,
    /// The controls of the runs executing (and their leases' guards), to
    /// interrupt them at a stop.
    live: std::sync::Mutex<std::collections::HashMap<String, (loom_core::RunController, Arc<loom_core::LeaseGuard>)>>,
}

impl Worker {
    /// A worker over `store` and its `leases` (the same store, one
    /// connection), whose keeper opens a connection of its own with
    /// `connect`, and which does the rewinds of its workspace's files
    /// that gateways put in the store's `jobs` line. Starts the keeper's
    /// thread.
    pub fn new(
        config: WorkerConfig,
        factory: Arc<dyn AgentFactory>,
        store: Arc<dyn Store>,
        leases: Arc<dyn RunLeases>,
        jobs: Option<Arc<dyn loom_core::WorkspaceJobs>>,
        connect: ConnectLeases,
    ) -> std::io::Result<Arc<Self>> {
        let keeper = Keeper::start(connect, config.leases)?;
        Ok(Arc::new(Self {
            agents: Agents::new(factory, Some(store.clone())),
            config,
            store,
            leases,
            jobs,
            claiming: tokio::sync::RwLock::new(()),
            keeper,
            runs: TaskTracker::new(),
            ended: Notify::new(),
            work: Notify::new(),
            stopping: AtomicBool::new(false),
            live: std::sync::Mutex::default(),
        }))
    }

    /// Whether the store answers and the worker is not stopping.
    pub async fn ready(&self) -> Result<(), String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("stopping".into());
        }
        self.store
            .list_runs(1)
            .await
            .map(|_| ())
            .map_err(|err| format!("store: {err}"))
    }

    /// How many runs execute here.
    pub fn executing(&self) -> usize {
        self.keeper.count()
    }

    /// Takes and executes runs until `stop` resolves; then interrupts the
    /// runs, waits for them to checkpoint (at most `stop_patience`) and
    /// hands each back, so another worker takes it at once.
    pub async fn run(self: &Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let sweeping = self.config.keep_finished.map(|keep| {
            let worker = self.clone();
            tokio::spawn(async move { worker.sweep(keep).await })
        });
        // Nudges only shorten the waits: the claims and renewals below find
        // the same without them.
        let nudged = {
            let worker = self.clone();
            let mut nudges = self.leases.nudges(&self.config.owner);
            tokio::spawn(async move {
                while let Some(nudge) = nudges.recv().await {
                    match nudge {
                        Nudge::Control => worker.keeper.renew_now(),
                        Nudge::Work => worker.work.notify_one(),
                    }
                }
            })
        };
        let serving = self.jobs.clone().map(|jobs| {
            let worker = self.clone();
            tokio::spawn(async move { worker.serve_jobs(jobs).await })
        });
        let mut backoff = self.config.poll_every;
        loop {
            let mut took = false;
            while self.keeper.count() < self.config.max_runs && !self.stopping.load(Ordering::SeqCst) {
                let _claiming = self.claiming.read().await;
                let sent = Instant::now();
                match self
                    .leases
                    .claim_next(&self.config.owner, self.config.leases.ttl, self.config.per_principal)
                    .await
                {
                    Ok(Some(claim)) => {
                        took = true;
                        backoff = self.config.poll_every;
                        self.execute(claim, sent);
                    }
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot take runs from the store");
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        break;
                    }
                }
            }
            let wait = if took { Duration::ZERO } else { backoff };
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(wait) => {}
                () = self.ended.notified(), if self.keeper.count() >= self.config.max_runs => {}
                () = self.work.notified(), if self.keeper.count() < self.config.max_runs => {}
            }
        }
        nudged.abort();
        if let Some(serving) = serving {
            serving.abort();
        }
        if let Some(sweeping) = sweeping {
            sweeping.abort();
        }
        self.stop().await;
    }

    /// Every minute, removes the runs that ended more than `keep` ago.
    async fn sweep(&self, keep: Duration) {
        /// Runs removed in one step (one script: short, so Redis is not held).
        const BATCH: usize = 200;
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64);
            let before = now.saturating_sub(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX));
            loop {
                match self.leases.forget_ended(before, BATCH).await {
                    Ok(removed) => {
                        if removed > 0 {
                            metrics::counter!("loom_worker_runs_forgotten_total").increment(removed as u64);
                            tracing::info!(removed, "finished runs past their keeping time were removed");
                        }
                        if removed < BATCH {
                            break;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "could not remove old finished runs");
                        break;
                    }
                }
            }
        }
    }

    /// Interrupts every run, waits for them, and hands them back.
    async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let live: Vec<(loom_core::RunController, Arc<loom_core::LeaseGuard>)> = self
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        tracing::info!(
            runs = live.len(),
            "the worker is stopping: its runs go back to the store"
        );
        for (controller, guard) in live {
            guard.acks_frozen.store(true, Ordering::SeqCst);
            controller.interrupt("the worker is stopping");
        }
        self.runs.close();
        if tokio::time::timeout(self.config.stop_patience, self.runs.wait())
            .await
            .is_err()
        {
            tracing::warn!("runs still executing after the stop's patience; their leases will run out");
        }
    }

    /// Executes a claimed run on a task of its own.
    fn execute(self: &Arc<Self>, claim: Claim, claimed: Instant) {
        let lease = claim.lease().clone();
        if matches!(claim, Claim::Resume { .. }) {
            metrics::counter!("loom_worker_takeovers_total").increment(1);
        }
        let guard = Arc::new(loom_core::LeaseGuard::default());
        self.keeper.hold(lease.clone(), guard.clone(), claimed);
        let worker = self.clone();
        // The run's trace (docs/telemetry.md): a log line leads to its
        // spans. A new run's is known from its request; a resumed run's
        // once its log is read (`carry`).
        let span = tracing::info_span!(
            parent: None,
            "run",
            run_id = %lease.run_id,
            epoch = lease.epoch,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty
        );
        if let Claim::Start { request, .. } = &claim {
            let given = serde_json::from_str::<crate::protocol::StartRun>(request)
                .ok()
                .and_then(|params| params.traceparent);
            loom_telemetry::record_ids(&span, &lease.run_id, given.as_ref());
        }
        self.runs.spawn(
            async move {
                let holding = Holding {
                    keeper: &worker.keeper,
                    run_id: &lease.run_id,
                };
                let ending = worker.carry(&claim, &guard).await;
                drop(holding);
                let refused = guard.refused.load(Ordering::SeqCst);
                if refused > 0 {
                    metrics::counter!("loom_worker_writes_fenced_total").increment(refused);
                }
                let sent_stale = guard.refused_by_store.load(Ordering::SeqCst);
                if sent_stale > 0 {
                    metrics::counter!("loom_worker_writes_sent_stale_total").increment(sent_stale);
                }
                if !guard.revoked.load(Ordering::SeqCst) {
                    worker.hand_back(&lease, ending).await;
                }
                worker.ended.notify_one();
            }
            .instrument(span),
        );
    }

    /// Starts the claimed run and follows it to its end here; how it ended.
    async fn carry(&self, claim: &Claim, guard: &Arc<loom_core::LeaseGuard>) -> Ending {
        let lease = claim.lease();
        let store = self.leases.fenced(lease, guard.clone());
        match self.start(claim, store.clone()).await {
            Ok((handle, trace_parent)) => {
                if matches!(claim, Claim::Resume { .. }) {
                    loom_telemetry::record_ids(&tracing::Span::current(), &lease.run_id, trace_parent.as_ref());
                }
                let (status, parked_heard) = self.follow(handle, guard).await;
                if guard.revoked.load(Ordering::SeqCst) {
                    // It goes on elsewhere: how it stopped here is no end.
                    tracing::info!("the run stopped here after it was given up");
                } else {
                    metrics::counter!("loom_runs_finished_total", "status" => status.as_str()).increment(1);
                    tracing::info!(status = status.as_str(), "run ended");
                }
                match (status, parked_heard) {
                    (RunStatus::Interrupted, Some(heard)) => Ending::ToPark(heard),
                    (RunStatus::Interrupted, None) => Ending::Interrupted,
                    _ => Ending::Ended,
                }
            }
            Err(execution::NotStarted::Never(why)) => {
                tracing::error!(error = %why, "the run can never start; it is cancelled");
                let reason = format!("the run cannot go on: {why}");
                if let Err(err) = loom_core::recovery::close_cancelled(store.as_ref(), &lease.run_id, &reason).await {
                    tracing::error!(error = %err, "could not record the cancelled run");
                }
                Ending::Ended
            }
            Err(execution::NotStarted::NotNow(why)) => {
                // Its lease runs out; a worker tries again then.
                tracing::error!(error = %why, "the run cannot start here now");
                guard.revoked.store(true, Ordering::SeqCst);
                Ending::Ended
            }
        }
    }

    /// Starts the claimed run, within `START_PATIENCE`; a run that failed
    /// to start `MAX_FAILED_STARTS` times (on any worker) never will.
    async fn start(&self, claim: &Claim, store: Arc<dyn Store>) -> Result<execution::Started, execution::NotStarted> {
        let starting = execution::start(
            &self.agents,
            claim,
            store,
            self.store.as_ref(),
            &self.config.allowed_modes,
        );
        let why = match tokio::time::timeout(START_PATIENCE, starting).await {
            Ok(Err(execution::NotStarted::NotNow(why))) => why,
            Ok(started) => return started,
            Err(_) => format!("setting it up took longer than {} s", START_PATIENCE.as_secs()),
        };
        match self.leases.note_failed_start(claim.lease()).await {
            Ok(Some(failures)) if failures >= MAX_FAILED_STARTS => {
                Err(execution::NotStarted::Never(format!("{why} ({failures} attempts)")))
            }
            _ => Err(execution::NotStarted::NotNow(why)),
        }
    }

    /// A run interrupted here, still ours: parked until a person answers,
    /// or handed back at once.
    async fn hand_back(&self, lease: &loom_core::Lease, ending: Ending) {
        let handed = match ending {
            Ending::ToPark(heard) if !self.stopping.load(Ordering::SeqCst) => {
                self.leases.park(lease, heard).await.map(|parked| {
                    if parked {
                        metrics::counter!("loom_worker_runs_parked_total").increment(1);
                        tracing::info!("the run is parked until a person answers");
                    }
                })
            }
            Ending::ToPark(_) | Ending::Interrupted => self.leases.release(lease).await,
            Ending::Ended => return,
        };
        if let Err(err) = handed {
            tracing::warn!(error = %err, "could not hand the run back; its lease will run out");
        }
    }

    /// Follows a started run to its end; returns how it ended, and — when
    /// it was interrupted to be parked (it waited for a person longer than
    /// `park_after`) — the number of the last control it had heard then.
    async fn follow(
        &self,
        mut handle: loom_core::RunHandle,
        guard: &Arc<loom_core::LeaseGuard>,
    ) -> (RunStatus, Option<u64>) {
        let run_id = handle.run_id().to_string();
        let controller = handle.controller();
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(run_id.clone(), (controller.clone(), guard.clone()));
        self.keeper.attach(&run_id, controller.clone());
        if self.stopping.load(Ordering::SeqCst) {
            guard.acks_frozen.store(true, Ordering::SeqCst);
            controller.interrupt("the worker is stopping");
        }
        tracing::info!("run started");
        let mut model_started = None;
        let mut state = controller.watch_state();
        let mut watching = true;
        // When the run began to wait for a person, and the last control
        // it had heard then.
        let mut waiting_since: Option<(Instant, u64)> = None;
        let mut parked_heard: Option<u64> = None;
        // Not parked before it heard what was sent to it (`Keeper::heard`).
        let mut not_before = Instant::now();
        // Its events are in the store before they come here; gateways
        // read them there.
        loop {
            let park_at = match (waiting_since, self.config.park_after) {
                (Some((since, _)), Some(after)) if parked_heard.is_none() => Some((since + after).max(not_before)),
                _ => None,
            };
            tokio::select! {
                event = handle.next_event() => match event {
                    Some(event) => crate::metrics::observe(&event, &mut model_started),
                    None => break,
                },
                changed = state.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                        continue;
                    }
                    // What it heard before whether it asks: an answer
                    // delivered between the two is in neither.
                    let heard = guard.delivered.load(Ordering::SeqCst);
                    let waiting = controller.is_asking();
                    waiting_since = if waiting { waiting_since.or(Some((Instant::now(), heard))) } else { None };
                }
                () = sleep_until(park_at), if park_at.is_some() => {
                    // In this order: an answer delivered after `heard`
                    // was read is a control the park finds unheard, and
                    // the run is claimable again at once.
                    let heard = guard.delivered.load(Ordering::SeqCst);
                    let still_waiting = controller.is_asking();
                    match waiting_since {
                        // A control came while it waited (the answer,
                        // perhaps), or it has not heard those sent before
                        // it started: it gets time to act on them.
                        Some((_, then)) if then != heard || !self.keeper.heard(&run_id) => {
                            waiting_since = Some((Instant::now(), heard));
                            not_before = Instant::now() + Duration::from_millis(50);
                        }
                        Some(_) if still_waiting => {
                            parked_heard = Some(heard);
                            guard.acks_frozen.store(true, Ordering::SeqCst);
                            controller.interrupt("waiting for a person: parked until answered");
                        }
                        _ => waiting_since = None,
                    }
                }
            }
        }
        let outcome = handle.outcome().await;
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&run_id);
        (outcome.status, parked_heard)
    }
}

/// Sleeps until `at` (never, for none).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
