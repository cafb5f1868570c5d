//! `run.rewind` and `run.fork` (docs/rewind.md): a run that is not
//! executing taken back to a step, or a new session started from one. The
//! work is `loom_core::rewind`'s; this checks who may, and does it where
//! the run's workspace is: here, for a gateway that executes its runs, or
//! — when `loom worker` processes execute them — by a worker of the
//! machine that holds the workspace, asked through the cluster's store
//! ([`loom_core::WorkspaceJobs`]). A fork's prompt then starts as any run.

use std::sync::Arc;
use std::time::Duration;

use loom_core::rewind::{ForkRequest, RewindError, RewindRequest};
use loom_core::{JobOutcome, Mode, RunRecord, Store, StoreError, WorkspaceSnapshots};
use serde::{Deserialize, Serialize};

use super::{store_error, Service};
use crate::auth::Principal;
use crate::error::{ApiError, Code};
use crate::protocol::{FileParams, ForkParams, Forked, RewindParams, Rewound, SnapshotFile, StartRun};

/// The most of a file `run.file` gives.
const FILE_LIMIT: usize = 256 * 1024;

/// How long a gateway waits for a worker of the workspace's machine to
/// take a rewind, and then again for its answer.
const WORKER_PATIENCE: Duration = Duration::from_secs(10);

/// What a gateway asks a worker of the workspace's machine to do.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "camelCase")]
pub(crate) enum FilesJob {
    /// `run.rewind`, as asked (its checks of who may were made).
    Rewind {
        /// The request.
        params: RewindParams,
    },
    /// `run.fork` without its prompt (the gateway starts that).
    Fork {
        /// The run.
        run_id: String,
        /// The step.
        step: u32,
        /// Restore files changed outside Loom too.
        force: bool,
        /// The new session's owner.
        principal: String,
    },
}

/// A worker's answer to a [`FilesJob`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum FilesAnswer {
    /// The rewind's.
    Rewound(Rewound),
    /// The fork's.
    Forked(ForkedHere),
    /// Refused or failed.
    Refused {
        /// The code the client gets.
        code: Code,
        /// Why.
        message: String,
    },
}

/// A fork made where the workspace is: the new session seeded.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ForkedHere {
    session_id: String,
    fork_run_id: String,
    write: Vec<String>,
    remove: Vec<String>,
}

