//! How the gateway reaches a run it admitted, wherever the run executes:
//! the engine's [`RunController`] for a run in this process (the one kind
//! there is today; a run in another process would be reached through a
//! message). One way to command a run, one way to observe it; the
//! registry keeps one per run and never knows which kind.

use loom_core::{Control, ControlError, LiveState, RunController};
use tokio::sync::watch;

/// The controls and the state of one live run.
pub trait RunControl: Send + Sync {
    /// Tells the run something: cancel, interrupt, pause, unpause, steer,
    /// or a person's answer to one of its asks.
    fn send(&self, control: Control) -> Result<(), ControlError>;
    /// What the run shows of itself now: status, asks waiting (its
    /// sub-agents' included), usage, last `seq`.
    fn state(&self) -> LiveState;
    /// The same, as it changes.
    fn watch_state(&self) -> watch::Receiver<LiveState>;
}

impl RunControl for RunController {
    fn send(&self, control: Control) -> Result<(), ControlError> {
        RunController::send(self, control)
    }

    fn state(&self) -> LiveState {
        RunController::state(self)
    }

    fn watch_state(&self) -> watch::Receiver<LiveState> {
        RunController::watch_state(self)
    }
}
