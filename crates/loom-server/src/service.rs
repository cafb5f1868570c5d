//! The gateway's operations — start, cancel, steer, answer, look, follow —
//! one implementation that the WebSocket methods and the HTTP routes both
//! call, so the two protocols cannot drift apart.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use loom_core::event::TurnIds;
use loom_core::{
    Agent, Event, EventKind, KeyedRequest, Message, PermissionDecision, QueuedRun, RunHandle, RunMetrics, RunOutcome,
    RunQuery, RunRecord, RunRequest, RunStatus, Store, StoreError,
};
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::agents::{AgentFactory, Agents};
use crate::auth::Principal;
use crate::config::ServerConfig;
use crate::control::RunControl;
use crate::error::{ApiError, Code};
use crate::feed::{EventFeed, LocalFeed};
use crate::observed_store::ObservedStore;
use crate::protocol::{Cancelled, ListParams, OnBusy, PendingAsk, RunAccepted, RunPage, RunView, StartRun};
use crate::queue::{Caps, LocalQueue, QueueFull, RunQueue, Ticket};
use crate::registry::{Launch, LiveRun, Registry, Start};

/// What `admit` did with a start request.
enum Admitted {
    /// Started, queued, or joined (steer) a run — or found the live run of
    /// the same idempotency key.
    Run(RunAccepted),
    /// The run of the same idempotency key ended while this request was
    /// being checked: answer with where it is now.
    EndedMeanwhile,
}

/// Why a stored queued run was not taken back at start-up.
enum NotTaken {
    /// It can never start here: it is cancelled, with the reason.
    Never(String),
    /// Not now (its model cannot be set up): it stays queued.
    NotNow(String),
}

/// What becomes of a run once its record is written.
enum AfterStored {
    /// It starts, if the queue let it.
    Launch(Option<Box<Launch>>),
    /// A cancel came while it was written: it is cancelled now.
    Cancel(Box<LiveRun>),
}

/// How long a cancel waits for a run to stop before it answers `INTERNAL`
/// (the engine stops a run within its tools' cancel grace; this only
/// guards against a run that never does).
const CANCEL_WAIT: Duration = Duration::from_secs(60);

/// The gateway's state and operations. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    config: ServerConfig,
    agents: Agents,
    store: Option<Arc<dyn Store>>,
    feed: Arc<dyn EventFeed>,
    /// Which runs execute and which wait. Locked after `registry`, never before.
    queue: Arc<dyn RunQueue>,
    registry: Mutex<Registry>,
    limiter: Mutex<HashMap<Principal, Bucket>>,
    shutting_down: AtomicBool,
    pumps: TaskTracker,
}

/// A token bucket: `requests_per_minute`, with bursts of a quarter of it.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One subscriber's events: the stored ones (read page by page), the
/// buffered ones, then live.
pub struct Subscription {
    stored: Option<StoredPages>,
    page: VecDeque<Arc<Event>>,
    buffered: VecDeque<Arc<Event>>,
    live: Option<mpsc::Receiver<Arc<Event>>>,
    lagged: Arc<AtomicBool>,
}

/// The part of a run's log still to be read from the store.
struct StoredPages {
    store: Arc<dyn Store>,
    run_id: String,
    after: u64,
    /// The last seq to read there (`None`: to the end of the log).
    until: Option<u64>,
}

/// Events read from the store at once: a long log never sits in memory whole.
const PAGE: usize = 256;

/// What a subscription gives next.
#[derive(Debug)]
pub enum Next {
    /// An event.
    Event(Arc<Event>),
    /// The run has ended and every event was given.
    End,
    /// The subscriber fell too far behind and was dropped: resubscribe
    /// after the last `seq` received.
    Lagged,
}

