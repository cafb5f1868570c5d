//! The workspace recorded around a top-level run's tool calls: step 0
//! before its first call, each step after its calls returned — so a
//! person can rewind to any of them (docs/rewind.md). A snapshot that
//! fails costs that point, never the run; the next one reads the
//! workspace again, so it misses nothing the failed one saw.

use std::sync::Arc;

use crate::event::{EventKind, TurnIds};
use crate::outcome::WarningCode;
use crate::snapshots::WorkspaceSnapshots;

use super::Driver;

impl Driver {
    /// The snapshots a run records: a top-level run's, when the agent
    /// has them (a sub-agent's changes are in its parent's step).
    fn recording_snapshots(&self) -> Option<Arc<dyn WorkspaceSnapshots>> {
        self.engine.snapshots.clone().filter(|_| self.parent.is_none())
    }

    /// The workspace held for a top-level run recording snapshots, while
    /// it executes (a restore under way is waited for first); a hold that
    /// fails costs only that protection.
    pub(super) async fn hold_workspace(&self) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let snapshots = self.recording_snapshots()?;
        match snapshots.hold().await {
            Ok(held) => Some(held),
            Err(err) => {
                tracing::warn!(run_id = %self.ctx.run_id(), error = %err, "cannot hold the workspace against restores");
                None
            }
        }
    }

    /// Before the calls of the run's first step: step 0, unless it was
    /// recorded already (a resumed run, whose files may have changed since).
    pub(super) async fn snapshot_before_first_step(&self, steps: u32, turn: &TurnIds) {
        let Some(snapshots) = self.recording_snapshots().filter(|_| steps == 0) else {
            return;
        };
        match snapshots.recorded(self.ctx.run_id(), 0).await {
            Ok(true) => {}
            Ok(false) => self.record_snapshot(snapshots.as_ref(), 0, turn).await,
            Err(err) => self.snapshot_failed(0, &err, turn),
        }
    }

    /// After the calls of `step` returned (and only when the step counts:
    /// a stopped turn's calls are settled again on resume).
    pub(super) async fn snapshot_after_step(&self, step: u32, turn: &TurnIds) {
        if let Some(snapshots) = self.recording_snapshots() {
            self.record_snapshot(snapshots.as_ref(), step, turn).await;
        }
    }

    /// After the calls of a step that did not count (the run stopped while
    /// they ran): recorded without an event, so the files the calls
    /// changed are known to be Loom's — a rewind does not take them for a
    /// person's — though the step cannot be rewound to. A resumed run
    /// records the step again when it completes.
    pub(super) async fn snapshot_stopped_step(&self, step: u32) {
        let Some(snapshots) = self.recording_snapshots() else {
            return;
        };
        if let Err(err) = snapshots
            .record(self.ctx.run_id(), step, self.store.write_fence().as_ref())
            .await
        {
            tracing::warn!(run_id = %self.ctx.run_id(), step, error = %err, "cannot record the workspace after a stopped step");
        }
    }

    /// Records `step`, then tells it: the event follows the stored snapshot.
    async fn record_snapshot(&self, snapshots: &dyn WorkspaceSnapshots, step: u32, turn: &TurnIds) {
        let began = std::time::Instant::now();
        match snapshots
            .record(self.ctx.run_id(), step, self.store.write_fence().as_ref())
            .await
        {
            Ok(files) => self.events.emit(
                turn,
                EventKind::SnapshotRecorded {
                    step,
                    changed: files.changed,
                    removed: files.removed,
                    skipped: files.skipped,
                    duration_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                },
            ),
            Err(err) => self.snapshot_failed(step, &err, turn),
        }
    }

    fn snapshot_failed(&self, step: u32, err: &crate::snapshots::SnapshotError, turn: &TurnIds) {
        tracing::warn!(run_id = %self.ctx.run_id(), step, error = %err, "cannot record the workspace");
        self.events.emit(
            turn,
            EventKind::Warning {
                code: WarningCode::SnapshotFailed,
                message: format!(
                    "the workspace could not be recorded as step {step}, which cannot be rewound to: {err}"
                ),
            },
        );
    }
}
