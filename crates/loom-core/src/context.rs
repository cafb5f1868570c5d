//! `RunContext`: what stays the same for every turn of one run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;

/// Limits of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Turns that may use tools before the final answer is demanded.
    pub max_steps: u32,
    /// Wall-clock limit of the whole run; `None` for no limit.
    pub run_timeout: Option<Duration>,
    /// Limit of one turn: the model call plus the turn's tools; `None` for no limit.
    pub step_timeout: Option<Duration>,
    /// How long a cancelled tool may take to notice its token before its future is dropped.
    pub cancel_grace: Duration,
    /// The tokens and money the run may spend.
    pub budget: Budget,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 10,
            run_timeout: Some(Duration::from_secs(300)),
            step_timeout: Some(Duration::from_secs(120)),
            cancel_grace: Duration::from_millis(250),
            budget: Budget::default(),
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
    /// The process is going away (SIGTERM, SIGHUP, its output closed): the
    /// run stops at once and stays resumable (`INTERRUPTED`), with its reason.
    Interrupted(String),
    /// The store refused a write of the run's events: nothing the run does
    /// from then on could be shown (engine/event_log.rs), so it stops at
    /// once with a `STORE` error, with the store's reason.
    StoreFailed(String),
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
    /// The run that started this one as a sub-agent: a person it waits
    /// for stops that run's clocks too.
    parent: Option<RunContext>,
    cancel: CancellationToken,
    stop_cause: OnceLock<StopCause>,
    /// Time spent waiting for a person, which the run's clocks do not count.
    person: watch::Sender<PersonClock>,
}

/// Waits for a person (a permission question, a pause): how many are going
/// on, since when, and how long the finished ones took.
#[derive(Debug, Clone, Copy, Default)]
struct PersonClock {
    waiting: u32,
    since: Option<Instant>,
    waited: Duration,
}

impl PersonClock {
    /// Time waited so far, or `None` while a wait is going on.
    fn settled(&self) -> Option<Duration> {
        (self.waiting == 0).then_some(self.waited)
    }
}

/// A time limit whose clock stops while the run waits for a person: its
/// moment is `start + limit` plus the person's time since `start`.
#[derive(Debug, Clone)]
pub struct Deadline {
    ctx: RunContext,
    start: Instant,
    limit: Duration,
    /// The person's time already counted when the clock started.
    waited_before: Duration,
}

impl Deadline {
    /// The moment the limit passes, if it is known now: `None` while a
    /// person is being waited for, or when the moment is too far to
    /// represent (a limit of `u64::MAX` seconds is no limit).
    pub fn at(&self) -> Option<Instant> {
        let waited = self.ctx.inner.person.borrow().settled()?;
        let extra = waited.saturating_sub(self.waited_before);
        self.start.checked_add(self.limit)?.checked_add(extra)
    }

    /// Whether the limit has passed.
    pub fn passed(&self) -> bool {
        self.at().is_some_and(|at| Instant::now() >= at)
    }

    /// Completes when the limit passes (never, if it cannot).
    pub async fn expired(&self) {
        let mut changes = self.ctx.inner.person.subscribe();
        loop {
            changes.borrow_and_update();
            match self.at() {
                None => {
                    if changes.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => return,
                        changed = changes.changed() => {
                            if changed.is_err() {
                                return std::future::pending().await;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Holds the run's clocks while a person is being waited for; dropping it
/// starts them again.
#[derive(Debug)]
pub struct PersonWait {
    ctx: RunContext,
    /// The same wait for the run's parent (a sub-agent's person is its
    /// parent's person: no clock of the tree runs while they are asked).
    _parent: Option<Box<PersonWait>>,
}

impl Drop for PersonWait {
    fn drop(&mut self) {
        self.ctx.inner.person.send_modify(|clock| {
            clock.waiting = clock.waiting.saturating_sub(1);
            if clock.waiting == 0 {
                if let Some(since) = clock.since.take() {
                    clock.waited += since.elapsed();
                }
            }
        });
    }
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
                parent: None,
                cancel,
                stop_cause: OnceLock::new(),
                person: watch::Sender::new(PersonClock::default()),
            }),
        }
    }

    /// The same context as a sub-agent of `parent` (one level deeper),
    /// before it is shared.
    pub(crate) fn under(mut self, parent: &RunContext) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.depth = parent.depth() + 1;
            inner.parent = Some(parent.clone());
        }
        self
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

    /// The run's time limit, if it has one. Time spent waiting for a person
    /// does not count against it.
    pub fn run_deadline(&self) -> Option<Deadline> {
        let limit = self.inner.limits.run_timeout?;
        Some(Deadline {
            ctx: self.clone(),
            start: self.inner.started,
            limit,
            waited_before: Duration::ZERO,
        })
    }

    /// A limit of one step starting now: like the run's, it does not count
    /// time spent waiting for a person.
    pub fn step_deadline(&self) -> Option<Deadline> {
        let limit = self.inner.limits.step_timeout?;
        let clock = *self.inner.person.borrow();
        let waited_before = clock.waited + clock.since.map_or(Duration::ZERO, |since| since.elapsed());
        Some(Deadline {
            ctx: self.clone(),
            start: Instant::now(),
            limit,
            waited_before,
        })
    }

    /// Stops the run's clocks until the returned guard is dropped: a person
    /// is being asked, or the run is paused.
    pub fn wait_for_person(&self) -> PersonWait {
        self.inner.person.send_modify(|clock| {
            if clock.waiting == 0 {
                clock.since = Some(Instant::now());
            }
            clock.waiting += 1;
        });
        PersonWait {
            ctx: self.clone(),
            _parent: self
                .inner
                .parent
                .as_ref()
                .map(|parent| Box::new(parent.wait_for_person())),
        }
    }

    /// Records why the run is stopping (the first cause wins) and cancels it.
    pub fn stop(&self, cause: StopCause) {
        let _ = self.inner.stop_cause.set(cause);
        self.inner.cancel.cancel();
    }

    /// Why the run was stopped, if it was: its own cause, else (for a
    /// sub-agent stopped with its parent) its parent's — a child of an
    /// interrupted run is interrupted too, and resumes with it.
    pub fn stop_cause(&self) -> Option<&StopCause> {
        self.inner
            .stop_cause
            .get()
            .or_else(|| self.inner.parent.as_ref().and_then(RunContext::stop_cause))
    }

    /// Whether the run has been cancelled or stopped.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }
}
