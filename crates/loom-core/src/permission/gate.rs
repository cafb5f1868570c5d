//! Asking a person: `permission.request`, a wait for the reply through the
//! `RunHandle`, `permission.resolved`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::control::PermissionDecision;
use crate::event::{EventEmitter, EventKind, TurnIds, Unanswered};
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
pub type SessionGrants = Arc<Mutex<HashSet<String>>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Pending requests of one run, shared by the run and its controller.
#[derive(Debug, Default)]
pub(crate) struct PendingRequests {
    waiting: Mutex<HashMap<String, oneshot::Sender<PermissionDecision>>>,
}

impl PendingRequests {
    /// Delivers a reply. `false` when no such request is waiting.
    pub(crate) fn answer(&self, request_id: &str, decision: PermissionDecision) -> bool {
        match lock(&self.waiting).remove(request_id) {
            Some(sender) => sender.send(decision).is_ok(),
            None => false,
        }
    }
}

/// The ask machinery of one run.
#[derive(Clone)]
pub(crate) struct PermissionGate {
    pub pending: Arc<PendingRequests>,
    pub grants: SessionGrants,
    pub timeout: Option<Duration>,
    pub status_tx: Arc<watch::Sender<RunStatus>>,
    /// Where `WAITING_PERMISSION` is recorded, so other processes see it.
    pub store: Option<(Arc<dyn crate::store::Store>, Arc<str>)>,
}

/// What is being asked about.
pub(crate) struct AskRequest<'a> {
    /// The call asked about: with the run, it names the request, so a
    /// resumed run asks again under the same id.
    pub call_id: &'a str,
    pub tool: &'a str,
    pub args: &'a Value,
    /// What an "always" grants: `tool:NAME` or `rule:PATTERN`.
    pub grant_key: String,
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
    /// Whether an earlier "always" covers `grant_key`.
    pub(crate) fn is_granted(&self, grant_key: &str) -> bool {
        lock(&self.grants).contains(grant_key)
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

    /// Asks and waits for the reply, its own timeout, or a cancel. The run's
    /// clocks (run and step limits) stop meanwhile: a person's time is not
    /// the run's; the ask's own timeout bounds it.
    pub(crate) async fn ask(
        &self,
        request: AskRequest<'_>,
        events: &EventEmitter,
        turn: &TurnIds,
        ctx: &crate::context::RunContext,
    ) -> AskOutcome {
        let cancel = ctx.cancel_token();
        let request_id = request_id(ctx.run_id(), request.call_id);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending.waiting).insert(request_id.clone(), tx);
        // The status is recorded before the question goes out, so whoever
        // sees the request finds the run WAITING_PERMISSION in the store.
        let waiting = self.status_tx.send_if_modified(|status| {
            let waiting = *status == RunStatus::Running;
            if waiting {
                *status = RunStatus::WaitingPermission;
            }
            waiting
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
                Ok(PermissionDecision::Allow) => (AskOutcome::Allowed, PermissionDecision::Allow, None),
                Ok(PermissionDecision::Always) => {
                    lock(&self.grants).insert(request.grant_key.clone());
                    (AskOutcome::Allowed, PermissionDecision::Always, None)
                }
                Ok(PermissionDecision::Deny) => (
                    AskOutcome::Denied(format!("The user denied permission to run '{}'. Do not retry this call; ask the user or try another way.", request.tool)),
                    PermissionDecision::Deny,
                    None,
                ),
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
        lock(&self.pending.waiting).remove(&request_id);
        if outcome == AskOutcome::Cancelled
            && matches!(ctx.stop_cause(), Some(crate::context::StopCause::Interrupted(_)))
        {
            // Not answered: the run stops resumably, and its resumed run asks
            // again under the same id, so the question stays open (no
            // `permission.resolved`) and an answer sent later applies.
            return outcome;
        }
        let resumed = self.status_tx.send_if_modified(|status| {
            let resumed = *status == RunStatus::WaitingPermission;
            if resumed {
                *status = RunStatus::Running;
            }
            resumed
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
