//! Going back to a step of a run that is not executing, and branching
//! from it (docs/rewind.md).
//!
//! A step's point is the workspace as its snapshot recorded it
//! ([`crate::snapshots`]) and the conversation as of that step (the
//! history's length kept in the run's state, [`RunState::conversation_at`]).
//! **Rewind** restores the workspace, or makes the session continue from
//! that conversation, or both; **fork** starts a new session from it. The
//! rewound run's own record and history stay as they were: a rewind adds
//! `run.rewound` to its log, and the conversation goes on in a new run of
//! the same session (the *continuation*: a run that holds the history as of
//! the step and did nothing, `lifecycle.start` with `forkedFrom`, then
//! `lifecycle.end`), which is what the session's next run continues from.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::event::{Event, EventKind, ForkLink, TurnIds};
use crate::machine::RunState;
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::snapshots::{RestorePlan, SnapshotError, WorkspaceSnapshots};
use crate::status::RunStatus;
use crate::store::{Checkpoint, RunRecord, RunSnapshot, Store, StoreError};
use crate::turn_state::TurnState;

/// Why a rewind or a fork was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    /// The run is executing (or may be: its owner is alive).
    #[error("run {run_id} is {status}: it can be rewound or forked once it is not executing")]
    Executing {
        /// The run.
        run_id: String,
        /// Its status.
        status: &'static str,
    },
    /// A sub-agent's run: its steps are part of its parent's.
    #[error("run {run_id} is a sub-agent of run {parent}: rewind or fork {parent}")]
    SubAgent {
        /// The run.
        run_id: String,
        /// Its parent.
        parent: String,
    },
    /// The run has no such step.
    #[error("run {run_id} has steps 0 to {steps}; there is no step {step}")]
    NoStep {
        /// The run.
        run_id: String,
        /// The step asked for.
        step: u32,
        /// Its last step.
        steps: u32,
    },
    /// The conversation as of the step is not known: the history was
    /// compressed after it (or the run predates rewind).
    #[error("the conversation of run {run_id} as of step {step} is not kept (its history was compressed since); rewind the files only")]
    ConversationGone {
        /// The run.
        run_id: String,
        /// The step.
        step: u32,
    },
    /// The files were asked for and the agent records no snapshots.
    #[error("this agent records no workspace snapshots: files cannot be rewound")]
    NoSnapshots,
    /// Files the restore would change were changed outside Loom since it
    /// last recorded the workspace.
    #[error("{} changed outside Loom since it last recorded the workspace: {}; a rewind would lose that change (--force to rewind anyway)", if files.len() == 1 { "a file" } else { "files" }, files.join(", "))]
    ChangedOutside {
        /// Those files.
        files: Vec<String>,
    },
    /// A fork's copy goes into a folder that holds files.
    #[error("{0} is not empty: a fork's copy goes into a new or empty folder")]
    IntoNotEmpty(PathBuf),
    /// A fork's copy would go inside the workspace it copies.
    #[error("{0} is inside the workspace: a fork's copy goes elsewhere")]
    IntoWorkspace(PathBuf),
    /// Other runs are executing in the workspace: files restored under
    /// them would be taken for their work.
    #[error("run(s) {} are executing in this workspace: restore its files once they have ended", runs.join(", "))]
    Busy {
        /// Those runs.
        runs: Vec<String>,
    },
    /// The files were restored, but the rewind could not be recorded (the
    /// store failed): the run's log and the session do not show it.
    #[error("the files were restored ({} written, {} removed), but the rewind could not be recorded: {source}", restored.write.len(), restored.remove.len())]
    NotRecorded {
        /// What was restored.
        restored: RestorePlan,
        /// Why it could not be recorded.
        #[source]
        source: StoreError,
    },
    /// The snapshots failed.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The store failed (including an unknown run id).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to rewind.
