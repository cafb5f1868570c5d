//! The driver: the one place a run does IO. It asks the turn machine
//! ([`crate::machine`]) what to do next — begin a turn, call the model,
//! run the calls, end the turn, checkpoint, finish or stop — does it with
//! the model, the tool pipeline, the event stream and the store, and
//! reports the result back. See docs/architecture.md.

mod children;
mod controls;
mod driver;
pub(crate) mod event_log;
mod model_call;
mod named_files;
mod run_hooks;
mod snapshots;
mod tools;
mod window;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use crate::budget::{BudgetKind, BudgetNode};
use crate::context::RunContext;
use crate::emitter::EventEmitter;
use crate::llm::Llm;
use crate::machine;
use crate::memory::MemoryConfig;
use crate::metrics::Pricing;
use crate::permission::PermissionGate;
use crate::pipeline::ToolPipeline;
use crate::retrieval::Retriever;
use crate::store::{JournalEntry, ParentLink, Store};
use crate::tokens::TokenCounter;
use tokio_util::task::TaskTracker;

pub(crate) use controls::Controls;
pub(crate) use driver::Start;
pub(crate) use event_log::EventLog;

/// What every run of one agent shares. Cloned (cheaply: the parts are
/// shared) for an agent that records elsewhere ([`crate::Agent::with_store`]).
#[derive(Clone)]
pub(crate) struct Engine {
    pub llm: Arc<dyn Llm>,
    /// Other models by name, for sub-agents defined with their own.
    pub models: Option<Arc<dyn crate::model_source::ModelSource>>,
    /// The agent's tools (fixed and from sources); a sub-agent's run gets
    /// a subset.
    pub tools: Arc<crate::tool_source::ToolSet>,
    /// How runs start sub-agents.
    pub sub_agents: SubAgentSettings,
    pub system_prompt: String,
    pub pricing: Option<Pricing>,
    pub context: ContextSettings,
    /// Asked at a run's start, prompt and end (tool calls: the pipeline).
    pub lifecycle_hooks: Option<Arc<dyn crate::hooks::LifecycleHooks>>,
    /// How many times stop hooks may send a run back.
    pub stop_refusals: u32,
    /// Where top-level runs record their workspace after each step.
    pub snapshots: Option<Arc<dyn crate::snapshots::WorkspaceSnapshots>>,
    /// Sees every run's events as they become visible.
    pub observer: Option<Arc<dyn crate::observe::EventObserver>>,
    /// Where runs are made durable, if anywhere.
    pub store: Option<Arc<dyn Store>>,
    /// Who runs them (recorded with each run).
    pub owner: String,
    /// What the turn machine decides by.
    pub machine: machine::Settings,
    /// Loom's own state, which tools must not touch.
    pub protected: Arc<[std::path::PathBuf]>,
    /// Configuration tools may read but not change.
    pub read_only: Arc<[std::path::PathBuf]>,
}

/// How the runs of an agent start sub-agents (the `task` tool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubAgentSettings {
    /// Levels of sub-agents below a top-level run: a run at this depth is
    /// not offered the `task` tool (default 2).
    pub max_depth: u32,
    /// Sub-agents of one run running at once; more wait (default 4).
    pub max_running: usize,
    /// A sub-agent's step limit when its caller gives none (default 10).
    pub default_steps: u32,
}

impl Default for SubAgentSettings {
    fn default() -> Self {
        Self {
            max_depth: 2,
            max_running: 4,
            default_steps: 10,
        }
    }
}

/// Context machinery of an agent: memory, compression, retrieval, assembly.
#[derive(Clone)]
pub(crate) struct ContextSettings {
    pub memory: MemoryConfig,
    pub counter: Arc<dyn TokenCounter>,
    /// The model that writes summaries (default: the run's model).
    pub summarizer: Option<Arc<dyn Llm>>,
    pub retriever: Option<Arc<dyn Retriever>>,
    pub retrieval_limit: usize,
    /// Sections added after the base prompt.
    pub sections: Vec<SystemSection>,
    /// Directories searched for LOOM.md / AGENTS.md.
    pub instruction_dirs: Vec<std::path::PathBuf>,
    /// Token budget of the assembled system prompt.
    pub system_budget: usize,
}