impl Subscription {
    /// The next event, or why there is none.
    pub async fn next(&mut self) -> Next {
        loop {
            if let Some(event) = self.page.pop_front() {
                return Next::Event(event);
            }
            let Some(stored) = &mut self.stored else { break };
            match stored.store.events_page(&stored.run_id, stored.after, PAGE).await {
                Ok(events) => {
                    let full = events.len() == PAGE;
                    let until = stored.until.unwrap_or(u64::MAX);
                    let mut reached = !full;
                    for event in events {
                        if event.seq > until {
                            reached = true;
                            break;
                        }
                        stored.after = event.seq;
                        self.page.push_back(Arc::new(event));
                    }
                    if reached || stored.after >= until {
                        self.stored = None;
                    }
                }
                Err(err) => {
                    tracing::error!(run_id = %stored.run_id, error = %err, "reading the run's events failed");
                    return Next::End;
                }
            }
        }
        if let Some(event) = self.buffered.pop_front() {
            return Next::Event(event);
        }
        let Some(live) = &mut self.live else { return Next::End };
        match live.recv().await {
            Some(event) => Next::Event(event),
            None if self.lagged.load(Ordering::SeqCst) => Next::Lagged,
            None => Next::End,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn store_error(err: StoreError) -> ApiError {
    ApiError::internal("the store failed", err)
}

/// A stable digest of a start request without its key (FNV-1a over its JSON).
fn digest(params: &StartRun) -> u64 {
    let mut params = params.clone();
    params.idempotency_key = None;
    let text = serde_json::to_string(&params).unwrap_or_default();
    loom_core::text::fnv1a(text.bytes())
}

impl Service {
    /// A service running agents from `factory`, recording runs in `store`
    /// (none: runs live in memory, and the newest finished ones are kept).
    pub fn new(config: ServerConfig, factory: Arc<dyn AgentFactory>, store: Option<Arc<dyn Store>>) -> Self {
        let feed: Arc<dyn EventFeed> = Arc::new(LocalFeed::new(
            config.subscriber_buffer,
            store.is_none().then_some(config.keep_finished_runs),
        ));
        let queue: Arc<dyn RunQueue> = Arc::new(LocalQueue::new(Caps {
            max_runs: config.max_runs,
            per_token: config.max_runs_per_token,
            max_queued: config.max_queued,
        }));
        Self::with_seams(config, factory, store, queue, feed)
    }

    /// A service whose admission queue and event fan-out are given: the
    /// seams a gateway shared by many processes fills with its own.
    pub fn with_seams(
        config: ServerConfig,
        factory: Arc<dyn AgentFactory>,
        store: Option<Arc<dyn Store>>,
        queue: Arc<dyn RunQueue>,
        feed: Arc<dyn EventFeed>,
    ) -> Self {
        let store: Option<Arc<dyn Store>> =
            store.map(|store| Arc::new(ObservedStore::new(store, feed.clone())) as Arc<dyn Store>);
        Self {
            inner: Arc::new(Inner {
                agents: Agents::new(factory, store.clone()),
                config,
                store,
                feed,
                queue,
                registry: Mutex::default(),
                limiter: Mutex::default(),
                shutting_down: AtomicBool::new(false),
                pumps: TaskTracker::new(),
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets the gauges of runs and asks; call with the registry locked, so
    /// that two updates cannot publish out of order.
    fn publish_gauges(&self, registry: &Registry) {
        let counts = self.inner.queue.counts();
        metrics::gauge!("loom_runs_active").set(counts.executing as f64);
        metrics::gauge!("loom_runs_queued").set(counts.waiting as f64);
        metrics::gauge!("loom_permission_pending").set(registry.pending_total() as f64);
    }

    /// Whether the store answers and the gateway is not shutting down.
    pub async fn ready(&self) -> Result<(), String> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err("shutting down".into());
        }
        if let Some(store) = &self.inner.store {
            store.list_runs(1).await.map_err(|err| format!("store: {err}"))?;
        }
        Ok(())
    }

    /// Counts one request of `principal` against its rate.
    pub fn admit_request(&self, principal: &Principal) -> Result<(), ApiError> {
        let per_minute = f64::from(self.inner.config.requests_per_minute);
        let capacity = (per_minute / 4.0).max(1.0);
        let per_second = per_minute / 60.0;
        let mut buckets = self
            .inner
            .limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let bucket = buckets.entry(principal.clone()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * per_second).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = Duration::from_secs_f64((1.0 - bucket.tokens) / per_second);
            Err(ApiError::new(Code::RateLimited, "too many requests for this token").retry_after(wait))
        }
    }

    // ----- starting runs -------------------------------------------------

    /// `agent.run`.
    pub async fn start(&self, principal: &Principal, params: StartRun) -> Result<RunAccepted, ApiError> {
        let key = params.idempotency_key.clone();
        let digest = digest(&params);
        match self.admit(principal, params).await? {
            Admitted::Run(accepted) => {
                // A new run's key was stored with it; a steer's is stored here.
                if let (Some(key), true) = (&key, accepted.steered) {
                    self.persist_key(principal, key, digest, &accepted.run_id).await;
                }
                Ok(accepted)
            }
            // A request with the same key started a run that ended while
            // this one was being checked: answer with that run.
            Admitted::EndedMeanwhile => match key {
                Some(key) => self
                    .idempotent(principal, &key, digest)
                    .await?
                    .ok_or_else(|| ApiError::internal("an idempotency key lost its run", key)),
                None => Err(ApiError::internal("an idempotency key lost its run", "no key")),
            },
        }
    }

    async fn admit(&self, principal: &Principal, params: StartRun) -> Result<Admitted, ApiError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(
                ApiError::new(Code::Overloaded, "the server is shutting down").retry_after(Duration::from_secs(5))
            );
        }
        self.validate(&params)?;
        let digest = digest(&params);
        if let Some(key) = &params.idempotency_key {
            if let Some(accepted) = self.idempotent(principal, key, digest).await? {
                return Ok(Admitted::Run(accepted));
            }
        }
        if let Some(session) = &params.session_id {
            self.check_session_owner(principal, session).await?;
        }
        let model = params.model.clone().filter(|m| *m != self.inner.agents.default_model());
        let agent = self
            .inner
            .agents
            .get(model.as_deref(), params.tools.as_deref())
            .await
            .map_err(|err| ApiError::new(Code::InvalidParams, err))?;
        let run_id = uuid::Uuid::new_v4().to_string();
        let session_id = params.session_id.clone().unwrap_or_else(|| run_id.clone());
        let on_busy = params.on_busy.unwrap_or_default();

        let queued;
        let (accepted, mut launches, to_cancel) = {
            let mut registry = self.registry();
            // A retry with the same key may have raced this one.
            if let Some(key) = &params.idempotency_key {
                if let Some((known, existing)) = registry.remembered(principal, key).cloned() {
                    if known != digest {
                        return Err(conflicting_key());
                    }
                    let position = self.inner.queue.position(&existing);
                    return match registry.run(principal, &existing) {
                        Some(run) if !run.stored => Err(being_accepted()),
                        Some(run) => Ok(Admitted::Run(accepted_of(run, position))),
                        // It ended meanwhile: where it is now.
                        None => Ok(Admitted::EndedMeanwhile),
                    };
                }
            }
            // Checked again under the lock: two tokens naming one new
            // session at once must not share it.
            if registry
                .on_session(&session_id)
                .iter()
                .any(|run| &run.principal != principal)
            {
                return Err(session_taken(&session_id));
            }
            let live: Vec<(String, RunStatus)> = registry
                .on_session(&session_id)
                .iter()
                .map(|run| (run.run_id.clone(), run.status))
                .collect();
            let mut to_cancel = Vec::new();
            if let Some((busy_id, busy_status)) = live.first() {
                match on_busy {
                    OnBusy::Reject => {
                        return Err(ApiError::new(
                            Code::Conflict,
                            format!("session '{session_id}' has a live run ({busy_id})"),
                        ))
                    }
                    OnBusy::Steer => {
                        let run = registry.runs.get(busy_id);
                        let steered = match run.and_then(|run| run.controller.as_ref()) {
                            Some(controller) if *busy_status != RunStatus::Queued => {
                                controller.steer(params.prompt.clone()).is_ok()
                            }
                            _ => false,
                        };
                        if !steered {
                            return Err(ApiError::new(
                                Code::Conflict,
                                format!("the live run {busy_id} of session '{session_id}' cannot take a message now"),
                            ));
                        }
                        let run = registry.runs.get(busy_id).ok_or_else(|| ApiError::no_run(busy_id))?;
                        let mut accepted = accepted_of(run, None);
                        accepted.steered = true;
                        // A retry of this request must not steer twice.
                        if let Some(key) = &params.idempotency_key {
                            registry.remember(principal, key.clone(), digest, busy_id.clone());
                        }
                        return Ok(Admitted::Run(accepted));
                    }
                    OnBusy::Interrupt => to_cancel = live.iter().map(|(id, _)| id.clone()).collect(),
                    OnBusy::Enqueue => {}
                }
            }
            let history = self.inner.store.is_none().then(|| {
                registry
                    .histories
                    .get(&history_key(principal, &session_id))
                    .cloned()
                    .unwrap_or_default()
            });
            let run = self.queued_run(principal, &params, agent, &run_id, &session_id, now_ms(), history);
            // Stored before the answer, with its key, in one write (below).
            queued = match &self.inner.store {
                Some(_) => Some(QueuedRun {
                    record: run.record(RunStatus::Queued),
                    request: serde_json::to_string(&params)
                        .map_err(|err| ApiError::internal("the request could not be written", err))?,
                }),
                None => None,
            };
            registry.add(run);
            self.inner.feed.open(&run_id, 0);
            let ticket = Ticket {
                run_id: run_id.clone(),
                principal: principal.clone(),
                session_id,
            };
            let launches = match self.inner.queue.push(ticket) {
                Ok(started) => registry.starting(started),
                Err(QueueFull) => {
                    registry.remove(&run_id);
                    self.inner.feed.forget(&run_id);
                    return Err(
                        ApiError::new(Code::Overloaded, "too many runs are waiting; try again later")
                            .retry_after(Duration::from_secs(1)),
                    );
                }
            };
            if let Some(key) = &params.idempotency_key {
                registry.remember(principal, key.clone(), digest, run_id.clone());
            }
            self.publish_gauges(&registry);
            let position = self.inner.queue.position(&run_id);
            let run = registry.runs.get(&run_id).ok_or_else(|| ApiError::no_run(&run_id))?;
            (accepted_of(run, position), launches, to_cancel)
        };
        if let (Some(queued), Some(store)) = (queued, &self.inner.store) {
            let keyed = params.idempotency_key.as_deref().map(|key| {
                (
                    key,
                    KeyedRequest {
                        digest,
                        run_id: run_id.clone(),
                    },
                )
            });
            let written = store
                .queue_run(&queued, keyed.as_ref().map(|(key, request)| (*key, request)))
                .await;
            match written {
                Ok(()) => match self.after_stored(&run_id) {
                    AfterStored::Launch(launch) => launches.extend(launch.map(|launch| *launch)),
                    AfterStored::Cancel(run) => {
                        // Cancelled while its record was written: now it can be.
                        for launch in launches {
                            self.launch(launch);
                        }
                        if let Err(err) = self.cancel_queued(*run, "cancelled by the client").await {
                            tracing::error!(run_id, error = %err, "could not record a cancelled run");
                        }
                        return Ok(Admitted::Run(accepted));
                    }
                },
                Err(err) => {
                    // Not accepted after all: the client gets no run id.
                    launches.extend(self.unaccept(principal, &run_id, params.idempotency_key.as_deref()));
                    for launch in launches {
                        self.launch(launch);
                    }
                    return Err(store_error(err));
                }
            }
        }
        for launch in launches {
            self.launch(launch);
        }
        if !to_cancel.is_empty() {
            // The new run starts once the session's live runs have stopped.
            let service = self.clone();
            let principal = principal.clone();
            tokio::spawn(async move {
                for id in to_cancel {
                    let _ = service
                        .cancel_with(&principal, &id, "interrupted by a new run of the session")
                        .await;
                }
            });
        }
        Ok(Admitted::Run(accepted))
    }

    /// A new run of `params` as the registry holds it until it starts.
    #[allow(clippy::too_many_arguments)] // the parts of one run, each from its own place
    fn queued_run(
        &self,
        principal: &Principal,
        params: &StartRun,
        agent: Agent,
        run_id: &str,
        session_id: &str,
        started_ms: u64,
        history: Option<Vec<Message>>,
    ) -> LiveRun {
        let request = RunRequest {
            prompt: params.prompt.clone(),
            run_id: Some(run_id.to_string()),
            session_id: Some(session_id.to_string()),
            history,
            max_steps: params.max_steps,
            principal: Some(principal.name().to_string()),
        };
        let (done, _) = watch::channel(None);
        LiveRun {
            run_id: run_id.to_string(),
            session_id: session_id.to_string(),
            principal: principal.clone(),
            prompt: params.prompt.clone(),
            model: params
                .model
                .clone()
                .unwrap_or_else(|| self.inner.agents.default_model()),
            status: RunStatus::Queued,
            started_ms,
            metrics: RunMetrics::default(),
            content: None,
            last_seq: 0,
            start: Some((agent, Start::New(request))),
            stored: self.inner.store.is_none(),
            controller: None,
            cancel_requested: false,
            pending: Vec::new(),
            early: HashMap::new(),
            seeded: false,
            done,
        }
    }

    /// A run's record is written: it starts (if the queue let it), or — if a
    /// cancel came meanwhile — leaves to be cancelled; during a shutdown it
    /// stays queued in the store for the next start.
    fn after_stored(&self, run_id: &str) -> AfterStored {
        let mut registry = self.registry();
        let cancelled = registry.runs.get(run_id).is_some_and(|run| run.cancel_requested);
        if !cancelled && !self.shutting_down() {
            return AfterStored::Launch(registry.stored(run_id).map(Box::new));
        }
        let started = if self.inner.queue.withdraw(run_id) {
            Vec::new()
        } else {
            self.inner.queue.finished(run_id, !self.shutting_down())
        };
        let launches = registry.starting(started);
        let run = registry.remove(run_id);
        self.publish_gauges(&registry);
        drop(registry);
        for launch in launches {
            self.launch(launch);
        }
        match run {
            Some(mut run) if cancelled => {
                run.stored = true;
                AfterStored::Cancel(Box::new(run))
            }
            _ => {
                self.inner.feed.close(run_id);
                AfterStored::Launch(None)
            }
        }
    }

    /// Takes back a run whose record could not be stored: it leaves the
    /// registry, the queue and the feed. Returns the runs its place lets start.
    fn unaccept(&self, principal: &Principal, run_id: &str, key: Option<&str>) -> Vec<Launch> {
        let launches = {
            let mut registry = self.registry();
            registry.remove(run_id);
            if let Some(key) = key {
                registry.forget_key(principal, key);
            }
            let started = if self.inner.queue.withdraw(run_id) {
                Vec::new()
            } else {
                self.inner.queue.finished(run_id, !self.shutting_down())
            };
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            launches
        };
        self.inner.feed.forget(run_id);
        launches
    }

    fn validate(&self, params: &StartRun) -> Result<(), ApiError> {
        if params.prompt.trim().is_empty() {
            return Err(ApiError::new(Code::InvalidParams, "prompt must not be empty"));
        }
        if let Some(steps) = params.max_steps {
            let limit = self.inner.config.max_steps_limit;
            if steps == 0 || steps > limit {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    format!("maxSteps must be between 1 and {limit}"),
                ));
            }
        }
        if let Some(model) = &params.model {
            if *model != self.inner.agents.default_model() && !self.inner.config.models.contains(model) {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    format!("model '{model}' is not offered by this server"),
                ));
            }
        }
        if let Some(session) = &params.session_id {
            let fine = !session.is_empty()
                && session.len() <= 128
                && session.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
            if !fine {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    "sessionId: 1 to 128 characters of A-Z a-z 0-9 - _ . :",
                ));
            }
        }
        if params
            .idempotency_key
            .as_ref()
            .is_some_and(|key| key.is_empty() || key.len() > 256)
        {
            return Err(ApiError::new(
                Code::InvalidParams,
                "idempotencyKey: 1 to 256 characters",
            ));
        }
        Ok(())
    }

    /// Makes an idempotency key outlive this process: a retry after a
    /// restart gets the same run. Before the answer, so a client that got
    /// one can count on it; a store that fails here costs only that.
    async fn persist_key(&self, principal: &Principal, key: &str, digest: u64, run_id: &str) {
        let Some(store) = &self.inner.store else { return };
        let request = KeyedRequest {
            digest,
            run_id: run_id.to_string(),
        };
        if let Err(err) = store.remember_request(principal.name(), key, &request).await {
            tracing::warn!(run_id, error = %err, "an idempotency key could not be stored; it holds until a restart");
        }
    }

    /// The run an earlier request with this key started, if any: one this
    /// process remembers, or one the store does (from before a restart).
    async fn idempotent(&self, principal: &Principal, key: &str, digest: u64) -> Result<Option<RunAccepted>, ApiError> {
        let remembered = self.registry().remembered(principal, key).cloned();
        let (known, run_id) = match remembered {
            Some(found) => found,
            None => {
                let Some(store) = &self.inner.store else {
                    return Ok(None);
                };
                let Some(found) = store
                    .remembered_request(principal.name(), key)
                    .await
                    .map_err(store_error)?
                else {
                    return Ok(None);
                };
                self.registry()
                    .remember(principal, key.to_string(), found.digest, found.run_id.clone());
                (found.digest, found.run_id)
            }
        };
        if known != digest {
            return Err(conflicting_key());
        }
        {
            let registry = self.registry();
            if let Some(run) = registry.run(principal, &run_id) {
                if !run.stored {
                    return Err(being_accepted());
                }
                return Ok(Some(accepted_of(run, self.inner.queue.position(&run_id))));
            }
        }
        // It has ended: where it is now.
        let view = self.get(principal, &run_id).await?;
        Ok(Some(RunAccepted {
            run_id: view.run_id,
            session_id: view.session_id,
            status: view.status,
            queue_position: None,
            steered: false,
        }))
    }

    /// A session id belongs to the token that first used it.
    async fn check_session_owner(&self, principal: &Principal, session: &str) -> Result<(), ApiError> {
        let taken = {
            let registry = self.registry();
            registry
                .on_session(session)
                .iter()
                .any(|run| &run.principal != principal)
                || registry
                    .finished
                    .values()
                    .any(|(owner, view)| view.session_id == session && owner != principal)
        };
        let taken = taken
            || match &self.inner.store {
                Some(store) => store
                    .session_runs(session)
                    .await
                    .map_err(store_error)?
                    .iter()
                    .any(|run| run.principal.as_deref() != Some(principal.name())),
                None => false,
            };
        if taken {
            return Err(session_taken(session));
        }
        Ok(())
    }

    /// Starts a run the registry let go.
    fn launch(&self, launch: Launch) {
        let Launch { run_id, agent, start } = launch;
        let span = tracing::info_span!("run", run_id = %run_id);
        match start {
            Start::New(request) => {
                let handle = {
                    let _entered = span.enter();
                    agent.run(request)
                };
                self.attach(run_id, handle, span);
            }
            Start::Resume => {
                let service = self.clone();
                // Tracked with the pumps: a shutdown waits for it too.
                self.inner.pumps.spawn(async move {
                    match agent.resume(&run_id).instrument(span.clone()).await {
                        Ok(handle) => {
                            tracing::info!(parent: &span, "resuming the run");
                            service.attach(run_id, handle, span);
                        }
                        Err(err) => {
                            tracing::error!(parent: &span, error = %err, "could not resume the run");
                            service.not_resumed(&run_id);
                        }
                    }
                });
            }
        }
    }

    /// A run taken back after a restart could not resume: its place frees.
    fn not_resumed(&self, run_id: &str) {
        let launches = {
            let mut registry = self.registry();
            registry.remove(run_id);
            let started = self.inner.queue.finished(run_id, !self.shutting_down());
            self.publish_gauges(&registry);
            registry.starting(started)
        };
        self.inner.feed.close(run_id);
        for launch in launches {
            self.launch(launch);
        }
    }

    /// Follows a started run: its controls join the registry, and its
    /// events go to the feed until it ends.
    fn attach(&self, run_id: String, handle: RunHandle, span: tracing::Span) {
        let controller: Arc<dyn RunControl> = Arc::new(handle.controller());
        {
            let mut registry = self.registry();
            if let Some(run) = registry.runs.get_mut(&run_id) {
                if run.cancel_requested {
                    controller.cancel("cancelled by the client");
                } else if self.shutting_down() {
                    // Started while the gateway closes (a resume that was
                    // still loading): it checkpoints and waits for the next start.
                    controller.interrupt("the server is shutting down");
                }
                run.controller = Some(controller);
            }
        }
        tracing::info!(parent: &span, "run started");
        let service = self.clone();
        self.inner.pumps.spawn(
            async move {
                service.pump(run_id, handle).await;
            }
            .instrument(span),
        );
    }

    async fn pump(&self, run_id: String, mut handle: RunHandle) {
        let mut model_started = None;
        while let Some(event) = handle.next_event().await {
            crate::metrics::observe(&event, &mut model_started);
            let event = Arc::new(event);
            if *event.run_id == *run_id {
                self.on_event(&event);
                self.inner.feed.publish(event);
            } else {
                self.on_sub_agent_event(&run_id, event);
            }
        }
        let outcome = handle.outcome().await;
        self.on_end(&run_id, outcome);
    }

    /// An event of a sub-agent, from its root run's stream: it gets a feed
    /// of its own (joined under its parent's, so the root's subscribers see
    /// it live), and its asks are the root's to answer.
    fn on_sub_agent_event(&self, root: &str, event: Arc<Event>) {
        let child = event.run_id.to_string();
        if matches!(event.kind, EventKind::LifecycleStart { .. }) {
            let parent = event.parent_run_id.as_deref().unwrap_or(root);
            self.inner.feed.open_under(&child, parent, event.seq.saturating_sub(1));
            self.registry().sub_agents.insert(child.clone(), root.to_string());
        }
        if let EventKind::PermissionRequest { .. } | EventKind::PermissionResolved { .. } = &event.kind {
            let mut registry = self.registry();
            if let Some(run) = registry.runs.get_mut(root) {
                let before = run.pending.len();
                match pending_ask(&event) {
                    Some(ask) => {
                        run.pending.retain(|known| known.request_id != ask.request_id);
                        run.pending.push(ask);
                        run.status = RunStatus::WaitingPermission;
                    }
                    None => {
                        if let EventKind::PermissionResolved { request_id, .. } = &event.kind {
                            run.pending.retain(|known| known.request_id != *request_id);
                            if run.pending.is_empty() {
                                run.status = RunStatus::Running;
                            }
                        }
                    }
                }
                registry.pending_changed(root, before);
                self.publish_gauges(&registry);
            }
        }
        let ended = matches!(event.kind, EventKind::LifecycleEnd { .. });
        self.inner.feed.publish(event);
        if ended {
            self.inner.feed.close(&child);
            self.registry().sub_agents.remove(&child);
        }
    }

    /// What an event changes in the registry.
    fn on_event(&self, event: &Event) {
        let mut registry = self.registry();
        let Some(run) = registry.runs.get_mut(&*event.run_id) else {
            return;
        };
        run.last_seq = event.seq;
        let asks_before = run.pending.len();
        let mut asks_changed = false;
        match &event.kind {
            EventKind::IterationStart { iteration } => run.metrics.iterations = iteration + 1,
            EventKind::LlmFinish { usage: Some(usage), .. } => {
                run.metrics.input_tokens += usage.input_tokens;
                run.metrics.output_tokens += usage.output_tokens;
                run.metrics.llm_calls += 1;
            }
            EventKind::PermissionRequest { request_id, .. } => {
                run.pending.retain(|ask| ask.request_id != *request_id);
                run.pending.extend(pending_ask(event));
                run.status = RunStatus::WaitingPermission;
                if let (Some(decision), Some(controller)) = (run.early.remove(request_id), &run.controller) {
                    // Answered before the restarted run asked again.
                    if let Err(err) = controller.respond_permission(request_id, decision) {
                        tracing::warn!(request_id, error = %err, "an early answer could not be applied");
                    }
                }
                asks_changed = true;
            }
            EventKind::PermissionResolved { request_id, .. } => {
                run.pending.retain(|ask| ask.request_id != *request_id);
                if run.pending.is_empty() {
                    run.status = RunStatus::Running;
                }
                asks_changed = true;
            }
            EventKind::ToolCallsComplete { .. } if run.seeded => {
                // The batch that asked before the restart is settled.
                run.seeded = false;
                run.pending.clear();
                run.early.clear();
                run.status = RunStatus::Running;
                asks_changed = true;
            }
            EventKind::AgentFinish { content, metrics, .. } => {
                run.content = Some(content.clone());
                run.metrics = metrics.clone();
            }
            EventKind::LifecycleEnd {
                status,
                content,
                metrics,
            } => {
                run.status = *status;
                run.content.clone_from(content);
                run.metrics = metrics.clone();
            }
            _ => {}
        }
        if asks_changed {
            registry.pending_changed(&event.run_id, asks_before);
            self.publish_gauges(&registry);
        }
    }

    /// A run stopped: it leaves the registry, the queue moves on.
    fn on_end(&self, run_id: &str, outcome: RunOutcome) {
        let (run, launches) = {
            let mut registry = self.registry();
            let Some(mut run) = registry.remove(run_id) else { return };
            run.status = outcome.status;
            run.metrics = outcome.metrics.clone();
            run.content.clone_from(&outcome.content);
            if self.inner.store.is_none() && outcome.status != RunStatus::Interrupted {
                let mut view = run.view(None);
                view.pending_asks.clear();
                view.ended_ms = Some(now_ms());
                registry.keep_finished(run.principal.clone(), view, self.inner.config.keep_finished_runs);
                let history = loom_core::history::without_system_prompt(outcome.messages);
                if !history.is_empty() {
                    let key = history_key(&run.principal, &run.session_id);
                    registry.remember_history(key, history, self.inner.config.keep_finished_runs);
                }
            }
            let start_more = !self.inner.shutting_down.load(Ordering::SeqCst);
            let started = self.inner.queue.finished(run_id, start_more);
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            (run, launches)
        };
        metrics::counter!("loom_runs_finished_total", "status" => outcome.status.as_str()).increment(1);
        tracing::info!(
            run_id,
            status = outcome.status.as_str(),
            seq = run.last_seq,
            "run ended"
        );
        // Sub-agents an interrupt left open end with their root's stream.
        let orphans: Vec<String> = {
            let mut registry = self.registry();
            let ids: Vec<String> = registry
                .sub_agents
                .iter()
                .filter(|(_, root)| root.as_str() == run_id)
                .map(|(child, _)| child.clone())
                .collect();
            for id in &ids {
                registry.sub_agents.remove(id);
            }
            ids
        };
        for child in orphans {
            self.inner.feed.close(&child);
        }
        self.inner.feed.close(run_id);
        run.done.send_replace(Some((run.last_seq, outcome.status)));
        for launch in launches {
            self.launch(launch);
        }
    }

    // ----- controls ------------------------------------------------------

    /// `agent.cancel`: answers once the run has stopped.
    pub async fn cancel(&self, principal: &Principal, run_id: &str) -> Result<Cancelled, ApiError> {
        self.cancel_with(principal, run_id, "cancelled by the client").await
    }

    async fn cancel_with(&self, principal: &Principal, run_id: &str, reason: &str) -> Result<Cancelled, ApiError> {
        self.refuse_sub_agent(principal, run_id, "cancel")?;
        enum Found {
            Queued(Option<Box<LiveRun>>),
            Running(watch::Receiver<Option<(u64, RunStatus)>>),
            Ended,
        }
        let found = {
            let mut registry = self.registry();
            let found = match registry.run_mut(principal, run_id) {
                Some(run) if run.status == RunStatus::Queued && run.stored => None,
                // Its record is being written: the admission cancels it
                // once it is (docs/server.md), and this waits for that.
                Some(run) if run.status == RunStatus::Queued => {
                    run.cancel_requested = true;
                    Some(Found::Running(run.done.subscribe()))
                }
                // Its lifecycle.end is out: it ended before this cancel.
                Some(run) if run.status.is_terminal() => Some(Found::Ended),
                Some(run) => {
                    let done = run.done.subscribe();
                    match &run.controller {
                        Some(controller) => controller.cancel(reason),
                        None => run.cancel_requested = true,
                    }
                    Some(Found::Running(done))
                }
                None => Some(Found::Ended),
            };
            found.unwrap_or_else(|| {
                // Queued in the registry, so waiting in the queue: nothing
                // starts a run without the registry's lock.
                self.inner.queue.withdraw(run_id);
                let run = registry.remove(run_id);
                self.publish_gauges(&registry);
                Found::Queued(run.map(Box::new))
            })
        };
        let waiting = match found {
            Found::Queued(Some(run)) => return self.cancel_queued(*run, reason).await,
            Found::Queued(None) => return Err(ApiError::no_run(run_id)),
            Found::Running(done) => Some(done),
            Found::Ended => None,
        };
        let Some(mut done) = waiting else {
            let view = self.get(principal, run_id).await?;
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} has already ended ({})", view.status.as_str()),
            ));
        };
        let stopped = tokio::time::timeout(CANCEL_WAIT, done.wait_for(Option::is_some)).await;
        match stopped {
            Ok(Ok(ended)) => match *ended {
                Some((final_seq, RunStatus::Canceled)) => Ok(Cancelled {
                    run_id: run_id.to_string(),
                    cancelled: true,
                    final_seq,
                }),
                Some((_, RunStatus::Interrupted)) => Err(ApiError::new(
                    Code::InvalidState,
                    format!(
                        "run {run_id} was interrupted by a server shutdown; it resumes when the server starts again"
                    ),
                )),
                Some((_, status)) => Err(ApiError::new(
                    Code::InvalidState,
                    format!("run {run_id} ended ({}) before it could be cancelled", status.as_str()),
                )),
                None => Err(ApiError::internal("the run did not stop in time", run_id)),
            },
            _ => Err(ApiError::internal("the run did not stop in time", run_id)),
        }
    }

    /// A queued run never started (or, taken back after a restart, has not
    /// resumed yet): its log ends with the cancel, recorded.
    async fn cancel_queued(&self, run: LiveRun, reason: &str) -> Result<Cancelled, ApiError> {
        let log = match &self.inner.store {
            Some(store) if run.stored => loom_core::recovery::close_cancelled(store.as_ref(), &run.run_id, reason)
                .await
                .map_err(store_error)?,
            Some(store) => {
                // Cancelled before its record was written.
                let turn = TurnIds {
                    turn_id: run.run_id.as_str().into(),
                    parent_turn_id: None,
                };
                let log = loom_core::recovery::cancelled_log(&run.run_id, 0, &turn, reason, &RunMetrics::default());
                store
                    .create_run(&run.record(RunStatus::Queued))
                    .await
                    .map_err(store_error)?;
                store
                    .finish_run(&run.run_id, RunStatus::Canceled, None, &RunMetrics::default(), &log)
                    .await
                    .map_err(store_error)?;
                log
            }
            None => {
                let turn = TurnIds {
                    turn_id: run.run_id.as_str().into(),
                    parent_turn_id: None,
                };
                let log = loom_core::recovery::cancelled_log(&run.run_id, 0, &turn, reason, &RunMetrics::default());
                let mut view = run.view(None);
                view.status = RunStatus::Canceled;
                view.ended_ms = Some(now_ms());
                view.last_seq = log.len() as u64;
                self.registry()
                    .keep_finished(run.principal.clone(), view, self.inner.config.keep_finished_runs);
                log
            }
        };
        let final_seq = log.last().map_or(0, |event| event.seq);
        for event in log {
            self.inner.feed.publish(Arc::new(event));
        }
        self.inner.feed.close(&run.run_id);
        run.done.send_replace(Some((final_seq, RunStatus::Canceled)));
        metrics::counter!("loom_runs_finished_total", "status" => RunStatus::Canceled.as_str()).increment(1);
        Ok(Cancelled {
            run_id: run.run_id,
            cancelled: true,
            final_seq,
        })
    }

    /// `agent.steer`.
    pub async fn steer(&self, principal: &Principal, run_id: &str, message: String) -> Result<(), ApiError> {
        if message.trim().is_empty() {
            return Err(ApiError::new(Code::InvalidParams, "message must not be empty"));
        }
        self.refuse_sub_agent(principal, run_id, "steer")?;
        let refused = {
            let registry = self.registry();
            match registry.run(principal, run_id) {
                Some(run) => match (&run.controller, run.status) {
                    (Some(controller), status) if status != RunStatus::Queued => match controller.steer(message) {
                        Ok(()) => return Ok(()),
                        Err(err) => err.to_string(),
                    },
                    _ => "the run has not started yet".to_string(),
                },
                None => String::new(),
            }
        };
        if refused.is_empty() {
            let view = self.get(principal, run_id).await?;
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} has already ended ({})", view.status.as_str()),
            ));
        }
        Err(ApiError::new(Code::InvalidState, refused))
    }

    /// A live sub-agent is controlled through the run that started it.
    fn refuse_sub_agent(&self, principal: &Principal, run_id: &str, what: &str) -> Result<(), ApiError> {
        let registry = self.registry();
        match registry.sub_agents.get(run_id) {
            Some(root) if registry.run(principal, root).is_some() => Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} is a sub-agent of run {root}: {what} {root} instead"),
            )),
            _ => Ok(()),
        }
    }

    /// `permission.respond`.
    pub async fn respond(
        &self,
        principal: &Principal,
        run_id: &str,
        request_id: &str,
        decision: PermissionDecision,
    ) -> Result<(), ApiError> {
        let live = {
            let mut registry = self.registry();
            // A sub-agent's ask is answered by the run whose stream carries it.
            let answering = registry
                .sub_agents
                .get(run_id)
                .cloned()
                .unwrap_or_else(|| run_id.to_string());
            match registry.run_mut(principal, &answering) {
                Some(run) => {
                    let pending = run.pending.iter().any(|ask| ask.request_id == request_id);
                    if !pending {
                        return Err(ApiError::new(
                            Code::InvalidState,
                            format!("no ask '{request_id}' is waiting for an answer"),
                        ));
                    }
                    let delivered = run
                        .controller
                        .as_ref()
                        .is_some_and(|controller| controller.respond_permission(request_id, decision).is_ok());
                    if !delivered {
                        if !run.seeded {
                            return Err(ApiError::new(
                                Code::InvalidState,
                                format!("no ask '{request_id}' is waiting for an answer"),
                            ));
                        }
                        // Asked before the restart; the resumed run asks
                        // again under the same id, and gets this answer.
                        run.early.insert(request_id.to_string(), decision);
                    }
                    true
                }
                None => false,
            }
        };
        if live {
            return Ok(());
        }
        self.get(principal, run_id).await?;
        Err(ApiError::new(
            Code::InvalidState,
            format!("no ask '{request_id}' is waiting for an answer: the run has ended"),
        ))
    }

    /// `permission.list`.
    pub async fn pending(&self, principal: &Principal, run_id: Option<&str>) -> Result<Vec<PendingAsk>, ApiError> {
        {
            let registry = self.registry();
            match run_id {
                None => {
                    let mut asks: Vec<PendingAsk> = registry
                        .runs
                        .values()
                        .filter(|run| &run.principal == principal)
                        .flat_map(|run| run.pending.iter().cloned())
                        .collect();
                    asks.sort_by(|a, b| (&a.run_id, a.seq).cmp(&(&b.run_id, b.seq)));
                    return Ok(asks);
                }
                Some(id) => {
                    if let Some(run) = registry.run(principal, id) {
                        return Ok(run.pending.clone());
                    }
                    let root = registry
                        .sub_agents
                        .get(id)
                        .and_then(|root| registry.run(principal, root));
                    if let Some(run) = root {
                        return Ok(run.pending.iter().filter(|ask| ask.run_id == id).cloned().collect());
                    }
                }
            }
        }
        // Ended (or unknown: NOT_FOUND).
        self.get(principal, run_id.unwrap_or_default()).await?;
        Ok(Vec::new())
    }

    // ----- looking -------------------------------------------------------

    /// `run.get`.
    pub async fn get(&self, principal: &Principal, run_id: &str) -> Result<RunView, ApiError> {
        {
            let registry = self.registry();
            if let Some(run) = registry.run(principal, run_id) {
                return Ok(run.view(self.inner.queue.position(run_id)));
            }
            if let Some((owner, view)) = registry.finished.get(run_id) {
                return if owner == principal {
                    Ok(view.clone())
                } else {
                    Err(ApiError::no_run(run_id))
                };
            }
        }
        let Some(store) = &self.inner.store else {
            return Err(ApiError::no_run(run_id));
        };
        let snapshot = match store.load_run(run_id).await {
            Ok(snapshot) => snapshot,
            Err(StoreError::NotFound(_)) => return Err(ApiError::no_run(run_id)),
            Err(err) => return Err(store_error(err)),
        };
        if snapshot.run.principal.as_deref() != Some(principal.name()) {
            return Err(ApiError::no_run(run_id));
        }
        Ok(stored_view(snapshot.run, snapshot.last_seq))
    }

    /// `run.list`: this token's runs, newest first.
    pub async fn list(&self, principal: &Principal, params: ListParams) -> Result<RunPage, ApiError> {
        let limit = params.limit.unwrap_or(50).clamp(1, 500);
        let before = match &params.cursor {
            Some(cursor) => Some(parse_cursor(cursor)?),
            None => None,
        };
        let query = RunQuery {
            principal: Some(principal.name().to_string()),
            status: params.status,
            session_id: params.session_id.clone(),
            before: before.clone(),
            limit: limit + 1,
        };
        let mut runs: Vec<RunView> = Vec::new();
        let mut live_ids = Vec::new();
        {
            let registry = self.registry();
            for run in registry.runs.values().filter(|run| &run.principal == principal) {
                live_ids.push(run.run_id.clone());
                let view = run.view(self.inner.queue.position(&run.run_id));
                if matches_view(&query, &view) {
                    runs.push(view);
                }
            }
            if self.inner.store.is_none() {
                for (owner, view) in registry.finished.values() {
                    if owner == principal && matches_view(&query, view) {
                        runs.push(view.clone());
                    }
                }
            }
        }
        if let Some(store) = &self.inner.store {
            // Live runs' stored status may lag: the registry's view wins.
            let stored: Vec<RunRecord> = store
                .query_runs(&query)
                .await
                .map_err(store_error)?
                .into_iter()
                .filter(|record| !live_ids.contains(&record.run_id))
                .collect();
            let ids: Vec<String> = stored.iter().map(|record| record.run_id.clone()).collect();
            let last_seqs = store.last_seqs(&ids).await.map_err(store_error)?;
            runs.extend(
                stored
                    .into_iter()
                    .zip(last_seqs)
                    .map(|(record, seq)| stored_view(record, seq)),
            );
        }
        runs.sort_by(|a, b| (b.started_ms, &b.run_id).cmp(&(a.started_ms, &a.run_id)));
        runs.dedup_by(|a, b| a.run_id == b.run_id);
        let next_cursor = (runs.len() > limit).then(|| {
            let last = &runs[limit - 1];
            format!("{}:{}", last.started_ms, last.run_id)
        });
        runs.truncate(limit);
        Ok(RunPage { runs, next_cursor })
    }

    /// `run.subscribe`: the events after `after`, then live ones.
    pub async fn subscribe(&self, principal: &Principal, run_id: &str, after: u64) -> Result<Subscription, ApiError> {
        // Whose it is (NOT_FOUND for another token's).
        let live = self.registry().run(principal, run_id).is_some();
        if !live {
            self.get(principal, run_id).await?;
        }
        let pages = |until: Option<u64>| {
            self.inner.store.clone().map(|store| StoredPages {
                store,
                run_id: run_id.to_string(),
                after,
                until,
            })
        };
        Ok(match self.inner.feed.join(run_id, after) {
            Some(joined) => Subscription {
                stored: joined.store_until.and_then(|until| pages(Some(until))),
                page: VecDeque::new(),
                buffered: joined.buffered.into(),
                live: Some(joined.live),
                lagged: joined.lagged,
            },
            // Ended: its whole log is in the store.
            None => Subscription {
                stored: pages(None),
                page: VecDeque::new(),
                buffered: VecDeque::new(),
                live: None,
                lagged: Arc::new(AtomicBool::new(false)),
            },
        })
    }

    // ----- life of the server -------------------------------------------

    /// Takes back what a previous server left: the runs it left
    /// `INTERRUPTED` (or whose process died), asks pending at the time
    /// included, and the runs it had accepted and not started. Both wait in
    /// the queue under its caps like any run. Returns how many.
    pub async fn resume_interrupted(&self) -> Result<usize, ApiError> {
        let Some(store) = self.inner.store.clone() else {
            return Ok(0);
        };
        loom_core::recovery::recover_interrupted_runs(store.as_ref())
            .await
            .map_err(store_error)?;
        let interrupted = store
            .query_runs(&RunQuery {
                status: Some(RunStatus::Interrupted),
                limit: usize::MAX,
                ..RunQuery::default()
            })
            .await
            .map_err(store_error)?;
        let mut taken = 0;
        for record in interrupted.into_iter().rev() {
            let Some(principal) = record.principal.clone() else {
                continue;
            };
            // A sub-agent resumes with its parent (its `task` call is made
            // again and finds it).
            if record.parent.is_some() {
                continue;
            }
            match self
                .take_back_interrupted(&record, Principal(principal.into()), store.as_ref())
                .await
            {
                Ok(()) => taken += 1,
                Err(err) => tracing::error!(run_id = %record.run_id, error = %err, "could not resume the run"),
            }
        }
        for queued in store.queued_runs().await.map_err(store_error)? {
            let run_id = queued.record.run_id.clone();
            match self.take_back_queued(queued).await {
                Ok(()) => taken += 1,
                Err(NotTaken::Never(reason)) => {
                    tracing::error!(run_id, error = %reason, "a queued run can never start; it is cancelled");
                    let why = format!("the run cannot start: {reason}");
                    if let Err(err) = loom_core::recovery::close_cancelled(store.as_ref(), &run_id, &why).await {
                        tracing::error!(run_id, error = %err, "could not record the cancelled run");
                    }
                }
                Err(NotTaken::NotNow(reason)) => {
                    tracing::error!(run_id, error = %reason, "a queued run cannot start now; it stays queued for the next start");
                }
            }
        }
        Ok(taken)
    }

    async fn take_back_interrupted(
        &self,
        record: &RunRecord,
        principal: Principal,
        store: &dyn Store,
    ) -> Result<(), String> {
        let events = store.events(&record.run_id, 0).await.map_err(|err| err.to_string())?;
        let last_seq = events.last().map_or(0, |event| event.seq);
        let mut pending: Vec<PendingAsk> = Vec::new();
        for event in &events {
            match &event.kind {
                EventKind::PermissionRequest {
                    request_id,
                    tool,
                    args,
                    rule,
                } => pending.push(PendingAsk {
                    run_id: record.run_id.clone(),
                    request_id: request_id.clone(),
                    tool: tool.clone(),
                    args: args.clone(),
                    rule: rule.clone(),
                    seq: event.seq,
                }),
                EventKind::PermissionResolved { request_id, .. } => pending.retain(|ask| ask.request_id != *request_id),
                _ => {}
            }
        }
        let model = (record.model != self.inner.agents.default_model()
            && self.inner.config.models.contains(&record.model))
        .then(|| record.model.clone());
        let agent = self.inner.agents.get(model.as_deref(), None).await?;
        let (done, _) = watch::channel(None);
        self.inner.feed.open(&record.run_id, last_seq);
        self.back_in_line(
            LiveRun {
                run_id: record.run_id.clone(),
                session_id: record.session_id.clone(),
                principal: principal.clone(),
                prompt: record.prompt.clone(),
                model: record.model.clone(),
                status: RunStatus::Queued,
                started_ms: record.started_ms,
                metrics: record.metrics.clone(),
                content: None,
                last_seq,
                start: Some((agent, Start::Resume)),
                stored: true,
                controller: None,
                cancel_requested: false,
                seeded: !pending.is_empty(),
                pending,
                early: HashMap::new(),
                done,
            },
            None,
        );
        Ok(())
    }

    /// A run a previous server accepted and never started: back in line,
    /// if this server can still run it as it was asked for.
    async fn take_back_queued(&self, queued: QueuedRun) -> Result<(), NotTaken> {
        let record = queued.record;
        let owner = record
            .principal
            .clone()
            .ok_or_else(|| NotTaken::Never("the run has no owner".into()))?;
        let principal = Principal(owner.into());
        let params: StartRun = serde_json::from_str(&queued.request)
            .map_err(|err| NotTaken::Never(format!("its stored request is unreadable: {err}")))?;
        // The configuration may have changed since (a model no longer offered, a lower step limit).
        self.validate(&params).map_err(|err| NotTaken::Never(err.to_string()))?;
        let model = params.model.clone().filter(|m| *m != self.inner.agents.default_model());
        let agent = self
            .inner
            .agents
            .get(model.as_deref(), params.tools.as_deref())
            .await
            .map_err(NotTaken::NotNow)?;
        let mut run = self.queued_run(
            &principal,
            &params,
            agent,
            &record.run_id,
            &record.session_id,
            record.started_ms,
            None,
        );
        run.stored = true;
        self.inner.feed.open(&record.run_id, 0);
        let key = params.idempotency_key.clone().map(|key| (key, digest(&params)));
        self.back_in_line(run, key);
        Ok(())
    }

    /// A run taken back after a restart joins the registry (with the
    /// idempotency key that names it) and waits in line under the caps.
    fn back_in_line(&self, run: LiveRun, key: Option<(String, u64)>) {
        let ticket = Ticket {
            run_id: run.run_id.clone(),
            principal: run.principal.clone(),
            session_id: run.session_id.clone(),
        };
        let launches = {
            let mut registry = self.registry();
            if let Some((key, digest)) = key {
                registry.remember(&ticket.principal, key, digest, ticket.run_id.clone());
            }
            registry.add(run);
            let started = self.inner.queue.readmit(ticket);
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            launches
        };
        for launch in launches {
            self.launch(launch);
        }
    }

    /// Stops taking runs, interrupts the live ones (each checkpoints and
    /// stays `INTERRUPTED`, for the next start to resume) and waits for
    /// them, at most the shutdown grace. Queued runs stay `QUEUED` in the
    /// store for the next start; without a store they end `CANCELED`.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let queued: Vec<LiveRun> = {
            let mut registry = self.registry();
            let queued = self
                .inner
                .queue
                .drain()
                .iter()
                .filter_map(|ticket| registry.remove(&ticket.run_id))
                .collect();
            for run in registry.runs.values() {
                if let Some(controller) = &run.controller {
                    controller.interrupt("the server is shutting down");
                }
            }
            self.publish_gauges(&registry);
            queued
        };
        if self.inner.store.is_some() {
            // Their clients' streams end here; the next start takes them.
            if !queued.is_empty() {
                tracing::info!(count = queued.len(), "queued runs stay queued for the next start");
            }
            for run in &queued {
                self.inner.feed.close(&run.run_id);
            }
        } else if !queued.is_empty() {
            // Nothing outlives this process: they end CANCELED, with a reason.
            tracing::warn!(count = queued.len(), "queued runs that never started are cancelled");
        }
        for run in queued.into_iter().filter(|_| self.inner.store.is_none()) {
            let run_id = run.run_id.clone();
            if let Err(err) = self
                .cancel_queued(run, "the server shut down before the run started")
                .await
            {
                tracing::error!(run_id, error = %err, "could not record a cancelled queued run");
            }
        }
        self.inner.pumps.close();
        if tokio::time::timeout(self.inner.config.shutdown_grace, self.inner.pumps.wait())
            .await
            .is_err()
        {
            tracing::warn!("some runs did not stop within the shutdown grace");
        }
    }

    /// Whether a shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }
}

