//! The gateway's operations — start, cancel, steer, answer, look, follow —
//! one implementation that the WebSocket methods and the HTTP routes both
//! call, so the two protocols cannot drift apart. One file per job:
//! `rate.rs` (requests per minute), `admission_checks.rs` (what a start
//! request must pass), `admission.rs` (taking a run in),
//! `pump.rs` (a started run's events and end), `controls.rs` (cancel,
//! steer, answer), `queries.rs` (runs and asks), `subscription.rs`
//! (following a run), `restart.rs` (taking runs back, shutting down),
//! `audit.rs` (the record of who changed what); here
//! the state they share.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use loom_core::event::TurnIds;
use loom_core::{
    Agent, Control, Event, EventKind, KeyedRequest, Message, PermissionDecision, QueuedRun, RunHandle, RunMetrics,
    RunOutcome, RunQuery, RunRecord, RunRequest, RunStatus, Store, StoreError,
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

mod admission;
mod admission_checks;
mod audit;
mod controls;
mod pump;
mod queries;
mod rate;
mod remote;
mod restart;
pub(crate) mod rewind;
mod subscription;

use admission::accepted_of;
use admission_checks::{being_accepted, conflicting_key, digest, session_taken};
pub use audit::Audited;
use rate::Bucket;
pub use remote::Cluster;
pub use subscription::{Next, Subscription};

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
    /// Set when workers execute the runs (docs/cluster.md).
    cluster: Option<Cluster>,
    /// The runs followed on workers.
    followed: Arc<remote::Followed>,
    /// The audit trail without a store, and the bound on refusal records.
    audit: audit::AuditMemory,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn store_error(err: StoreError) -> ApiError {
    match err {
        // Nothing is wrong with the request: the store will be back.
        StoreError::Unavailable(_) | StoreError::Locked { .. } => {
            tracing::warn!(error = %err, "the store is unavailable");
            ApiError::new(Code::Unavailable, "the store is unavailable; try again").retry_after(Duration::from_secs(1))
        }
        StoreError::QueueFull { .. } => ApiError::new(Code::Overloaded, "too many runs are waiting; try again later")
            .retry_after(Duration::from_secs(1)),
        err => ApiError::internal("the store failed", err),
    }
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
        Self::build(config, factory, store, queue, feed, None)
    }

    /// A gateway of a cluster that executes nothing itself: its runs are
    /// stored `QUEUED` in `store` for `loom worker` processes to take, and
    /// followed through `cluster` (docs/cluster.md). Its line holds no run
    /// back: the workers' `--max-runs` bound what executes. Call within a
    /// Tokio runtime: the reader of the followed runs starts here.
    pub fn on_cluster(
        config: ServerConfig,
        factory: Arc<dyn AgentFactory>,
        store: Arc<dyn Store>,
        cluster: Cluster,
    ) -> Self {
        let feed: Arc<dyn EventFeed> = Arc::new(LocalFeed::new(config.subscriber_buffer, None));
        let queue: Arc<dyn RunQueue> = Arc::new(LocalQueue::new(Caps {
            max_runs: usize::MAX,
            per_token: usize::MAX,
            max_queued: config.max_queued,
        }));
        let service = Self::build(config, factory, Some(store), queue, feed, Some(cluster));
        service.start_reading();
        service
    }

    fn build(
        config: ServerConfig,
        factory: Arc<dyn AgentFactory>,
        store: Option<Arc<dyn Store>>,
        queue: Arc<dyn RunQueue>,
        feed: Arc<dyn EventFeed>,
        cluster: Option<Cluster>,
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
                cluster,
                followed: Arc::default(),
                audit: audit::AuditMemory::default(),
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
        // A cluster gateway's line holds nothing back: its gauges of runs
        // are the cluster's, read from the store (`remote.rs`).
        if self.inner.cluster.is_none() {
            let counts = self.inner.queue.counts();
            metrics::gauge!("loom_runs_active").set(counts.executing as f64);
            metrics::gauge!("loom_runs_queued").set(counts.waiting as f64);
        }
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

    /// Whether a shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }
}

/// Without a store, a session's conversation is kept under its token too,
/// so a session id can never lead to another token's messages.
pub(super) fn history_key(principal: &Principal, session: &str) -> String {
    format!("{}\u{0}{session}", principal.name())
}

/// A service for the unit tests beside each job: no store, one token
/// (`alice`), agents whose scripted model answers after `delay_ms`.
#[cfg(test)]
pub(super) mod testing {
    use super::*;
    use loom_core::async_trait;
    use loom_llm::{ScriptTurn, ScriptedModel};

    struct Answering {
        delay_ms: u64,
    }

    #[async_trait]
    impl AgentFactory for Answering {
        fn default_model(&self) -> String {
            "scripted:inline".into()
        }

        async fn build(&self, _spec: crate::agents::AgentSpec) -> Result<Agent, String> {
            let turn = ScriptTurn {
                content: Some("done".into()),
                delay_ms: Some(self.delay_ms),
                ..ScriptTurn::default()
            };
            Agent::builder()
                .model(ScriptedModel::new(vec![turn; 20]))
                .build()
                .map_err(|err| err.to_string())
        }
    }

    pub(crate) fn service(delay_ms: u64) -> Service {
        let settings: crate::config::ServerSettings =
            serde_json::from_value(serde_json::json!({"tokens": [{"name": "alice", "token": "alice-token-0123"}]}))
                .unwrap_or_default();
        let config = ServerConfig::from_settings(&settings, None).unwrap_or_default();
        Service::new(config, Arc::new(Answering { delay_ms }), None)
    }

    pub(crate) fn alice() -> Principal {
        Principal::new("alice")
    }

    pub(crate) fn start(prompt: &str) -> StartRun {
        StartRun {
            prompt: prompt.into(),
            mode: None,
            session_id: None,
            model: None,
            max_steps: None,
            tools: None,
            idempotency_key: None,
            on_busy: None,
            traceparent: None,
        }
    }
}

#[cfg(test)]
mod store_errors {
    use super::*;

    #[test]
    fn a_store_out_of_reach_is_unavailable_and_a_broken_one_internal() {
        for err in [
            StoreError::Unavailable("redis: connection refused".into()),
            StoreError::Locked { waited_ms: 5000 },
        ] {
            let answer = store_error(err);
            assert_eq!(answer.code, Code::Unavailable);
            assert_eq!(answer.retry_after_ms, Some(Duration::from_secs(1)));
        }
        assert_eq!(
            store_error(StoreError::Backend("no such table".into())).code,
            Code::Internal
        );
    }
}