#[derive(Debug, Clone)]
pub struct RewindRequest {
    /// The run.
    pub run_id: String,
    /// The step: 0 is before any tool ran (and before the run's prompt),
    /// N after the tools of step N.
    pub step: u32,
    /// Restore the workspace.
    pub files: bool,
    /// Make the session continue from the conversation as of the step.
    pub conversation: bool,
    /// Only say what would change.
    pub dry_run: bool,
    /// Restore files that were changed outside Loom too.
    pub force: bool,
}

/// What a rewind did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct RewindReport {
    /// The step.
    pub to_step: u32,
    /// The files restored (or that would be).
    pub plan: RestorePlan,
    /// The run the session now continues from (`None`: the conversation
    /// was not rewound, or a dry run).
    pub continued_by: Option<String>,
    /// The messages the conversation keeps (system prompt included).
    pub messages: usize,
    /// `run.rewound`, as stored in the run's log (`None` for a dry run).
    pub event: Option<Event>,
    /// Whether the run recorded snapshots to restore files from (a run
    /// whose model called no tool has none: its files are as they were).
    pub files_recorded: bool,
    /// The run was interrupted, and is now closed `CANCELED`: it would
    /// otherwise be resumed from past the point rewound to.
    pub closed: bool,
}

/// Rewinds a run that is not executing to `request.step`: the workspace
/// restored, the session continued from the conversation as of the step,
/// or both; `run.rewound` added to its log. Files changed outside Loom
/// since it last recorded the workspace refuse the rewind unless
/// `request.force`.
pub async fn rewind(
    store: &dyn Store,
    snapshots: Option<&dyn WorkspaceSnapshots>,
    request: &RewindRequest,
) -> Result<RewindReport, RewindError> {
    let mut run = stopped_run(store, &request.run_id).await?;
    let step = request.step;
    check_step(&run, step)?;
    let messages = if request.conversation {
        conversation_at(&run, step)?.len()
    } else {
        0
    };
    let files_recorded = match (request.files, snapshots) {
        (false, _) => false,
        (true, None) => return Err(RewindError::NoSnapshots),
        (true, Some(snapshots)) => !snapshots.steps(&request.run_id).await?.is_empty(),
    };
    let plan = match snapshots.filter(|_| files_recorded) {
        Some(snapshots) => {
            let plan = snapshots.plan(&request.run_id, step, None).await?;
            // A dry run lists them instead.
            if !request.force && !request.dry_run && !plan.changed_outside.is_empty() {
                return Err(RewindError::ChangedOutside {
                    files: plan.changed_outside,
                });
            }
            plan
        }
        None => RestorePlan::default(),
    };
    if files_recorded && !request.dry_run {
        refuse_while_others_execute(store, &run.run).await?;
    }
    if request.dry_run {
        return Ok(RewindReport {
            to_step: step,
            plan,
            messages,
            files_recorded,
            ..RewindReport::default()
        });
    }
    let closed = close_if_resumable(store, &mut run, step).await?;
    let plan = match snapshots.filter(|_| files_recorded) {
        Some(snapshots) => snapshots
            .restore(&request.run_id, step, None, request.force)
            .await
            .map_err(changed_outside)?,
        None => plan,
    };
    let not_recorded = |source: StoreError| RewindError::NotRecorded {
        restored: plan.clone(),
        source,
    };
    let continued_by = if request.conversation {
        let history = conversation_at(&run, step)?;
        let continuation = crate::turn_state::new_id();
        let link = ForkLink {
            run_id: request.run_id.clone(),
            step,
        };
        let prompt = format!("rewind of run {} to step {step}", request.run_id);
        seed_run(
            store,
            &run.run,
            &continuation,
            &run.run.session_id,
            &prompt,
            link,
            history,
        )
        .await
        .map_err(not_recorded)?;
        Some(continuation)
    } else {
        None
    };
    let files = plan.paths().cloned().collect();
    let event = append_to_log(
        store,
        &request.run_id,
        EventKind::RunRewound {
            to_step: step,
            files,
            continued_by: continued_by.clone(),
        },
    )
    .await
    .map_err(not_recorded)?;
    Ok(RewindReport {
        to_step: step,
        plan,
        continued_by,
        messages,
        event: Some(event),
        files_recorded,
        closed,
    })
}

