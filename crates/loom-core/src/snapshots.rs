//! Workspace snapshots, seen from the engine: a top-level run records the
//! workspace's files before its first tool call (step 0) and after each
//! step, so that a person can later rewind the workspace to any step or
//! fork from it ([`crate::rewind`]). The engine only says when; where the
//! files are and how they are kept is the implementation's (the
//! `loom-snapshot` crate). docs/rewind.md.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::fence::WriteFence;
use serde::{Deserialize, Serialize};

/// A snapshot that could not be recorded, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The run has no snapshot of that step (it was not recorded: the
    /// step did not complete, snapshots were off, or it was forgotten).
    #[error("run {run_id} has no snapshot of step {step}")]
    NotRecorded {
        /// The run.
        run_id: String,
        /// The step.
        step: u32,
    },
    /// Files the restore would change were changed outside Loom since it
    /// last recorded the workspace (or are files it holds no copy of).
    #[error("{} changed outside Loom since it last recorded the workspace: {}", if files.len() == 1 { "a file" } else { "files" }, files.join(", "))]
    ChangedOutside {
        /// Those files.
        files: Vec<String>,
    },
    /// The step was recorded in another workspace (another folder, or
    /// another machine's): a worker that took the run over worked there.
    #[error("step {step} of run {run_id} was recorded in another workspace ({workspace}): rewind it there")]
    Elsewhere {
        /// The run.
        run_id: String,
        /// The step.
        step: u32,
        /// Where (`MACHINE:PATH` in a cluster).
        workspace: String,
    },
    /// Runs are executing in the workspace (in this process or another
    /// of this machine), or another restore is under way: files restored
    /// now would be taken for their work.
    #[error("runs are executing in this workspace, or it is being restored: restore its files once they have ended")]
    InUse,
    /// A record of the snapshot is not one a restore writes (a path under
    /// `.git/`, a setuid mode, a content that is not what it claims — one
    /// written into the store by someone else than the workspace's scans,
    /// docs/rewind.md "Safety"): the whole restore is refused, nothing
    /// written. The text names the record.
    #[error("{0}")]
    Refused(String),
    /// The files could not be scanned, stored or written.
    #[error("{0}")]
    Failed(String),
}

crate::wire::wire_enum! {
    /// Why a file is left out of a snapshot (a rewind then neither restores
    /// nor removes it, and refuses to write over it without `force`).
    pub enum SkipReason {
        /// Larger than `[snapshots] max_file_bytes`.
        Size = "size",
        /// Redaction finds a secret in it: Loom keeps no copy.
        Secret = "secret",
        /// Loom may not read it.
        Unreadable = "unreadable",
    }
}

/// A file left out of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SkippedFile {
    /// Its path in the workspace.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Why.
    pub reason: SkipReason,
}

/// What one step changed in the workspace, as its snapshot recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFiles {
    /// Files created or changed (content or mode), `/`-separated paths
    /// relative to the workspace.
    pub changed: Vec<String>,
    /// Files removed.
    pub removed: Vec<String>,
    /// Files left out (for their size, a secret in them, or unreadable).
    pub skipped: Vec<SkippedFile>,
}

/// What restoring a snapshot changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestorePlan {
    /// Files written: created, changed back, or given their mode back.
    pub write: Vec<String>,
    /// Files removed: created after the snapshot.
    pub remove: Vec<String>,
    /// Files of the plan that are not as Loom last recorded them: someone
    /// changed them outside Loom, and a restore would lose that change.
    pub changed_outside: Vec<String>,
}

impl RestorePlan {
    /// Every path the restore touches, written ones first.
    pub fn paths(&self) -> impl Iterator<Item = &String> {
        self.write.iter().chain(&self.remove)
    }
}

/// Where a top-level run's workspace snapshots are recorded, and restored
/// from. Calls may block on files: implementations do that work off the
/// async threads.
#[async_trait]
pub trait WorkspaceSnapshots: Send + Sync {
    /// Records the workspace as it is now as `step` of `run_id` (again, if
    /// it was recorded before: a resumed run's step). With `fence` (the
    /// run's store is a worker's, under a lease) the record is refused
    /// once the lease was lost, checked as it is written.
    async fn record(&self, run_id: &str, step: u32, fence: Option<&WriteFence>) -> Result<StepFiles, SnapshotError>;

    /// Whether `step` of `run_id` is recorded.
    async fn recorded(&self, run_id: &str, step: u32) -> Result<bool, SnapshotError>;

    /// The steps of `run_id` recorded, in order.
    async fn steps(&self, run_id: &str) -> Result<Vec<u32>, SnapshotError>;

    /// The workspace `step` of `run_id` was recorded in, where the
    /// snapshots keep it (`MACHINE:PATH` in a cluster,
    /// [`crate::workspace_line`]): where its files can be restored.
    async fn recorded_in(&self, _run_id: &str, _step: u32) -> Result<Option<String>, SnapshotError> {
        Ok(None)
    }

    /// Holds the workspace for a run executing in it, until the returned
    /// guard is dropped: restores of it are refused meanwhile
    /// ([`SnapshotError::InUse`]), and one under way is waited for.
    async fn hold(&self) -> Result<Box<dyn std::any::Any + Send + Sync>, SnapshotError> {
        Ok(Box::new(()))
    }

    /// What `step` changed from the snapshot before it.
    async fn step_files(&self, run_id: &str, step: u32) -> Result<StepFiles, SnapshotError>;

    /// A file's content in the snapshot of `step` (`None`: it was not
    /// there).
    async fn file_at(&self, run_id: &str, step: u32, path: &str) -> Result<Option<Vec<u8>>, SnapshotError>;

    /// What restoring `step` of `run_id` would change in the workspace, or
    /// in `into` (a folder for a copy; only what it holds counts).
    async fn plan(&self, run_id: &str, step: u32, into: Option<&Path>) -> Result<RestorePlan, SnapshotError>;

    /// Restores `step` of `run_id` in the workspace (then the workspace's
    /// latest snapshot), or into the folder `into`. Every file is written
    /// under a temporary name and renamed; nothing outside the folder is
    /// followed or touched, nor its `.loom/`. Refused
    /// ([`SnapshotError::ChangedOutside`]) when files it would change were
    /// changed outside Loom, judged as it restores, unless `force`.
    async fn restore(
        &self,
        run_id: &str,
        step: u32,
        into: Option<&Path>,
        force: bool,
    ) -> Result<RestorePlan, SnapshotError>;

    /// The files the snapshots are kept in: Loom's state, which tools must
    /// not touch.
    fn files(&self) -> Vec<PathBuf>;
}