/// The ask a `permission.request` event makes (of its own run, which may
/// be a sub-agent of the run that answers it).
fn pending_ask(event: &Event) -> Option<PendingAsk> {
    let EventKind::PermissionRequest {
        request_id,
        tool,
        args,
        rule,
    } = &event.kind
    else {
        return None;
    };
    Some(PendingAsk {
        run_id: event.run_id.to_string(),
        request_id: request_id.clone(),
        tool: tool.clone(),
        args: args.clone(),
        rule: rule.clone(),
        seq: event.seq,
    })
}

fn session_taken(session: &str) -> ApiError {
    ApiError::new(Code::Conflict, format!("session '{session}' belongs to another token"))
}

/// Without a store, a session's conversation is kept under its token too,
/// so a session id can never lead to another token's messages.
fn history_key(principal: &Principal, session: &str) -> String {
    format!("{}\u{0}{session}", principal.name())
}

/// A retry of a request whose run is being stored: it has no answer yet.
fn being_accepted() -> ApiError {
    ApiError::new(
        Code::Overloaded,
        "the first request with this idempotency key is still being accepted; try again",
    )
    .retry_after(Duration::from_millis(200))
}

fn conflicting_key() -> ApiError {
    ApiError::new(Code::Conflict, "this idempotency key was used with another payload")
}