/// Files are not restored under runs executing in the same workspace
/// (their owners alive, or on another machine): their next snapshot would
/// take the restore for their own work.
async fn refuse_while_others_execute(store: &dyn Store, run: &RunRecord) -> Result<(), RewindError> {
    let here = run.workspace.as_deref().map(canonical_dir);
    let runs: Vec<String> = store
        .active_runs()
        .await?
        .into_iter()
        .filter(|other| other.run_id != run.run_id && other.parent.is_none())
        .filter(|other| other.workspace.as_deref().map(canonical_dir) == here)
        .filter(|other| crate::owner::liveness(&other.owner) != crate::owner::Liveness::Dead)
        .map(|other| other.run_id)
        .collect();
    if runs.is_empty() {
        Ok(())
    } else {
        Err(RewindError::Busy { runs })
    }
}

fn canonical_dir(dir: &str) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| PathBuf::from(dir))
}

/// A run that could be resumed (interrupted, or left active by a dead
/// process) is closed `CANCELED` before it is rewound: resumed, it would go
/// on from past the point the workspace and the session went back to.
async fn close_if_resumable(store: &dyn Store, run: &mut RunSnapshot, step: u32) -> Result<bool, RewindError> {
    if run.run.status.is_terminal() {
        return Ok(false);
    }
    let run_id = run.run.run_id.clone();
    if run.run.status != RunStatus::Interrupted {
        store.mark_interrupted(&run_id, &run.run.owner).await?;
    }
    crate::recovery::close_cancelled(store, &run_id, &format!("rewound to step {step}")).await?;
    *run = store.load_run(&run_id).await?;
    Ok(true)
}

/// A snapshot's refusal as the rewind's own.
fn changed_outside(err: SnapshotError) -> RewindError {
    match err {
        SnapshotError::ChangedOutside { files } => RewindError::ChangedOutside { files },
        other => RewindError::Snapshot(other),
    }
}

/// What to fork.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The run.
    pub run_id: String,
    /// The step its conversation and workspace are taken from.
    pub step: u32,
    /// Restore the workspace as of the step into this new (or empty)
    /// folder instead of the workspace itself.
    pub into: Option<PathBuf>,
    /// Restore files that were changed outside Loom too (in the workspace).
    pub force: bool,
    /// Whether the files are restored at all (the agent may record no
    /// snapshots: then only the conversation is forked).
    pub files: bool,
}

/// A fork made ready: the files restored, the original's log told; what
/// the new session starts from. Start it with [`Fork::run_request`] and a
/// prompt, or keep it as it is with [`Fork::seed`].
#[derive(Debug, Clone)]
pub struct Fork {
    /// The new run's id.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Where it came from.
    pub link: ForkLink,
    /// The conversation it starts from (without a system prompt).
    pub history: Vec<Message>,
    /// The files restored.
    pub plan: RestorePlan,
    /// `run.forked`, as stored in the original's log.
    pub event: Event,
    /// Who the fork belongs to: the original's owner, unless the caller
    /// sets another (a gateway: the token that forked it).
    pub principal: Option<String>,
    original: RunRecord,
}

impl Fork {
    /// The request that starts the fork's first run with `prompt`.
    pub fn run_request(&self, prompt: impl Into<String>) -> crate::agent::RunRequest {
        crate::agent::RunRequest {
            prompt: prompt.into(),
            run_id: Some(self.run_id.clone()),
            session_id: Some(self.session_id.clone()),
            history: Some(self.history.clone()),
            principal: self.principal.clone(),
            forked_from: Some(self.link.clone()),
            ..Default::default()
        }
    }

