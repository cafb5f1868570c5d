//! Approvals: asking a person (`permission.request`, a wait for the reply
//! through the run's controller, `permission.resolved`), the requests
//! waiting with their stable ids, answers that come before a resumed run
//! asks again, and runs nobody can answer for. The CLI, the gateway and
//! sub-agents (whose asks their root's controller answers) all use this.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::grant::SessionGrant;
use crate::control::PermissionDecision;
use crate::emitter::EventEmitter;
use crate::event::{EventKind, TurnIds, Unanswered};
use crate::handle::ControlError;
use crate::live_state::LiveState;
use crate::status::RunStatus;

/// How a wait for a person ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskOutcome {
    /// Allowed (once or always).
    Allowed,
    /// Denied, with the reason the model will read.
    Denied(String),
    /// The run was cancelled while waiting.
    Cancelled,
}

/// Grants of "always" that last for a session.
pub type SessionGrants = Arc<Mutex<HashSet<SessionGrant>>>;

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The requests of one run tree waiting for answers, shared by the run,
/// its sub-agents and its controller.
#[derive(Debug)]
pub(crate) struct PendingAsks {
    asks: Mutex<Asks>,
    /// The run's state: which asks a previous process left open.
    state: Arc<watch::Sender<LiveState>>,
}

/// One lock over both, so an answer and the ask it answers cannot pass
/// each other.
#[derive(Debug, Default)]
struct Asks {
    waiting: HashMap<String, oneshot::Sender<PermissionDecision>>,
    /// Answers to asks left open before a restart, for when the resumed
    /// run asks them again (under the same ids).
    early: HashMap<String, PermissionDecision>,
}

impl PendingAsks {
    pub(crate) fn new(state: Arc<watch::Sender<LiveState>>) -> Self {
        Self {
            asks: Mutex::default(),
            state,
        }
    }

    /// Delivers a person's answer to the ask `request_id`, or keeps it for
    /// the resumed run that will ask it again.
    pub(crate) fn answer(&self, request_id: &str, decision: PermissionDecision) -> Result<(), ControlError> {
        let mut asks = lock(&self.asks);
        if let Some(sender) = asks.waiting.remove(request_id) {
            return sender
                .send(decision)
                .map_err(|_| ControlError::UnknownRequest(request_id.to_string()));
        }
        // Answered once: the state forgets it was left open.
        let left_open = self.state.borrow().asked_before_restart(request_id);
        if left_open {
            asks.early.insert(request_id.to_string(), decision);
            self.state.send_modify(|state| state.answered_early(request_id));
            return Ok(());
        }
        Err(ControlError::UnknownRequest(request_id.to_string()))
    }

    /// Waits for the answer to `request_id` from now on, unless it is
    /// known already: sent before the ask, or decided before a restart
    /// (the call was cut off after its answer, before it ran, and the
    /// resumed run asks again).
    fn expect(&self, request_id: &str) -> Expected {
        let mut asks = lock(&self.asks);
        if let Some(decision) = asks.early.remove(request_id) {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(decision);
            return Expected::Early(rx);
        }
        let decided = self.state.borrow().decided_before_restart(request_id);
        if let Some(decision) = decided {
            return Expected::DecidedBefore(decision);
        }
        let (tx, rx) = oneshot::channel();
        asks.waiting.insert(request_id.to_string(), tx);
        Expected::Waiting(rx)
    }

    fn forget(&self, request_id: &str) {
        lock(&self.asks).waiting.remove(request_id);
    }

    /// Whether an ask of the run tree waits for its answer now.
    pub(crate) fn asking(&self) -> bool {
        !lock(&self.asks).waiting.is_empty()
    }
}

/// How an ask's answer will come.
enum Expected {
    /// From a person, through the run's controller.
    Waiting(oneshot::Receiver<PermissionDecision>),
    /// It came before the ask (a resumed run asking again).
    Early(oneshot::Receiver<PermissionDecision>),
    /// A person decided before a restart; the log has the question and
    /// its resolution already.
    DecidedBefore(PermissionDecision),
}

/// Takes an ask out of the waiting ones when its wait ends, however it
/// ends (a run that no longer waits must not look as if it did).
struct WaitingEntry<'a> {
    pending: &'a PendingAsks,
    request_id: &'a str,
}

impl Drop for WaitingEntry<'_> {
    fn drop(&mut self) {
        self.pending.forget(self.request_id);
    }
}

/// The ask machinery of one run.
#[derive(Clone)]
pub(crate) struct PermissionGate {
    pub pending: Arc<PendingAsks>,
    pub grants: SessionGrants,
    pub timeout: Option<Duration>,
    /// Why nobody can answer, when nobody can (the CLI without a
    /// terminal): every ask is then denied with this reason.
    pub nobody_to_ask: Option<Arc<str>>,
    /// Where the run shows its status.
    pub state: Arc<watch::Sender<LiveState>>,
    /// Where `WAITING_PERMISSION` is recorded, so other processes see it.
    pub store: Option<(Arc<dyn crate::store::Store>, Arc<str>)>,
}

/// What is being asked about.
pub(crate) struct Ask<'a> {
    /// The call asked about: with the run, it names the request, so a
    /// resumed run asks again under the same id.
    pub call_id: &'a str,
    pub tool: &'a str,
    pub args: &'a Value,
    /// What an "always" grants.
    pub grant: SessionGrant,
    /// Why the question is asked (the rule), shown to the person.
    pub reason: Option<String>,
}

