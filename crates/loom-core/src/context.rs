//! `RunContext`: what stays the same for every turn of one run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

/// Limits of one run (seed 004's LoopConfig).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Turns that may use tools before the final answer is demanded (seed 004's `maxSteps`).
    pub max_steps: u32,
    /// Wall-clock limit of the whole run; `None` for no limit.
    pub run_timeout: Option<Duration>,
    /// Limit of one turn: the model call plus the turn's tools; `None` for no limit.
    pub step_timeout: Option<Duration>,
    /// How long a cancelled tool may take to notice its token before its future is dropped.
    pub cancel_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 10,
            run_timeout: Some(Duration::from_secs(300)),
            step_timeout: Some(Duration::from_secs(120)),
            cancel_grace: Duration::from_millis(250),
        }
    }
}

/// Why a run was stopped from outside its normal flow. The first cause wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// Cancelled by a person or a program, with its reason.
    Cancelled(String),
    /// The run's deadline passed.
    RunTimeout,
    /// One turn took longer than the step limit.
    StepTimeout,
}

/// Identity, limits and the cancel token shared by every turn of a run.
#[derive(Debug, Clone)]
pub struct RunContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    run_id: Arc<str>,
    correlation_id: String,
    session_id: String,
    started_at: SystemTime,
    started: Instant,
    workspace: PathBuf,
    limits: Limits,
    depth: u32,
    cancel: CancellationToken,
    stop_cause: OnceLock<StopCause>,
}

impl RunContext {
    /// A context for a new run. Ids are generated when not given.
    pub fn new(
        run_id: Option<String>,
        session_id: Option<String>,
        workspace: PathBuf,
        limits: Limits,
        cancel: CancellationToken,
    ) -> Self {
        let run_id: Arc<str> = run_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()).into();
        Self {
            inner: Arc::new(Inner {
                correlation_id: uuid::Uuid::new_v4().to_string(),
                session_id: session_id.unwrap_or_else(|| run_id.to_string()),
                run_id,
                started_at: SystemTime::now(),
                started: Instant::now(),
                workspace,
                limits,
                depth: 0,
                cancel,
                stop_cause: OnceLock::new(),
            }),
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.inner.run_id
    }

    /// The run's id, shared.
    pub fn run_id_arc(&self) -> Arc<str> {
        self.inner.run_id.clone()
    }

    /// Id that ties logs of this run together across services.
    pub fn correlation_id(&self) -> &str {
        &self.inner.correlation_id
    }

    /// The session the run belongs to.
    pub fn session_id(&self) -> &str {
        &self.inner.session_id
    }

    /// Wall-clock start time.
    pub fn started_at(&self) -> SystemTime {
        self.inner.started_at
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// The directory the tools are confined to.
    pub fn workspace(&self) -> &Path {
        &self.inner.workspace
    }

    /// The run's limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// 0 for a top-level run, 1 for its sub-agents, and so on.
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// The run's cancel token; cancelling it stops the model stream and tools.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// The moment the run must end, if it has a run timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.limits.run_timeout.map(|limit| self.inner.started + limit)
    }

    /// Records why the run is stopping (the first cause wins) and cancels it.
    pub fn stop(&self, cause: StopCause) {
        let _ = self.inner.stop_cause.set(cause);
        self.inner.cancel.cancel();
    }

    /// Why the run was stopped, if it was.
    pub fn stop_cause(&self) -> Option<&StopCause> {
        self.inner.stop_cause.get()
    }

    /// Whether the run has been cancelled or stopped.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }
}