/// Does `job` with this process's store and snapshots (a worker's, on the
/// workspace's machine, which executes `executing` runs now and takes no
/// other meanwhile): the answer, as JSON.
pub(crate) async fn carry_out(
    body: &str,
    store: &dyn Store,
    snapshots: Option<&dyn WorkspaceSnapshots>,
    executing: usize,
) -> String {
    let job = serde_json::from_str::<FilesJob>(body);
    let restores = match &job {
        Ok(FilesJob::Rewind { params }) => params.files && !params.dry_run,
        Ok(FilesJob::Fork { .. }) => snapshots.is_some(),
        Err(_) => false,
    };
    let answer = match job {
        // The store's check sees runs once they are recorded as running;
        // this worker's own include those still starting.
        _ if restores && executing > 0 => FilesAnswer::Refused {
            code: Code::InvalidState,
            message: format!(
                "{executing} run(s) are executing in this workspace: rewind its files once they have ended"
            ),
        },
        Err(err) => FilesAnswer::Refused {
            code: Code::Internal,
            message: format!("the worker cannot read the job: {err}"),
        },
        Ok(FilesJob::Rewind { params }) => match rewind_here(store, snapshots, params).await {
            Ok(rewound) => FilesAnswer::Rewound(rewound),
            Err(err) => refusal(err),
        },
        Ok(FilesJob::Fork {
            run_id,
            step,
            force,
            principal,
        }) => match fork_here(store, snapshots, &run_id, step, force, &principal).await {
            Ok(forked) => FilesAnswer::Forked(forked),
            Err(err) => refusal(err),
        },
    };
    serde_json::to_string(&answer).unwrap_or_else(|err| {
        format!(r#"{{"refused":{{"code":"INTERNAL","message":"the answer could not be written: {err}"}}}}"#)
    })
}

fn refusal(err: ApiError) -> FilesAnswer {
    FilesAnswer::Refused {
        code: err.code,
        message: err.message,
    }
}

/// A rewind where the workspace is.
async fn rewind_here(
    store: &dyn Store,
    snapshots: Option<&dyn WorkspaceSnapshots>,
    params: RewindParams,
) -> Result<Rewound, ApiError> {
    let request = RewindRequest {
        run_id: params.run_id.clone(),
        step: params.step,
        files: params.files,
        conversation: params.conversation,
        dry_run: params.dry_run,
        force: params.force,
    };
    let report = loom_core::rewind::rewind(store, snapshots, &request)
        .await
        .map_err(refused)?;
    Ok(Rewound {
        run_id: params.run_id,
        to_step: report.to_step,
        dry_run: params.dry_run,
        write: report.plan.write,
        remove: report.plan.remove,
        changed_outside: report.plan.changed_outside,
        continued_by: report.continued_by,
    })
}

/// A fork where the workspace is, its new session `principal`'s and
/// seeded with the conversation.
async fn fork_here(
    store: &dyn Store,
    snapshots: Option<&dyn WorkspaceSnapshots>,
    run_id: &str,
    step: u32,
    force: bool,
    principal: &str,
) -> Result<ForkedHere, ApiError> {
    let request = ForkRequest {
        run_id: run_id.to_string(),
        step,
        into: None,
        force,
        files: snapshots.is_some(),
    };
    let mut fork = loom_core::rewind::fork(store, snapshots, &request)
        .await
        .map_err(refused)?;
    // The new session is the forking token's (an admin forking another's
    // run starts its own session).
    fork.principal = Some(principal.to_string());
    // The new session's first run holds the conversation; a prompt is the
    // session's next run, which continues from it.
    fork.seed(store).await.map_err(store_error)?;
    Ok(ForkedHere {
        session_id: fork.session_id,
        fork_run_id: fork.run_id,
        write: fork.plan.write,
        remove: fork.plan.remove,
    })
}

impl Service {
    /// `run.rewind`.
    pub async fn rewind(&self, principal: &Principal, params: RewindParams) -> Result<Rewound, ApiError> {
        principal.may_change("rewind runs")?;
        if !params.files && !params.conversation {
            return Err(ApiError::new(
                Code::InvalidParams,
                "a rewind of neither the files nor the conversation changes nothing",
            ));
        }
        let (store, record) = self.visible_run(principal, &params.run_id).await?;
        if params.files {
            self.refuse_others_later_work(principal, store.as_ref(), &record)
                .await?;
        }
        if self.on_workers() {
            if !params.files {
                // The conversation alone is the store's: any gateway may.
                return rewind_here(store.as_ref(), None, params).await;
            }
            let step = params.step;
            return match self.on_its_machine(&record, step, FilesJob::Rewind { params }).await? {
                FilesAnswer::Rewound(rewound) => Ok(rewound),
                other => Err(unexpected(other)),
            };
        }
        let snapshots = self.local_snapshots(&record).await?;
        if params.files && !params.dry_run {
            self.refuse_while_executing()?;
        }
        rewind_here(store.as_ref(), snapshots.as_deref(), params).await
    }

    /// `run.fork`.
    pub async fn fork(&self, principal: &Principal, params: ForkParams) -> Result<Forked, ApiError> {
        principal.may_change("fork runs")?;
        let (store, record) = self.visible_run(principal, &params.run_id).await?;
        self.refuse_others_later_work(principal, store.as_ref(), &record)
            .await?;
        let forked = if self.on_workers() {
            let job = FilesJob::Fork {
                run_id: params.run_id.clone(),
                step: params.step,
                force: params.force,
                principal: principal.name().to_string(),
            };
            match self.on_its_machine(&record, params.step, job).await? {
                FilesAnswer::Forked(forked) => forked,
                other => return Err(unexpected(other)),
            }
        } else {
            let snapshots = self.local_snapshots(&record).await?;
            self.refuse_while_executing()?;
            fork_here(
                store.as_ref(),
                snapshots.as_deref(),
                &params.run_id,
                params.step,
                params.force,
                principal.name(),
            )
            .await?
        };
        let started = match params.prompt {
            Some(prompt) => Some(
                self.start(
                    principal,
                    StartRun {
                        prompt,
                        session_id: Some(forked.session_id.clone()),
                        model: None,
                        max_steps: None,
                        tools: None,
                        mode: None,
                        idempotency_key: None,
                        on_busy: None,
                        traceparent: params.traceparent,
                    },
                )
                .await?,
            ),
            None => None,
        };
        Ok(Forked {
            run_id: params.run_id,
            step: params.step,
            session_id: forked.session_id,
            fork_run_id: forked.fork_run_id,
            write: forked.write,
            remove: forked.remove,
            started,
        })
    }

    /// Has a worker of the machine that holds the workspace `step` of
    /// `record`'s run was recorded in do `job` (the files are there), and
    /// waits for its answer.
    async fn on_its_machine(&self, record: &RunRecord, step: u32, job: FilesJob) -> Result<FilesAnswer, ApiError> {
        let Some(cluster) = self.inner.cluster.as_ref() else {
            return Err(ApiError::new(Code::InvalidState, "this gateway has no workers"));
        };
        // Where the step's snapshot was taken (a run taken over by a worker
        // of another folder has steps in both); else where the run started.
        let recorded_in = match self.gateway_agent().await?.snapshots() {
            Some(snapshots) => snapshots
                .recorded_in(&record.run_id, step)
                .await
                .map_err(|err| ApiError::internal("cannot read the run's snapshots", err))?,
            None => None,
        };
        let line = match (recorded_in, record.workspace.as_deref()) {
            (Some(line), _) => line,
            (None, Some(workspace)) if !record.owner.is_empty() => loom_core::workspace_line(
                loom_core::owner::machine_of(&record.owner),
                std::path::Path::new(workspace),
            ),
            _ => {
                return Err(ApiError::new(
                    Code::InvalidState,
                    format!("run {} has no recorded workspace to rewind", record.run_id),
                ))
            }
        };
        let machine = line.split(':').next().unwrap_or_default().to_string();
        let body =
            serde_json::to_string(&job).map_err(|err| ApiError::internal("cannot write the worker's job", err))?;
        let outcome = cluster
            .jobs
            .ask(&line, &body, WORKER_PATIENCE)
            .await
            .map_err(store_error)?;
        match outcome {
            JobOutcome::Answered(answer) => match serde_json::from_str::<FilesAnswer>(&answer) {
                Ok(FilesAnswer::Refused { code, message }) => Err(ApiError::new(code, message)),
                Ok(answer) => Ok(answer),
                Err(err) => Err(ApiError::internal("a worker's answer is unreadable", err)),
            },
            JobOutcome::NotTaken => Err(ApiError::new(
                Code::Unavailable,
                format!(
                    "no worker of the machine that holds run {}'s workspace ({}) took the rewind within {} s; nothing was changed",
                    record.run_id,
                    machine,
                    WORKER_PATIENCE.as_secs()
                ),
            )
            .retry_after(Duration::from_secs(5))),
            JobOutcome::Unanswered => Err(ApiError::new(
                Code::Unavailable,
                format!(
                    "a worker took the rewind of run {} and did not answer in time: it may have happened — run {}'s log tells (run.rewound, run.forked)",
                    record.run_id, record.run_id
                ),
            )),
        }
    }

    /// `run.file`: a file as the snapshot of a step holds it.
    pub async fn snapshot_file(&self, principal: &Principal, params: FileParams) -> Result<SnapshotFile, ApiError> {
        let (_, record) = self.visible_run(principal, &params.run_id).await?;
        // Snapshots kept in the cluster's store are read by run, from any
        // gateway; a gateway's own only for runs of its workspace.
        let snapshots = match self.on_workers() {
            true => self.gateway_agent().await?.snapshots().cloned(),
            false => self.local_snapshots(&record).await?,
        };
        let Some(snapshots) = snapshots else {
            return Err(ApiError::new(
                Code::InvalidState,
                "this gateway records no workspace snapshots",
            ));
        };
        let content = snapshots
            .file_at(&params.run_id, params.step, &params.path)
            .await
            .map_err(|err| match err {
                loom_core::SnapshotError::NotRecorded { .. } => ApiError::new(Code::InvalidParams, err.to_string()),
                other => ApiError::internal("cannot read the snapshot", other),
            })?;
        let exists = content.is_some();
        let truncated = content.as_ref().is_some_and(|bytes| bytes.len() > FILE_LIMIT);
        let content = content.and_then(|mut bytes| {
            if bytes.len() > FILE_LIMIT {
                bytes.truncate(FILE_LIMIT);
                // Cut at a character boundary.
                while !bytes.is_empty() && std::str::from_utf8(&bytes).is_err() && bytes.len() > FILE_LIMIT - 4 {
                    bytes.pop();
                }
            }
            String::from_utf8(bytes).ok()
        });
        Ok(SnapshotFile {
            run_id: params.run_id,
            step: params.step,
            path: params.path,
            exists,
            content,
            truncated,
        })
    }

    /// The workspace is shared by every token's runs: going back to a step
    /// of one token's run would undo (and name) what other tokens' later
    /// runs did. Only an admin may.
    async fn refuse_others_later_work(
        &self,
        principal: &Principal,
        store: &dyn loom_core::Store,
        record: &RunRecord,
    ) -> Result<(), ApiError> {
        if principal.role() == crate::auth::Role::Admin {
            return Ok(());
        }
        let later = store
            .list_runs(1000)
            .await
            .map_err(store_error)?
            .into_iter()
            .filter(|other| other.started_ms > record.started_ms && other.parent.is_none())
            .filter(|other| other.workspace == record.workspace)
            .any(|other| other.principal != record.principal);
        if later {
            return Err(ApiError::new(
                Code::InvalidState,
                format!(
                    "other tokens' runs worked in this workspace after run {}: its files can be rewound by an admin",
                    record.run_id
                ),
            ));
        }
        Ok(())
    }

    /// Files are not restored under a run that is working in the same
    /// workspace (any token's): its next tool call would find them changed
    /// under it, and its next snapshot would take the restore for its own.
    fn refuse_while_executing(&self) -> Result<(), ApiError> {
        let registry = self.registry();
        let busy = registry.runs.values().filter(|run| !run.status().is_terminal()).count();
        if busy > 0 {
            return Err(ApiError::new(
                Code::InvalidState,
                format!(
                    "{busy} run(s) are executing in this gateway's workspace: rewind its files once they have ended"
                ),
            ));
        }
        Ok(())
    }

    /// The store and the record of `run_id`, once the principal may see it.
    async fn visible_run(&self, principal: &Principal, run_id: &str) -> Result<(Arc<dyn Store>, RunRecord), ApiError> {
        let Some(store) = self.inner.store.clone() else {
            return Err(ApiError::new(
                Code::InvalidState,
                "this gateway keeps no store: its runs cannot be rewound",
            ));
        };
        let record = match store.load_run(run_id).await {
            Ok(snapshot) => snapshot.run,
            Err(StoreError::NotFound(_)) => return Err(ApiError::no_run(run_id)),
            Err(err) => return Err(store_error(err)),
        };
        if !principal.reaches_owner(record.principal.as_deref()) {
            return Err(ApiError::no_run(run_id));
        }
        Ok((store, record))
    }

    /// The gateway's default agent.
    async fn gateway_agent(&self) -> Result<loom_core::Agent, ApiError> {
        self.inner
            .agents
            .get(None, None, Mode::Default)
            .await
            .map_err(|err| ApiError::internal("cannot build the gateway's agent", err))
    }

    /// The snapshots of this gateway's workspace, for a run that worked
    /// in it: another's snapshot restored here would remove every file it
    /// did not hold.
    async fn local_snapshots(&self, record: &RunRecord) -> Result<Option<Arc<dyn WorkspaceSnapshots>>, ApiError> {
        let agent = self.gateway_agent().await?;
        let here = record
            .workspace
            .as_deref()
            .and_then(|dir| std::path::Path::new(dir).canonicalize().ok())
            .is_some_and(|dir| dir == agent.workspace());
        if !here {
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {} worked in another workspace than this gateway's", record.run_id),
            ));
        }
        Ok(agent.snapshots().cloned())
    }
}