    /// Records the fork as a run that holds the conversation and did
    /// nothing, for the new session's next run to continue from.
    pub async fn seed(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut history = vec![Message::system("")];
        history.extend(self.history.iter().cloned());
        let prompt = format!("fork of run {} at step {}", self.link.run_id, self.link.step);
        let original = RunRecord {
            principal: self.principal.clone(),
            ..self.original.clone()
        };
        seed_run(
            store,
            &original,
            &self.run_id,
            &self.session_id,
            &prompt,
            self.link.clone(),
            &history,
        )
        .await
    }
}

/// Forks a run that is not executing at `request.step`: its workspace as
/// of the step restored (in place, or into a new folder), `run.forked` in
/// its log, and what the new session starts from. The original run is
/// untouched.
pub async fn fork(
    store: &dyn Store,
    snapshots: Option<&dyn WorkspaceSnapshots>,
    request: &ForkRequest,
) -> Result<Fork, RewindError> {
    let run = stopped_run(store, &request.run_id).await?;
    let step = request.step;
    check_step(&run, step)?;
    let history = crate::history::without_system_prompt(conversation_at(&run, step)?.to_vec());
    if let Some(into) = &request.into {
        let holds_files = std::fs::read_dir(into).is_ok_and(|mut entries| entries.next().is_some());
        if holds_files {
            return Err(RewindError::IntoNotEmpty(into.clone()));
        }
        let workspace = run.run.workspace.as_deref().map(canonical_dir);
        if workspace.is_some_and(|workspace| canonical_into(into).starts_with(workspace)) {
            return Err(RewindError::IntoWorkspace(into.clone()));
        }
    } else if request.files {
        refuse_while_others_execute(store, &run.run).await?;
    }
    let plan = if request.files {
        let snapshots = snapshots.ok_or(RewindError::NoSnapshots)?;
        let into = request.into.as_deref();
        if into.is_none() && !request.force {
            let plan = snapshots.plan(&request.run_id, step, None).await?;
            if !plan.changed_outside.is_empty() {
                return Err(RewindError::ChangedOutside {
                    files: plan.changed_outside,
                });
            }
        }
        if let Some(into) = into {
            create_folder(into)?;
        }
        snapshots
            .restore(&request.run_id, step, into, request.force || into.is_some())
            .await
            .map_err(changed_outside)?
    } else {
        RestorePlan::default()
    };
    let run_id = crate::turn_state::new_id();
    let session_id = run_id.clone();
    let event = append_to_log(
        store,
        &request.run_id,
        EventKind::RunForked {
            step,
            fork_run_id: run_id.clone(),
            fork_session_id: session_id.clone(),
        },
    )
    .await?;
    Ok(Fork {
        link: ForkLink {
            run_id: request.run_id.clone(),
            step,
        },
        run_id,
        session_id,
        history,
        plan,
        event,
        principal: run.run.principal.clone(),
        original: run.run,
    })
}

/// The stored run, if it is not executing and is a top-level run.
async fn stopped_run(store: &dyn Store, run_id: &str) -> Result<RunSnapshot, RewindError> {
    let run = store.load_run(run_id).await?;
    if let Some(parent) = &run.run.parent {
        return Err(RewindError::SubAgent {
            run_id: run_id.to_string(),
            parent: parent.run_id.clone(),
        });
    }
    let status = run.run.status;
    let stopped = status.is_terminal()
        || status == RunStatus::Interrupted
        || crate::owner::liveness(&run.run.owner) == crate::owner::Liveness::Dead;
    if !stopped {
        return Err(RewindError::Executing {
            run_id: run_id.to_string(),
            status: status.as_str(),
        });
    }
    Ok(run)
}

fn check_step(run: &RunSnapshot, step: u32) -> Result<(), RewindError> {
    let steps = run.state.as_ref().map_or(0, RunState::steps);
    if step > steps {
        return Err(RewindError::NoStep {
            run_id: run.run.run_id.clone(),
            step,
            steps,
        });
    }
    Ok(())
}

