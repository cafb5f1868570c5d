//! `run.rewind` and `run.fork` (docs/rewind.md): a run that is not
//! executing taken back to a step, or a new session started from one. The
//! work is `loom_core::rewind`'s; this checks who may, finds the
//! gateway's snapshots and store, and starts a fork's prompt as any run.

use loom_core::rewind::{ForkRequest, RewindError, RewindRequest};
use loom_core::{Mode, StoreError, WorkspaceSnapshots};

use super::{store_error, Service};
use crate::auth::Principal;
use crate::error::{ApiError, Code};
use crate::protocol::{FileParams, ForkParams, Forked, RewindParams, Rewound, SnapshotFile, StartRun};

/// The most of a file `run.file` gives.
const FILE_LIMIT: usize = 256 * 1024;

impl Service {
    /// `run.rewind`.
    pub async fn rewind(&self, principal: &Principal, params: RewindParams) -> Result<Rewound, ApiError> {
        principal.may_change("rewind runs")?;
        let (store, snapshots) = self.rewindable(principal, &params.run_id).await?;
        if params.files {
            self.refuse_others_later_work(principal, store.as_ref(), &params.run_id)
                .await?;
        }
        if params.files && !params.dry_run {
            self.refuse_while_executing()?;
        }
        let request = RewindRequest {
            run_id: params.run_id.clone(),
            step: params.step,
            files: params.files,
            conversation: params.conversation,
            dry_run: params.dry_run,
            force: params.force,
        };
        let report = loom_core::rewind::rewind(store.as_ref(), snapshots.as_deref(), &request)
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

    /// `run.fork`.
    pub async fn fork(&self, principal: &Principal, params: ForkParams) -> Result<Forked, ApiError> {
        principal.may_change("fork runs")?;
        let (store, snapshots) = self.rewindable(principal, &params.run_id).await?;
        self.refuse_others_later_work(principal, store.as_ref(), &params.run_id)
            .await?;
        self.refuse_while_executing()?;
        let request = ForkRequest {
            run_id: params.run_id.clone(),
            step: params.step,
            into: None,
            force: params.force,
            files: snapshots.is_some(),
        };
        let mut fork = loom_core::rewind::fork(store.as_ref(), snapshots.as_deref(), &request)
            .await
            .map_err(refused)?;
        // The new session is the forking token's (an admin forking
        // another's run starts its own session).
        fork.principal = Some(principal.name().to_string());
        // The new session's first run holds the conversation; a prompt is
        // the session's next run, which continues from it.
        fork.seed(store.as_ref()).await.map_err(store_error)?;
        let started = match params.prompt {
            Some(prompt) => Some(
                self.start(
                    principal,
                    StartRun {
                        prompt,
                        session_id: Some(fork.session_id.clone()),
                        model: None,
                        max_steps: None,
                        tools: None,
                        mode: None,
                        idempotency_key: None,
                        on_busy: None,
                    },
                )
                .await?,
            ),
            None => None,
        };
        Ok(Forked {
            run_id: params.run_id,
            step: params.step,
            session_id: fork.session_id,
            fork_run_id: fork.run_id,
            write: fork.plan.write,
            remove: fork.plan.remove,
            started,
        })
    }

    /// `run.file`: a file as the snapshot of a step holds it.
    pub async fn snapshot_file(&self, principal: &Principal, params: FileParams) -> Result<SnapshotFile, ApiError> {
        let (_, snapshots) = self.rewindable(principal, &params.run_id).await?;
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
        run_id: &str,
    ) -> Result<(), ApiError> {
        if principal.role() == crate::auth::Role::Admin {
            return Ok(());
        }
        let record = store.load_run(run_id).await.map_err(store_error)?.run;
        let later = store
            .list_runs(1000)
            .await
            .map_err(store_error)?
            .into_iter()
            .filter(|other| other.started_ms > record.started_ms && other.parent.is_none())
            .any(|other| other.principal != record.principal);
        if later {
            return Err(ApiError::new(
                Code::InvalidState,
                format!("other tokens' runs worked in this workspace after run {run_id}: its files can be rewound by an admin"),
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

    /// The store and snapshots to rewind `run_id` with, once the
    /// principal may see it and the gateway executes runs itself.
    async fn rewindable(
        &self,
        principal: &Principal,
        run_id: &str,
    ) -> Result<
        (
            std::sync::Arc<dyn loom_core::Store>,
            Option<std::sync::Arc<dyn WorkspaceSnapshots>>,
        ),
        ApiError,
    > {
        if self.on_workers() {
            return Err(ApiError::new(
                Code::InvalidState,
                "rewind and fork are not available when workers execute the runs (docs/rewind.md)",
            ));
        }
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
        let agent = self
            .inner
            .agents
            .get(None, None, Mode::Default)
            .await
            .map_err(|err| ApiError::internal("cannot build the gateway's agent", err))?;
        // Only a run of this gateway's workspace: another's snapshot restored
        // here would remove every file it did not hold.
        let here = record
            .workspace
            .as_deref()
            .and_then(|dir| std::path::Path::new(dir).canonicalize().ok())
            .is_some_and(|dir| dir == agent.workspace());
        if !here {
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} worked in another workspace than this gateway's"),
            ));
        }
        Ok((store, agent.snapshots().cloned()))
    }
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
        RewindError::NoSnapshots | RewindError::ConversationGone { .. } | RewindError::SubAgent { .. } => {
            ApiError::new(Code::InvalidState, err.to_string())
        }
        other => ApiError::new(Code::InvalidParams, other.to_string()),
    }
}
