//! The rewinds a worker does for the gateways (docs/rewind.md): a run's
//! files are on the machine whose worker executed it, so a gateway puts a
//! rewind or a fork of them in the line of that machine's workspace, and
//! a worker serving that folder there takes it, does it with its own
//! snapshots, and answers.

use std::sync::Arc;
use std::time::Duration;

use loom_core::WorkspaceJobs;

use super::Worker;

/// How often the line is looked at when it was empty.
const LOOK_EVERY: Duration = Duration::from_millis(200);

impl Worker {
    /// Takes and does the jobs of this worker's workspace, one at a time,
    /// until aborted.
    pub(super) async fn serve_jobs(&self, jobs: Arc<dyn WorkspaceJobs>) {
        let agent = loop {
            match self.agents.get(None, None, loom_core::Mode::Default).await {
                Ok(agent) => break agent,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot build the agent that rewinds this workspace's files; trying again");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        let line = loom_core::workspace_line(&loom_core::owner::this_machine(), agent.workspace());
        loop {
            match jobs.next_job(&line).await {
                Ok(Some(job)) => {
                    // No run is taken while the files are restored, and
                    // none of this worker's may be executing.
                    let _alone = self.claiming.write().await;
                    let snapshots = agent.snapshots().map(|snapshots| snapshots.as_ref());
                    let answer = crate::service::rewind::carry_out(
                        &job.body,
                        self.store.as_ref(),
                        snapshots,
                        self.keeper.count(),
                    )
                    .await;
                    tracing::info!(job = %job.id, "a rewind of this workspace's files was done for a gateway");
                    if let Err(err) = jobs.answer(&job.id, &answer).await {
                        tracing::warn!(error = %err, job = %job.id, "cannot answer a rewind");
                    }
                }
                Ok(None) => tokio::time::sleep(LOOK_EVERY).await,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read this workspace's line of rewinds");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
