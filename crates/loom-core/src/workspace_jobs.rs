//! Work on a workspace's files that only a process on its machine can do
//! — a rewind's or a fork's restore (docs/rewind.md) — asked by a gateway
//! whose runs `loom worker` processes execute elsewhere (docs/cluster.md).
//! The gateway hands the job to the workspace's line in the shared store;
//! any worker of that machine serving that folder takes it, does it, and
//! answers.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::StoreError;

/// What became of a job handed over ([`WorkspaceJobs::ask`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// A process did it and answered.
    Answered(String),
    /// No process took it in time: it was withdrawn, and will never be done.
    NotTaken,
    /// A process took it and did not answer in time: it may have been done.
    Unanswered,
}

/// A job taken from a workspace's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceJob {
    /// Its id, to answer it by.
    pub id: String,
    /// What to do (the asker's JSON).
    pub body: String,
}

/// The lines of workspace jobs, kept by a store several processes share.
#[async_trait]
pub trait WorkspaceJobs: Send + Sync {
    /// Hands `body` to a process serving `workspace` ([`workspace_line`])
    /// and waits for its answer: at most `patience` for a process to take
    /// it (after which it is withdrawn), and then at most `patience` again
    /// for the answer.
    async fn ask(&self, workspace: &str, body: &str, patience: Duration) -> Result<JobOutcome, StoreError>;

    /// The next job in `workspace`'s line, if one waits.
    async fn next_job(&self, workspace: &str) -> Result<Option<WorkspaceJob>, StoreError>;

    /// Answers job `id` (the asker may have stopped waiting: the answer is
    /// then dropped after a while).
    async fn answer(&self, id: &str, answer: &str) -> Result<(), StoreError>;
}

/// The line of the workspace at `path` on `machine` (as
/// [`crate::owner::this_machine`] names it): a run's is that of the
/// machine its owner ran on ([`crate::owner::machine_of`]) and the folder
/// it worked in.
pub fn workspace_line(machine: &str, path: &Path) -> String {
    format!("{machine}:{}", path.display())
}