/// The id of the question about `call_id` in `run_id`: the same in every
/// process (FNV-1a, not the std hasher, whose output may change between
/// Rust releases), so a resumed run asks again under the id a client
/// already holds.
pub(crate) fn request_id(run_id: &str, call_id: &str) -> String {
    let hash = crate::text::fnv1a(run_id.bytes().chain([0]).chain(call_id.bytes()));
    format!("perm_{hash:016x}")
}

impl PermissionGate {
    /// Whether an earlier "always" covers `grant`.
    pub(crate) fn is_granted(&self, grant: &SessionGrant) -> bool {
        lock(&self.grants).contains(grant)
    }

    /// Records a status change in the store, if any. A failure is logged,
    /// not fatal: the status is informative, the run goes on.
    async fn record(&self, status: RunStatus) {
        if let Some((store, run_id)) = &self.store {
            if let Err(err) = store.set_status(run_id, status).await {
                tracing::warn!(run_id = %run_id, error = %err, "could not record the run's status");
            }
        }
    }

    /// What a person's decision means for the call: an "always" is
    /// granted for the session from now on.
    fn settle(&self, decision: PermissionDecision, request: &Ask<'_>) -> (AskOutcome, PermissionDecision) {
        match decision {
            PermissionDecision::Allow => (AskOutcome::Allowed, decision),
            PermissionDecision::Always => {
                lock(&self.grants).insert(request.grant.clone());
                (AskOutcome::Allowed, decision)
            }
            PermissionDecision::Deny => (
                AskOutcome::Denied(format!(
                    "The user denied permission to run '{}'. Do not retry this call; ask the user or try another way.",
                    request.tool
                )),
                decision,
            ),
        }
    }

    /// Asks and waits for the reply, its own timeout, or a cancel. The run's
    /// clocks (run and step limits) stop meanwhile: a person's time is not
    /// the run's; the ask's own timeout bounds it.
    pub(crate) async fn ask(
        &self,
        request: Ask<'_>,
        events: &EventEmitter,
        turn: &TurnIds,
        ctx: &crate::context::RunContext,
    ) -> AskOutcome {
        if let Some(why) = &self.nobody_to_ask {
            return AskOutcome::Denied(format!(
                "Permission denied: '{}' needs approval, but nobody can approve it here ({why}). Do not retry it; find another way or tell the user what you need.",
                request.tool
            ));
        }
        let cancel = ctx.cancel_token();
        let request_id = request_id(ctx.run_id(), request.call_id);
        let (rx, answered) = match self.pending.expect(&request_id) {
            Expected::Waiting(rx) => (rx, false),
            Expected::Early(rx) => (rx, true),
            // Asked and settled in the log already: nobody is asked again,
            // and no client is shown the question twice.
            Expected::DecidedBefore(decision) => return self.settle(decision, &request).0,
        };
        let waiting_entry = WaitingEntry {
            pending: &self.pending,
            request_id: &request_id,
        };
        // The status is recorded before the question goes out, so whoever
        // sees the request finds the run WAITING_PERMISSION in the store
        // (not for a question answered already: it waits for nobody).
        let waiting = !answered
            && self.state.send_if_modified(|state| {
                state.own_status() == RunStatus::Running && state.set_own_status(RunStatus::WaitingPermission)
            });
        if waiting {
            self.record(RunStatus::WaitingPermission).await;
        }
        let person = ctx.wait_for_person();
        events.emit(
            turn,
            EventKind::PermissionRequest {
                request_id: request_id.clone(),
                tool: request.tool.to_string(),
                args: request.args.clone(),
                rule: request.reason.clone(),
            },
        );

        let timeout = async {
            match self.timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let (outcome, decision, reason) = tokio::select! {
            biased;
            _ = cancel.cancelled() => (AskOutcome::Cancelled, PermissionDecision::Deny, Some(Unanswered::Cancelled)),
            reply = rx => match reply {
                Ok(decision) => {
                    let (outcome, decision) = self.settle(decision, &request);
                    (outcome, decision, None)
                }
                Err(_) => (
                    AskOutcome::Denied(format!("Permission to run '{}' could not be asked for, so it was denied.", request.tool)),
                    PermissionDecision::Deny,
                    Some(Unanswered::NobodyToAsk),
                ),
            },
            _ = timeout => (
                AskOutcome::Denied(format!(
                    "Permission to run '{}' was not given in time, so it was denied. Do not retry this call; try another way or finish with what you have.",
                    request.tool
                )),
                PermissionDecision::Deny,
                Some(Unanswered::Timeout),
            ),
        };
        drop(person);
        drop(waiting_entry);
        if outcome == AskOutcome::Cancelled
            && matches!(ctx.stop_cause(), Some(crate::context::StopCause::Interrupted(_)))
        {
            // Not answered: the run stops resumably, and its resumed run asks
            // again under the same id, so the question stays open (no
            // `permission.resolved`) and an answer sent later applies.
            return outcome;
        }
        let resumed = self.state.send_if_modified(|state| {
            state.own_status() == RunStatus::WaitingPermission && state.set_own_status(RunStatus::Running)
        });
        if resumed {
            self.record(RunStatus::Running).await;
        }
        events.emit(
            turn,
            EventKind::PermissionResolved {
                request_id,
                tool: request.tool.to_string(),
                decision,
                reason,
            },
        );
        outcome
    }
}
