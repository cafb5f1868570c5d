//! `RunHandle`: a live run's event stream and its controls.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::context::{RunContext, StopCause};
pub use crate::control::Control;
use crate::control::PermissionDecision;
use crate::event::Event;
use crate::live_state::LiveState;
use crate::metrics::RunMetrics;
pub use crate::outcome::RunOutcome;
use crate::outcome::{ErrorCode, StopReason};
use crate::permission::PendingAsks;
use crate::status::RunStatus;

/// A control could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The run has already ended.
    #[error("the run has already ended")]
    Finished,
    /// No permission request with this id is waiting.
    #[error("no permission request '{0}' is waiting for an answer")]
    UnknownRequest(String),
}

/// Cloneable controls of a live run: one way to command it
/// ([`RunController::send`], with a [`Control`]) and one way to observe it
/// ([`RunController::state`]).
#[derive(Debug, Clone)]
pub struct RunController {
    pub(crate) ctx: RunContext,
    pub(crate) pause_tx: Arc<watch::Sender<bool>>,
    pub(crate) steer_tx: mpsc::UnboundedSender<String>,
    pub(crate) state: watch::Receiver<LiveState>,
    pub(crate) pending: Arc<PendingAsks>,
}

impl RunController {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.ctx.run_id()
    }

    /// The run's session: the next run of the conversation names it.
    pub fn session_id(&self) -> &str {
        self.ctx.session_id()
    }

    /// Cancels the run. Cancelling twice, or after the end, is harmless.
    pub fn cancel(&self, reason: impl Into<String>) {
        self.ctx.stop(StopCause::Cancelled(reason.into()));
    }

    /// Stops the run at once, like a cancel, but leaves it resumable: it
    /// ends `INTERRUPTED` (its last checkpoint kept, no `lifecycle.end`),
    /// for a process that is going away (SIGTERM, SIGHUP, its output closed).
    pub fn interrupt(&self, reason: impl Into<String>) {
        self.ctx.stop(StopCause::Interrupted(reason.into()));
    }

    /// Holds the run at the next turn boundary.
    pub fn pause(&self) {
        self.pause_tx.send_replace(true);
    }

    /// Lets a paused run go on (a stopped run is resumed with
    /// [`crate::Agent::resume`]).
    pub fn unpause(&self) {
        self.pause_tx.send_replace(false);
    }

    /// Adds a user message at the next turn boundary.
    pub fn steer(&self, message: impl Into<String>) -> Result<(), ControlError> {
        if self.status().is_terminal() {
            return Err(ControlError::Finished);
        }
        self.steer_tx.send(message.into()).map_err(|_| ControlError::Finished)
    }

    /// Answers a `permission.request` of the run or of one of its
    /// sub-agents — also one the run left open before a restart and has
    /// not asked again yet (the answer applies when it does).
    pub fn respond_permission(&self, request_id: &str, decision: PermissionDecision) -> Result<(), ControlError> {
        self.pending.answer(request_id, decision)
    }

    /// Whether the run, or one of its sub-agents, is waiting for a
    /// person's answer at this moment. Unlike the shown status
    /// (`WAITING_PERMISSION` while an ask is visible), this is false for an
    /// ask a previous process left open that the resumed run has not asked
    /// again yet, for one answered before it was asked again, and from the
    /// moment an answer is delivered, before the run's events show it.
    pub fn is_asking(&self) -> bool {
        self.pending.asking()
    }

    /// Delivers any control.
    pub fn send(&self, control: Control) -> Result<(), ControlError> {
        match control {
            Control::Cancel { reason } => self.cancel(reason),
            Control::Interrupt { reason } => self.interrupt(reason),
            Control::Pause => self.pause(),
            Control::Unpause => self.unpause(),
            Control::Steer(message) => return self.steer(message),
            Control::PermissionReply { request_id, decision } => return self.respond_permission(&request_id, decision),
        }
        Ok(())
    }

    /// The run's current status.
    pub fn status(&self) -> RunStatus {
        self.state.borrow().status
    }

    /// What the run shows of itself now: status, asks waiting, usage, last `seq`.
    pub fn state(&self) -> LiveState {
        self.state.borrow().clone()
    }

    /// The run's state as it changes: a watcher wakes when the status, the
    /// asks waiting or the answer change (usage and the last `seq` are
    /// current whenever read, but follow the events, which are that signal).
    pub fn watch_state(&self) -> watch::Receiver<LiveState> {
        self.state.clone()
    }
}

/// A live run: a stream of its events plus its controls. Dropping the handle
/// does not stop the run; call [`RunHandle::cancel`] for that.
#[derive(Debug)]
pub struct RunHandle {
    pub(crate) events: mpsc::UnboundedReceiver<Box<Event>>,
    pub(crate) controller: RunController,
    pub(crate) task: JoinHandle<RunOutcome>,
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.controller.run_id()
    }

    /// Controls that can be cloned and used from other tasks.
    pub fn controller(&self) -> RunController {
        self.controller.clone()
    }

    /// Cancels the run.
    pub fn cancel(&self, reason: impl Into<String>) {
        self.controller.cancel(reason);
    }

    /// Holds the run at the next turn boundary.
    pub fn pause(&self) {
        self.controller.pause();
    }

    /// Lets a paused run go on (a stopped run is resumed with
    /// [`crate::Agent::resume`]).
    pub fn unpause(&self) {
        self.controller.unpause();
    }

    /// Adds a user message at the next turn boundary.
    pub fn steer(&self, message: impl Into<String>) -> Result<(), ControlError> {
        self.controller.steer(message)
    }

    /// The run's current status.
    pub fn status(&self) -> RunStatus {
        self.controller.status()
    }

    /// Answers a `permission.request`.
    pub fn respond_permission(&self, request_id: &str, decision: PermissionDecision) -> Result<(), ControlError> {
        self.controller.respond_permission(request_id, decision)
    }

    /// The next event, or `None` after `lifecycle.end`.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await.map(|event| *event)
    }

    /// Waits for the run to end, dropping events not yet read.
    pub async fn outcome(self) -> RunOutcome {
        let run_id = self.controller.run_id().to_string();
        match self.task.await {
            Ok(outcome) => outcome,
            Err(join_error) => RunOutcome {
                run_id,
                status: RunStatus::Error,
                content: None,
                stop_reason: Some(StopReason::error(
                    ErrorCode::Internal,
                    format!("the run's task failed: {join_error}"),
                )),
                turns: 0,
                metrics: RunMetrics::default(),
                messages: Vec::new(),
            },
        }
    }

    /// Reads every event to the end, then returns them with the outcome.
    pub async fn collect(mut self) -> (Vec<Event>, RunOutcome) {
        let mut events = Vec::new();
        while let Some(event) = self.events.recv().await {
            events.push(*event);
        }
        let outcome = self.outcome().await;
        (events, outcome)
    }
}

impl Stream for RunHandle {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.events.poll_recv(cx).map(|event| event.map(|event| *event))
    }
}
