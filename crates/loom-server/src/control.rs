//! How the gateway reaches a run it admitted, wherever the run executes:
//! the engine's [`RunController`] for a run in this process; for a run in
//! a `loom worker` (docs/server.md), a message through Redis to the worker
//! that holds it. The registry keeps one per run and never knows which.

use loom_core::{ControlError, PermissionDecision, RunController};

/// The controls of one live run.
pub trait RunControl: Send + Sync {
    /// Stops the run: it ends `CANCELED` once its model stream and tools
    /// have stopped.
    fn cancel(&self, reason: &str);
    /// Stops the run for a shutdown: it checkpoints and stays `INTERRUPTED`
    /// for the next start to resume.
    fn interrupt(&self, reason: &str);
    /// A user message that joins the run at its next turn.
    fn steer(&self, message: String) -> Result<(), ControlError>;
    /// A person's answer to one of the run's asks.
    fn respond_permission(&self, request_id: &str, decision: PermissionDecision) -> Result<(), ControlError>;
}

impl RunControl for RunController {
    fn cancel(&self, reason: &str) {
        RunController::cancel(self, reason);
    }

    fn interrupt(&self, reason: &str) {
        RunController::interrupt(self, reason);
    }

    fn steer(&self, message: String) -> Result<(), ControlError> {
        RunController::steer(self, message)
    }

    fn respond_permission(&self, request_id: &str, decision: PermissionDecision) -> Result<(), ControlError> {
        RunController::respond_permission(self, request_id, decision)
    }
}
