//! The engine: `tt` handles one turn, the driver trampolines it.

mod driver;
mod model_call;
mod turn;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::context::RunContext;
use crate::event::EventEmitter;
use crate::llm::Llm;
use crate::metrics::{Pricing, RunMetrics};
use crate::permission::PermissionGate;
use crate::pipeline::ToolPipeline;
use crate::status::RunStatus;

pub use turn::{StopReason, TimeoutKind, TurnOutcome};

/// What every run of one agent shares.
pub(crate) struct Engine {
    pub llm: Arc<dyn Llm>,
    pub pipeline: ToolPipeline,
    pub system_prompt: String,
    pub pricing: Option<Pricing>,
}

/// The state of one run while it executes. Owned by the run's task.
pub(crate) struct Run {
    pub engine: Arc<Engine>,
    pub ctx: RunContext,
    pub workspace: Arc<Path>,
    pub events: EventEmitter,
    pub steer_rx: mpsc::UnboundedReceiver<String>,
    pub pause_rx: watch::Receiver<bool>,
    pub status_tx: Arc<watch::Sender<RunStatus>>,
    pub gate: PermissionGate,
    pub metrics: RunMetrics,
    /// Tool turns completed (seed 004's `step`).
    pub steps: u32,
}

impl Run {
    /// Steering messages that arrived since the last turn boundary.
    pub(crate) fn take_steering(&mut self) -> Vec<String> {
        let mut messages = Vec::new();
        while let Ok(message) = self.steer_rx.try_recv() {
            messages.push(message);
        }
        messages
    }
}
