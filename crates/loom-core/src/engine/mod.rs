//! The engine: `tt` handles one turn, the driver trampolines it.

mod context;
mod driver;
mod guidance;
mod model_call;
mod turn;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::context::RunContext;
use crate::event::EventEmitter;
use crate::feedback::{MonitorConfig, RecursionMonitor, TaskHandler};
use crate::llm::Llm;
use crate::memory::MemoryConfig;
use crate::metrics::{Pricing, RunMetrics};
use crate::permission::PermissionGate;
use crate::pipeline::ToolPipeline;
use crate::retrieval::Retriever;
use crate::status::RunStatus;
use crate::tokens::TokenCounter;

pub use turn::{StopReason, TimeoutKind, TurnOutcome};

/// What every run of one agent shares.
pub(crate) struct Engine {
    pub llm: Arc<dyn Llm>,
    pub pipeline: ToolPipeline,
    pub system_prompt: String,
    pub pricing: Option<Pricing>,
    pub context: ContextSettings,
    /// Where runs are made durable, if anywhere.
    pub store: Option<Arc<dyn crate::store::Store>>,
    /// Who runs them (recorded with each run).
    pub owner: String,
    /// How many times an answer cut off by the output limit is continued.
    pub max_continuations: u32,
    /// Loom's own state, which tools must not touch.
    pub protected: Arc<[std::path::PathBuf]>,
}

/// Context machinery of an agent: memory, compression, feedback, assembly.
pub(crate) struct ContextSettings {
    pub memory: MemoryConfig,
    pub counter: Arc<dyn TokenCounter>,
    /// The model that writes summaries (default: the run's model).
    pub summarizer: Option<Arc<dyn Llm>>,
    /// Whether guidance (feedback and the monitor's warnings) is written for
    /// the next request.
    pub feedback: bool,
    pub task_handlers: Vec<Arc<dyn TaskHandler>>,
    pub monitor: MonitorConfig,
    pub retriever: Option<Arc<dyn Retriever>>,
    pub retrieval_limit: usize,
    /// Directories searched for LOOM.md / AGENTS.md.
    pub instruction_dirs: Vec<std::path::PathBuf>,
    /// Token budget of the assembled system prompt.
    pub system_budget: usize,
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
    /// The user's request, for guidance.
    pub task: String,
    pub monitor: RecursionMonitor,
    /// Whether the context warning was given since the last compression.
    pub context_warned: bool,
    /// Tokens of the tool definitions (they do not change during a run).
    pub tools_tokens: Option<usize>,
    /// An upper bound of the same in bytes.
    pub tools_bound: Option<usize>,
    /// Guidance for the next model request (never stored in the history).
    pub guidance: Vec<guidance::GuidancePart>,
    /// Every tool-call id of the run's history, so a new call never reuses one.
    pub call_ids: std::collections::HashSet<String>,
}

impl Run {
    /// Remembers the call ids of `messages` (a history the run starts from).
    pub(crate) fn remember_call_ids(&mut self, messages: &[crate::message::Message]) {
        for message in messages {
            for call in message.tool_calls() {
                self.call_ids.insert(call.id.clone());
            }
        }
    }

    /// Steering messages that arrived since the last turn boundary.
    pub(crate) fn take_steering(&mut self) -> Vec<String> {
        let mut messages = Vec::new();
        while let Ok(message) = self.steer_rx.try_recv() {
            messages.push(message);
        }
        messages
    }
}