/// An answer of another kind than the job's.
fn unexpected(answer: FilesAnswer) -> ApiError {
    ApiError::internal("a worker answered another job", format!("{answer:?}"))
}

/// A refusal the client can act on, or the store's failure.
fn refused(err: RewindError) -> ApiError {
    match err {
        RewindError::Store(StoreError::NotFound(id)) => ApiError::no_run(&id),
        RewindError::Store(err) => store_error(err),
        RewindError::NotRecorded { .. } => ApiError::internal("the rewind could not be recorded", err),
        RewindError::Executing { .. } | RewindError::ChangedOutside { .. } | RewindError::Busy { .. } => {
            ApiError::new(Code::InvalidState, err.to_string())
        }
        RewindError::Snapshot(loom_core::SnapshotError::Failed(_)) => ApiError::internal("the rewind failed", err),
        RewindError::Snapshot(loom_core::SnapshotError::InUse | loom_core::SnapshotError::Elsewhere { .. }) => {
            ApiError::new(Code::InvalidState, err.to_string())
        }
        RewindError::NoSnapshots | RewindError::ConversationGone { .. } | RewindError::SubAgent { .. } => {
            ApiError::new(Code::InvalidState, err.to_string())
        }
        other => ApiError::new(Code::InvalidParams, other.to_string()),
    }
}