/// The stored history (system prompt included) as of `step`.
fn conversation_at(run: &RunSnapshot, step: u32) -> Result<&[Message], RewindError> {
    run.state
        .as_ref()
        .and_then(|state| state.conversation_at(step))
        .and_then(|len| run.messages.get(..len))
        .ok_or_else(|| RewindError::ConversationGone {
            run_id: run.run.run_id.clone(),
            step,
        })
}

/// Where `into` is, resolved as far as it exists.
fn canonical_into(into: &Path) -> PathBuf {
    let mut existing = std::path::absolute(into).unwrap_or_else(|_| into.to_path_buf());
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(|name| name.to_os_string()), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
}

/// A new, empty folder for a fork's copy (it may exist if empty).
fn create_folder(into: &Path) -> Result<(), RewindError> {
    std::fs::create_dir_all(into).map_err(|err| {
        RewindError::Snapshot(SnapshotError::Failed(format!(
            "cannot create {}: {err}",
            into.display()
        )))
    })
}

/// Adds one event to the end of a stopped run's log, continuing its `seq`.
/// Two writers adding at once (two rewinds, a double click) would take the
/// same `seq`, and a store keeps the first: the event is read back, and
/// written again after the other when it is not the one stored.
async fn append_to_log(store: &dyn Store, run_id: &str, kind: EventKind) -> Result<Event, StoreError> {
    for _ in 0..8 {
        let run = store.load_run(run_id).await?;
        let state = run.next_turn().cloned().unwrap_or_else(|| TurnState::initial(1));
        let events = crate::recovery::quiet_emitter(run_id, run.last_seq);
        events.emit(&TurnIds::of(&state), kind.clone());
        let log = events.take_log();
        store.append_events(run_id, &log).await?;
        let Some(ours) = log.into_iter().next() else {
            break;
        };
        let stored = store.events_page(run_id, run.last_seq, 1).await?;
        if stored
            .first()
            .is_some_and(|event| event.seq == ours.seq && event.kind == ours.kind)
        {
            return Ok(ours);
        }
    }
    Err(StoreError::Backend(format!(
        "run {run_id}: its log kept changing; the event could not be added"
    )))
}

/// Records a run that holds `history` (system prompt first) and did
/// nothing: what the session `session_id` continues from.
async fn seed_run(
    store: &dyn Store,
    original: &RunRecord,
    run_id: &str,
    session_id: &str,
    prompt: &str,
    link: ForkLink,
    history: &[Message],
) -> Result<(), StoreError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    // Recorded `DONE` from its first write: no crash leaves it for a
    // recovery to resume (it would ask the model with nothing to do).
    let record = RunRecord {
        owner: crate::owner::this_process(),
        workspace: original.workspace.clone(),
        principal: original.principal.clone(),
        ..RunRecord::new(run_id, session_id, prompt, &original.model, RunStatus::Done, now_ms)
    };
    store.create_run(&record).await?;
    let mut state = RunState::new(TurnState::initial(0), prompt);
    // It can be rewound too: its step 0 is the whole conversation it holds.
    state.conversation_at.insert(0, history.len());
    let turn = TurnIds::of(state.turn());
    let events = crate::recovery::quiet_emitter(run_id, 0);
    events.emit(
        &turn,
        EventKind::LifecycleStart {
            prompt: prompt.to_string(),
            model: original.model.clone(),
            max_steps: 0,
            resumed: false,
            forked_from: Some(link),
            trace_parent: None,
            agent: None,
        },
    );
    events.emit(
        &turn,
        EventKind::LifecycleEnd {
            status: RunStatus::Done,
            content: None,
            metrics: RunMetrics::default(),
        },
    );
    store
        .checkpoint(&Checkpoint {
            run_id,
            state: &state,
            new_messages: history,
            replaced_history: None,
            events: &events.take_log(),
        })
        .await
}
