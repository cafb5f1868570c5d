//! What is done with stored runs outside a live run: recovery of runs whose
//! process died, the conversation a session continues from, and cancelling
//! a run no process executes. See docs/architecture.md.

use crate::emitter::EventEmitter;
use crate::event::{Event, EventKind, TurnIds};
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::status::RunStatus;
use crate::store::{RunRecord, RunSnapshot, Store, StoreError};
use crate::turn_state::TurnState;

/// Marks every active run whose owner process is known to be dead as
/// `INTERRUPTED` (docs/architecture.md, run status) and returns their ids. Runs owned by live
/// processes or by other hosts are left alone; a cluster's workers are processes of this
/// kind too, so their runs are spared with [`recover_interrupted_runs_except`].
pub async fn recover_interrupted_runs(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    recover_interrupted_runs_except(store, |_| false).await
}

/// As [`recover_interrupted_runs`], leaving alone the runs `spared` names:
/// those a cluster's workers execute, whose leases hand them on (a run
/// parked for a person outlives the worker that parked it).
pub async fn recover_interrupted_runs_except(
    store: &dyn Store,
    spared: impl Fn(&RunRecord) -> bool,
) -> Result<Vec<String>, StoreError> {
    let mut interrupted = Vec::new();
    for run in store.active_runs().await? {
        if !spared(&run)
            && crate::owner::liveness(&run.owner) == crate::owner::Liveness::Dead
            && store.mark_interrupted(&run.run_id, &run.owner).await?
        {
            interrupted.push(run.run_id);
        }
    }
    Ok(interrupted)
}

/// The conversation so far of a session, to continue it: the history of
/// its latest run without its system prompt (a new run writes its own),
/// with any call that run left without a result closed (see
/// [`crate::resume::close_dangling`]). Empty for a new session.
pub async fn session_history(store: &dyn Store, session_id: &str) -> Result<Vec<Message>, StoreError> {
    // The latest run that wrote anything: a run whose process died before
    // its first checkpoint holds no messages.
    for run in store.session_runs(session_id).await?.iter().rev() {
        let snapshot = store.load_run(&run.run_id).await?;
        if snapshot.messages.is_empty() {
            continue;
        }
        let mut messages = crate::history::without_system_prompt(snapshot.messages);
        crate::resume::close_dangling(&mut messages, &snapshot.journal);
        return Ok(messages);
    }
    Ok(Vec::new())
}

/// Cancels a stored run that no process executes (`QUEUED`, or
/// `INTERRUPTED` after its process died): its event log is closed with
/// `execution.cancelled` and `lifecycle.end`, continuing its `seq`, so the
/// log ends like every other run's; returns those two events. A run a
/// live process executes must be cancelled through that process instead.
pub async fn close_cancelled(store: &dyn Store, run_id: &str, reason: &str) -> Result<Vec<Event>, StoreError> {
    let snapshot = store.load_run(run_id).await?;
    let state = snapshot.next_turn().cloned().unwrap_or_else(|| TurnState::initial(1));
    let log = cancelled_log(
        run_id,
        snapshot.last_seq,
        &TurnIds::of(&state),
        reason,
        &snapshot.run.metrics,
    );
    store
        .finish_run(run_id, RunStatus::Canceled, None, &snapshot.run.metrics, &log)
        .await?;
    Ok(log)
}

/// The end of the log of a run cancelled while no process executes it:
/// `execution.cancelled` with `reason`, then `lifecycle.end` (`CANCELED`),
/// numbered after `last_seq` — so its log ends like every other run's.
pub fn cancelled_log(run_id: &str, last_seq: u64, turn: &TurnIds, reason: &str, metrics: &RunMetrics) -> Vec<Event> {
    let events = quiet_emitter(run_id, last_seq);
    events.emit(
        turn,
        EventKind::ExecutionCancelled {
            reason: reason.to_string(),
        },
    );
    events.emit(
        turn,
        EventKind::LifecycleEnd {
            status: RunStatus::Canceled,
            content: None,
            metrics: metrics.clone(),
        },
    );
    events.take_log()
}

/// An emitter for a run no process executes: its events, numbered after
/// `last_seq`, only go to its log (nobody listens).
pub(crate) fn quiet_emitter(run_id: &str, last_seq: u64) -> EventEmitter {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    EventEmitter::new(run_id.into(), 0, tx)
        .continuing_after(last_seq)
        .with_log()
}

/// Why a stored run could not be resumed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The agent has no store to resume from.
    #[error("this agent has no store: build it with .store(...) to resume runs")]
    NoStore,
    /// The run's owner still runs it (or may: it is on another host).
    #[error("run {run_id} is {status} and its owner ({owner}) may still be running it")]
    StillRunning {
        /// The run.
        run_id: String,
        /// Its status.
        status: &'static str,
        /// Its owner.
        owner: String,
    },
    /// The run ended already, or is not in a resumable state.
    #[error("run {run_id} is {status}: only an interrupted run can be resumed")]
    NotResumable {
        /// The run.
        run_id: String,
        /// Its status.
        status: &'static str,
    },
    /// The run went on in another process after it was made ready to
    /// resume here ([`crate::Agent::prepare_resume`]): make it ready again.
    #[error("run {run_id} changed since it was made ready to resume; prepare it again")]
    Changed {
        /// The run.
        run_id: String,
    },
    /// The run is a sub-agent's: it resumes with its parent, which knows
    /// its tools and budgets.
    #[error("run {run_id} is a sub-agent of run {parent}: resume {parent}, which resumes it")]
    SubAgent {
        /// The run.
        run_id: String,
        /// Its parent.
        parent: String,
    },
    /// The store failed (including an unknown run id).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Whether a stored run can be resumed now: `INTERRUPTED`, or active with
/// an owner process that is gone. Reads only; [`take_over`] decides.
pub fn check_resumable(record: &RunRecord) -> Result<(), ResumeError> {
    match record.status {
        RunStatus::Interrupted => Ok(()),
        RunStatus::Queued | RunStatus::Running | RunStatus::WaitingPermission => {
            if crate::owner::liveness(&record.owner) == crate::owner::Liveness::Dead {
                Ok(())
            } else {
                Err(ResumeError::StillRunning {
                    run_id: record.run_id.clone(),
                    status: record.status.as_str(),
                    owner: record.owner.clone(),
                })
            }
        }
        status => Err(ResumeError::NotResumable {
            run_id: record.run_id.clone(),
            status: status.as_str(),
        }),
    }
}

/// Takes a stored run over to resume it in this process (`owner`): an
/// `INTERRUPTED` run, or an active one whose owner is dead. Of two
/// processes taking the same run, one gets it.
pub async fn take_over(store: &dyn Store, run_id: &str, owner: &str) -> Result<RunSnapshot, ResumeError> {
    let record = store.load_run(run_id).await?.run;
    check_resumable(&record)?;
    if record.status != RunStatus::Interrupted && !store.mark_interrupted(run_id, &record.owner).await? {
        return Err(ResumeError::StillRunning {
            run_id: run_id.to_string(),
            status: record.status.as_str(),
            owner: record.owner,
        });
    }
    store.reclaim_run(run_id, owner).await?;
    Ok(store.load_run(run_id).await?)
}

/// The trace context a run's log tells: its first `lifecycle.start`'s
/// (told again when the run resumes).
pub fn trace_parent_told_in(log: &[Event]) -> Option<crate::trace_context::TraceParent> {
    log.iter().find_map(|event| match &event.kind {
        EventKind::LifecycleStart { trace_parent, .. } => Some(*trace_parent),
        _ => None,
    })?
}