fn accepted_of(run: &LiveRun, queue_position: Option<usize>) -> RunAccepted {
    RunAccepted {
        run_id: run.run_id.clone(),
        session_id: run.session_id.clone(),
        status: run.status,
        queue_position,
        steered: false,
    }
}

fn stored_view(record: RunRecord, last_seq: u64) -> RunView {
    RunView {
        run_id: record.run_id,
        session_id: record.session_id,
        status: record.status,
        prompt: record.prompt,
        model: record.model,
        started_ms: record.started_ms,
        ended_ms: record.ended_ms,
        content: record.content,
        metrics: record.metrics,
        pending_asks: Vec::new(),
        queue_position: None,
        last_seq,
        parent_run_id: record.parent.map(|parent| parent.run_id),
    }
}

fn matches_view(query: &RunQuery, view: &RunView) -> bool {
    query.status.is_none_or(|status| view.status == status)
        && query
            .session_id
            .as_deref()
            .is_none_or(|session| view.session_id == session)
        && query
            .before
            .as_ref()
            .is_none_or(|(ms, id)| (view.started_ms, view.run_id.as_str()) < (*ms, id.as_str()))
}

fn parse_cursor(cursor: &str) -> Result<(u64, String), ApiError> {
    cursor
        .split_once(':')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_string())))
        .ok_or_else(|| ApiError::new(Code::InvalidParams, "cursor: pass the nextCursor of the page before"))
}
