//! What a person sends a live run between turns: steering messages and
//! pause; and the status the run shows them.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::context::RunContext;
use crate::live_state::LiveState;
use crate::status::RunStatus;

/// The run's end of its controller's channels.
pub(crate) struct Controls {
    pub steer_rx: mpsc::UnboundedReceiver<String>,
    pub pause_rx: watch::Receiver<bool>,
    /// Where the run shows its status.
    pub state: Arc<watch::Sender<LiveState>>,
}

impl Controls {
    /// Steering messages that arrived since the last turn boundary.
    pub(crate) fn take_steering(&mut self) -> Vec<String> {
        let mut messages = Vec::new();
        while let Ok(message) = self.steer_rx.try_recv() {
            messages.push(message);
        }
        messages
    }

    /// Waits while the run is paused. Returns false when cancelled meanwhile.
    pub(crate) async fn wait_while_paused(&mut self, ctx: &RunContext) -> bool {
        if !*self.pause_rx.borrow() {
            return true;
        }
        // A paused run waits for a person: its clocks stop meanwhile.
        let _person = ctx.wait_for_person();
        while *self.pause_rx.borrow_and_update() {
            tokio::select! {
                biased;
                _ = ctx.cancel_token().cancelled() => return false,
                changed = self.pause_rx.changed() => {
                    if changed.is_err() {
                        // Nobody can resume us any more; carry on.
                        return true;
                    }
                }
            }
        }
        true
    }

    /// Shows the run's status to its controllers.
    pub(crate) fn show(&self, status: RunStatus) {
        self.state.send_if_modified(|state| state.set_own_status(status));
    }
}