/// A section of the system prompt given by the builder.
#[derive(Debug, Clone)]
pub(crate) struct SystemSection {
    pub name: String,
    pub text: String,
    /// Only for runs offered this tool.
    pub tool: Option<String>,
    /// Kept whole whatever the prompt's budget (else cut first).
    pub critical: bool,
}

/// The IO side of one run. Owned by the run's task; its state lives in the
/// turn machine the driver is handed.
pub(crate) struct Driver {
    pub engine: Arc<Engine>,
    pub ctx: RunContext,
    pub workspace: Arc<Path>,
    /// The engine's store, or one that keeps nothing: one path either way.
    pub store: Arc<dyn Store>,
    pub events: EventEmitter,
    /// Where the emitter's events are stored before the run's stream gets them.
    pub log: EventLog,
    pub controls: Controls,
    pub gate: PermissionGate,
    pub caches: Caches,
    /// The budgets this run was warned about (each once).
    pub budget_warned: Vec<BudgetKind>,
    /// The tools this run offers and runs (the agent's, or a sub-agent's subset).
    pub tools: Arc<ToolPipeline>,
    /// Sub-agents running at once (shared by the calls of this run).
    pub child_slots: Arc<tokio::sync::Semaphore>,
    /// This run's budgets in its run tree.
    pub budget: Arc<BudgetNode>,
    /// Where this run hangs in its run tree, if it is a sub-agent.
    pub parent: Option<ParentLink>,
    /// Its sub-agents' tasks: a run ends only after they have.
    pub children: TaskTracker,
    /// The current turn's time limit (a sub-agent gets no more).
    pub step_deadline: Option<crate::context::Deadline>,
    /// Who the run belongs to (a server token's name); its sub-agents too.
    pub principal: Option<String>,
    /// The client's trace context the run tree was started with (told in
    /// `lifecycle.start`); its sub-agents carry it too.
    pub trace_parent: Option<crate::trace_context::TraceParent>,
    /// A sub-agent defined in a file: its instructions, added to the
    /// system prompt (docs/agents.md).
    pub instructions: Option<Arc<str>>,
    /// That agent's name, told in `lifecycle.start`.
    pub agent_name: Option<Arc<str>>,
}

/// What the driver works out once and reuses.
#[derive(Default)]
pub(crate) struct Caches {
    /// The server refused a request that required a tool call: later
    /// retries of this run do not require one.
    pub tool_choice_refused: bool,
    /// Tokens of the tool definitions (they do not change during a run).
    pub tools_tokens: Option<usize>,
    /// An upper bound of the same in bytes.
    pub tools_bound: Option<usize>,
    /// Every tool-call id of the run's history, so a new call never reuses one.
    pub call_ids: HashSet<String>,
    /// The journal of a resumed run, for the calls its crash cut short.
    pub journal: Vec<JournalEntry>,
    /// The last `tool.result` a resumed run's log holds for each call, as
    /// (status, content): a call the crash cut short after its journaled
    /// result was told (before the checkpoint) is settled with that result
    /// and not told again. Only that very result counts: a call's log may
    /// hold an earlier one (`cancelled` before it ran, then run again).
    pub logged_results: HashMap<String, (crate::tool_result::ToolStatus, String)>,
}

impl Caches {
    /// Remembers the call ids of `messages` (a history the run starts from).
    pub(crate) fn remember_call_ids(&mut self, messages: &[crate::message::Message]) {
        for message in messages {
            for call in message.tool_calls() {
                self.call_ids.insert(call.id.clone());
            }
        }
    }
}
