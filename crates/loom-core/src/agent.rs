//! `Agent` and its builder: the library's front door.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::budget::BudgetNode;
use crate::context::{Limits, RunContext};
use crate::emitter::EventEmitter;
use crate::engine::{Caches, ContextSettings, Controls, Driver, Engine, EventLog, Start, SubAgentSettings};
use crate::feedback::{MonitorConfig, TaskHandler};
use crate::handle::{RunController, RunHandle};
use crate::hooks::{LifecycleHooks, ToolHook};
use crate::live_state::{LiveState, RunStream};
use crate::llm::Llm;
use crate::machine;
use crate::memory::MemoryConfig;
use crate::metrics::Pricing;
use crate::permission::{GrantsBySession, PendingAsks, PermissionGate, PermissionPolicy, SessionGrants};
use crate::pipeline::{PipelineConfig, Redactor, ToolPipeline};
pub use crate::recovery::ResumeError;
use crate::retrieval::Retriever;
use crate::store::{NoStore, Store};
use crate::tokens::{TiktokenCounter, TokenCounter};
use crate::tool::{DynTool, RegistryError, ToolRegistry};

/// Why an agent could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No model was given.
    #[error("no model: call .model(...) on the builder")]
    MissingModel,
    /// A tool could not be registered.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// The workspace directory is unusable.
    #[error("workspace {path}: {source}")]
    Workspace {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A limit makes no sense.
    #[error("invalid limit: {0}")]
    InvalidLimit(String),
}

/// The instructions every run starts with, unless replaced.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are Loom, an agent that completes the user's task \
in the workspace with the tools provided: call them to look at files, change them and run commands, \
and when the task is done, answer in a few plain sentences. Paths are relative to the workspace root.";

/// Builds an [`Agent`].
pub struct AgentBuilder {
    llm: Option<Arc<dyn Llm>>,
    models: Option<Arc<dyn crate::model_source::ModelSource>>,
    tools: Vec<Arc<dyn DynTool>>,
    tool_sources: Vec<Arc<dyn crate::tool_source::ToolSource>>,
    hooks: Vec<Arc<dyn ToolHook>>,
    lifecycle_hooks: Option<Arc<dyn LifecycleHooks>>,
    stop_refusals: u32,
    snapshots: Option<Arc<dyn crate::snapshots::WorkspaceSnapshots>>,
    observer: Option<Arc<dyn crate::observe::EventObserver>>,
    policy: PermissionPolicy,
    permission_timeout: Option<Duration>,
    nobody_to_ask: Option<Arc<str>>,
    pipeline: PipelineConfig,
    redactor: Option<Redactor>,
    pricing: Option<Pricing>,
    sub_agents: SubAgentSettings,
    system_prompt: Option<String>,
    limits: Limits,
    workspace: Option<PathBuf>,
    memory: MemoryConfig,
    counter: Option<Arc<dyn TokenCounter>>,
    summarizer: Option<Arc<dyn Llm>>,
    feedback: bool,
    task_handlers: Vec<Arc<dyn TaskHandler>>,
    monitor: MonitorConfig,
    retriever: Option<Arc<dyn Retriever>>,
    retrieval_limit: usize,
    project_instructions: bool,
    instruction_dirs: Vec<PathBuf>,
    sections: Vec<crate::engine::SystemSection>,
    system_budget: Option<usize>,
    store: Option<Arc<dyn Store>>,
    owner: Option<String>,
    max_continuations: u32,
    protected: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
}

impl Default for AgentBuilder {
    fn default() -> Self {
        Self {
            llm: None,
            models: None,
            tools: Vec::new(),
            tool_sources: Vec::new(),
            hooks: Vec::new(),
            lifecycle_hooks: None,
            stop_refusals: 1,
            snapshots: None,
            observer: None,
            policy: PermissionPolicy::default(),
            permission_timeout: Some(Duration::from_secs(300)),
            nobody_to_ask: None,
            pipeline: PipelineConfig::default(),
            redactor: None,
            pricing: None,
            sub_agents: SubAgentSettings::default(),
            system_prompt: None,
            limits: Limits::default(),
            workspace: None,
            memory: MemoryConfig::default(),
            counter: None,
            summarizer: None,
            feedback: true,
            task_handlers: Vec::new(),
            monitor: MonitorConfig::default(),
            retriever: None,
            retrieval_limit: 5,
            project_instructions: true,
            instruction_dirs: Vec::new(),
            sections: Vec::new(),
            system_budget: None,
            store: None,
            owner: None,
            max_continuations: 3,
            protected: Vec::new(),
            read_only: Vec::new(),
        }
    }
}

impl AgentBuilder {
    /// The model the agent talks to.
    pub fn model(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The model, already shared.
    pub fn model_arc(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Adds a tool (any [`crate::tool::Tool`] or [`DynTool`]).
    pub fn tool(mut self, tool: impl DynTool) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Adds tools that are already shared.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn DynTool>>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Adds tools that may change between turns (an MCP server's): a
    /// top-level run offers the source's tools as they are before each
    /// model call.
    pub fn tool_source(mut self, source: Arc<dyn crate::tool_source::ToolSource>) -> Self {
        self.tool_sources.push(source);
        self
    }

    /// The permission policy (default: allow everything — the embedding
    /// application decides what its tools may do).
    pub fn permissions(mut self, policy: PermissionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long an `ask` waits for an answer before it counts as a deny
    /// (default 300 s); `None` to wait as long as the run lives.
    pub fn permission_timeout(mut self, limit: Option<Duration>) -> Self {
        self.permission_timeout = limit;
        self
    }

    /// Declares that nobody can answer this agent's asks (a terminal
    /// program without a terminal): every `ask` is denied at once, and the
    /// model reads `why`.
    pub fn nobody_to_ask(mut self, why: impl Into<String>) -> Self {
        self.nobody_to_ask = Some(why.into().into());
        self
    }

    /// Adds a hook that runs before and after every tool call. Hooks run in
    /// the order they are added, before the permission policy.
    pub fn hook(mut self, hook: impl ToolHook) -> Self {
        self.hooks.push(Arc::new(hook));
        self
    }

    /// Hooks asked at the six points of every run (docs/extending.md):
    /// its start, its prompt, before and after each tool call, and before
    /// it (or a sub-agent) ends with an answer.
    pub fn lifecycle_hooks(mut self, hooks: Arc<dyn LifecycleHooks>) -> Self {
        self.lifecycle_hooks = Some(hooks);
        self
    }

    /// How many times `stop` (and `sub_agent_stop`) hooks may send a run
    /// back for another turn instead of letting it end (default 1).
    pub fn max_stop_refusals(mut self, times: u32) -> Self {
        self.stop_refusals = times;
        self
    }

    /// Records the workspace before a top-level run's first tool call and
    /// after each of its steps, so runs can be rewound and forked
    /// ([`crate::rewind`], docs/rewind.md). The snapshots' files join
    /// Loom's protected state.
    pub fn snapshots(mut self, snapshots: Arc<dyn crate::snapshots::WorkspaceSnapshots>) -> Self {
        self.snapshots = Some(snapshots);
        self
    }

    /// Every event of the agent's runs (their sub-agents' included) goes to
    /// `observer` as it becomes visible (docs/telemetry.md).
    pub fn observer(mut self, observer: Arc<dyn crate::observe::EventObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Concurrency-safe calls running at once (default 10).
    pub fn max_concurrency(mut self, limit: usize) -> Self {
        self.pipeline.max_concurrency = limit;
        self
    }

    /// Limit of one tool call (default 120 s); `None` for none.
    pub fn tool_timeout(mut self, limit: Option<Duration>) -> Self {
        self.pipeline.tool_timeout = limit;
        self
    }

    /// Limit of one call of `tool`, replacing the general tool timeout.
    pub fn tool_timeout_for(mut self, tool: impl Into<String>, limit: Duration) -> Self {
        self.pipeline.tool_timeouts.insert(tool.into(), limit);
        self
    }

    /// Tool results longer than this many characters are cut, visibly (default 30 000).
    pub fn max_output_chars(mut self, limit: usize) -> Self {
        self.pipeline.max_output_chars = limit;
        self
    }

    /// How secrets are removed from tool output (default: known key and
    /// token shapes, and the values of environment variables ending in
    /// `_KEY`, `_TOKEN`, `_SECRET`).
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = Some(redactor);
        self
    }

    /// The model's prices, so runs report their cost.
    pub fn pricing(mut self, pricing: Pricing) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// The model's context window in tokens (default 200 000).
    pub fn context_window(mut self, tokens: usize) -> Self {
        self.memory.context_window = tokens;
        self
    }

    /// Compress when a request would use this share of the window (default 0.92).
    pub fn compression_threshold(mut self, share: f64) -> Self {
        self.memory.compression_threshold = share;
        self
    }

    /// All memory and compression settings at once.
    pub fn memory(mut self, config: MemoryConfig) -> Self {
        self.memory = config;
        self
    }

    /// How tokens are counted (default: tiktoken, chosen by the model's name).
    pub fn token_counter(mut self, counter: Arc<dyn TokenCounter>) -> Self {
        self.counter = Some(counter);
        self
    }

    /// Where models named by sub-agents defined in files come from
    /// (docs/agents.md). Without it, a sub-agent with a model of its own
    /// is refused.
    pub fn model_source(mut self, models: Arc<dyn crate::model_source::ModelSource>) -> Self {
        self.models = Some(models);
        self
    }

    /// The model that writes compression summaries (default: the run's model).
    pub fn summarizer(mut self, llm: Arc<dyn Llm>) -> Self {
        self.summarizer = Some(llm);
        self
    }

    /// Whether guidance — feedback on failed calls, the monitor's early
    /// warnings — is written for the next request (default true). It is
    /// never stored in the history. The monitor itself has its own switch,
    /// [`MonitorConfig::enabled`]; the instruction of a final-answer call
    /// (step limit, monitor verdict) is always sent.
    pub fn feedback(mut self, on: bool) -> Self {
        self.feedback = on;
        self
    }

    /// Adds a task handler; the first that can handle the task writes the guidance.
    pub fn task_handler(mut self, handler: impl TaskHandler + 'static) -> Self {
        self.task_handlers.push(Arc::new(handler));
        self
    }

    /// The recursion monitor: on or off, and its thresholds (checked by
    /// [`AgentBuilder::build`]).
    pub fn monitor(mut self, config: MonitorConfig) -> Self {
        self.monitor = config;
        self
    }

    /// A retriever asked once per run with the user's request; its passages
    /// join the system prompt.
    pub fn retriever(mut self, retriever: Arc<dyn Retriever>, limit: usize) -> Self {
        self.retriever = Some(retriever);
        self.retrieval_limit = limit.max(1);
        self
    }

    /// Whether LOOM.md / AGENTS.md are read (default true: the workspace root
    /// and the directories given to [`AgentBuilder::instructions_dir`]).
    pub fn project_instructions(mut self, on: bool) -> Self {
        self.project_instructions = on;
        self
    }

    /// Another directory to read LOOM.md / AGENTS.md from (e.g. the user's config directory).
    pub fn instructions_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.instruction_dirs.push(dir.into());
        self
    }

    /// Token budget of the assembled system prompt (default: a quarter of the window, at most 16 000).
    pub fn system_prompt_budget(mut self, tokens: usize) -> Self {
        self.system_budget = Some(tokens);
        self
    }

    /// Makes runs durable: each run is recorded, checkpointed after every
    /// turn, and its side-effecting tool calls journaled.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Also keeps tools away from `path` and what is under it, for reading
    /// and writing alike (Loom's state kept elsewhere: a session key, a
    /// trust record). The store's files and what an older Loom kept in the
    /// workspace's `.loom/` are always protected.
    pub fn protect(mut self, path: impl Into<PathBuf>) -> Self {
        self.protected.push(path.into());
        self
    }

    /// Lets tools read `path` (and what is under it) but never change it:
    /// configuration Loom reads, such as loom.toml.
    pub fn read_only(mut self, path: impl Into<PathBuf>) -> Self {
        self.read_only.push(path.into());
        self
    }

    /// Who runs the agent's runs, as recorded in the store (default: this process, see [`crate::owner::this_process`]); a run whose owner process died can be resumed.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Adds a section to every run's system prompt, after the base prompt
    /// and before project instructions. Cut first, with them, when the
    /// prompt's budget is short.
    pub fn system_section(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.sections.push(crate::engine::SystemSection {
            name: name.into(),
            text: text.into(),
            tool: None,
            critical: false,
        });
        self
    }

    /// Adds instructions to every run's system prompt that are never cut
    /// to fit its budget, as the base prompt is not (plan mode's).
    pub fn system_instructions(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.sections.push(crate::engine::SystemSection {
            name: name.into(),
            text: text.into(),
            tool: None,
            critical: true,
        });
        self
    }

    /// Adds a section that only runs offered `tool` get (a sub-agent
    /// without it does not): the `loom` command lists the skills this way,
    /// for the `skill` tool.
    pub fn system_section_for(
        mut self,
        tool: impl Into<String>,
        name: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        self.sections.push(crate::engine::SystemSection {
            name: name.into(),
            text: text.into(),
            tool: Some(tool.into()),
            critical: false,
        });
        self
    }

    /// Replaces the default system prompt.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// How many times an answer cut off by the model's output limit
    /// (finish reason `length`) is continued, each with a `warning` event
    /// (default 3; 0 takes the cut answer as it is).
    pub fn max_continuations(mut self, times: u32) -> Self {
        self.max_continuations = times;
        self
    }

    /// Tool turns allowed before the final answer is demanded (default 10).
    pub fn max_steps(mut self, max_steps: u32) -> Self {
        self.limits.max_steps = max_steps;
        self
    }

    /// Limit of the whole run (default 300 s); `None` for none.
    pub fn run_timeout(mut self, limit: Option<Duration>) -> Self {
        self.limits.run_timeout = limit;
        self
    }

    /// Limit of one turn, model call plus tools (default 120 s); `None` for none.
    pub fn step_timeout(mut self, limit: Option<Duration>) -> Self {
        self.limits.step_timeout = limit;
        self
    }

    /// How runs start sub-agents through a `task` tool: the nesting limit,
    /// how many run at once, their default step limit.
    pub fn sub_agents(mut self, settings: SubAgentSettings) -> Self {
        self.sub_agents = settings;
        self
    }

    /// Tokens (prompt and completion, over all model calls) a run may
    /// spend; a run that has used them stops `BUDGET_EXHAUSTED`, after a
    /// `warning` (`BUDGET_LOW`) at 80 %. Default: no limit.
    pub fn max_tokens(mut self, tokens: u64) -> Self {
        self.limits.budget.max_tokens = Some(tokens);
        self
    }

    /// US dollars a run may spend at the model's prices ([`AgentBuilder::pricing`]
    /// must be set); like [`AgentBuilder::max_tokens`]. Default: no limit.
    pub fn max_cost_usd(mut self, dollars: f64) -> Self {
        self.limits.budget.max_cost_usd = Some(dollars);
        self
    }

    /// How long a cancelled tool may take to return before it is dropped (default 250 ms).
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.limits.cancel_grace = grace;
        self
    }

    /// The directory the tools are confined to (default: the current directory).
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Checks the configuration and builds the agent.
    pub fn build(self) -> Result<Agent, BuildError> {
        let llm = self.llm.ok_or(BuildError::MissingModel)?;
        let llm_name = llm.model_name().to_string();
        if self.pipeline.max_concurrency == 0 {
            return Err(BuildError::InvalidLimit("max_concurrency must be at least 1".into()));
        }
        if self.pipeline.max_output_chars < 100 {
            return Err(BuildError::InvalidLimit("max_output_chars must be at least 100".into()));
        }
        let thresholds = (self.memory.warning_threshold, self.memory.compression_threshold);
        if !(0.0 < thresholds.0 && thresholds.0 <= thresholds.1 && thresholds.1 <= 1.0) {
            return Err(BuildError::InvalidLimit(
                "thresholds must satisfy 0 < warning ≤ compression ≤ 1".into(),
            ));
        }
        if self.memory.context_window < 1000 {
            return Err(BuildError::InvalidLimit(
                "context_window must be at least 1000 tokens".into(),
            ));
        }
        self.monitor
            .validate()
            .map_err(|err| BuildError::InvalidLimit(format!("monitor: {err}")))?;
        if self.limits.max_steps == 0 {
            return Err(BuildError::InvalidLimit("max_steps must be at least 1".into()));
        }
        if self.sub_agents.max_running == 0 {
            return Err(BuildError::InvalidLimit(
                "sub-agents' max_running must be at least 1".into(),
            ));
        }
        if self.limits.budget.max_tokens == Some(0) {
            return Err(BuildError::InvalidLimit("max_tokens must be at least 1".into()));
        }
        if let Some(dollars) = self.limits.budget.max_cost_usd {
            if !(dollars.is_finite() && dollars > 0.0) {
                return Err(BuildError::InvalidLimit("max_cost_usd must be more than zero".into()));
            }
            if self.pricing.is_none() {
                return Err(BuildError::InvalidLimit(format!(
                    "max_cost_usd needs the prices of {llm_name} (set them with .pricing(...), or [prices] in loom.toml)"
                )));
            }
        }
        for (name, limit) in [
            ("run timeout", self.limits.run_timeout),
            ("step timeout", self.limits.step_timeout),
        ] {
            if limit == Some(Duration::ZERO) {
                return Err(BuildError::InvalidLimit(format!("{name} must be more than zero")));
            }
        }
        let dir = match self.workspace {
            Some(dir) => dir,
            None => std::env::current_dir().map_err(|source| BuildError::Workspace {
                path: PathBuf::from("."),
                source,
            })?,
        };
        let workspace = dir.canonicalize().map_err(|source| BuildError::Workspace {
            path: dir.clone(),
            source,
        })?;
        if !workspace.is_dir() {
            return Err(BuildError::Workspace {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let mut more_protected = self.protected.clone();
        more_protected.extend(self.snapshots.iter().flat_map(|snapshots| snapshots.files()));
        let protected = protected_paths(&workspace, self.store.as_deref(), &more_protected);
        // A workspace's `.loom/` holds project configuration: readable,
        // never changed by a tool.
        let read_only: Arc<[PathBuf]> = std::iter::once(workspace.join(".loom"))
            .chain(self.read_only.iter().map(|path| canonical(path)))
            .collect();
        let mut registry = ToolRegistry::new();
        for tool in self.tools {
            registry.register(tool)?;
        }
        let tools_offered = registry.names().next().is_some() || !self.tool_sources.is_empty();
        // An MCP server's tools are not known yet: they may change things.
        let changing_tools_offered = !self.tool_sources.is_empty()
            || registry.names().any(|name| {
                name != crate::delegate::TASK_TOOL && registry.get(name).is_some_and(|tool| !tool.tool.read_only())
            });
        let read_only_tools: Arc<[String]> = registry
            .names()
            .filter(|name| registry.get(name).is_some_and(|tool| tool.tool.read_only()))
            .map(str::to_string)
            .collect();
        let pipeline = Arc::new(
            ToolPipeline::new(
                Arc::new(registry),
                self.hooks,
                self.policy,
                self.pipeline,
                self.redactor.unwrap_or_else(Redactor::from_env),
            )
            .with_lifecycle_hooks(self.lifecycle_hooks.clone()),
        );
        Ok(Agent {
            engine: Arc::new(Engine {
                llm,
                models: self.models,
                tools: Arc::new(crate::tool_source::ToolSet::new(pipeline, self.tool_sources)),
                sub_agents: self.sub_agents,
                system_prompt: self.system_prompt.unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
                pricing: self.pricing,
                lifecycle_hooks: self.lifecycle_hooks,
                stop_refusals: self.stop_refusals,
                snapshots: self.snapshots,
                observer: self.observer,
                store: self.store,
                owner: self.owner.unwrap_or_else(crate::owner::this_process),
                machine: machine::Settings {
                    max_continuations: self.max_continuations,
                    feedback: self.feedback,
                    task_handlers: self.task_handlers.into(),
                    monitor: self.monitor,
                    tools_offered,
                    changing_tools_offered,
                    read_only_tools,
                },
                protected,
                read_only,
                context: ContextSettings {
                    counter: self
                        .counter
                        .unwrap_or_else(|| Arc::new(TiktokenCounter::for_model(llm_name.as_str()))),
                    system_budget: self
                        .system_budget
                        .unwrap_or_else(|| (self.memory.context_window / 4).min(16_000)),
                    memory: self.memory,
                    summarizer: self.summarizer,
                    retriever: self.retriever,
                    retrieval_limit: self.retrieval_limit,
                    sections: self.sections,
                    instruction_dirs: if self.project_instructions {
                        let mut dirs = self.instruction_dirs;
                        dirs.push(workspace.clone());
                        dirs
                    } else {
                        Vec::new()
                    },
                },
            }),
            limits: self.limits,
            permission_timeout: self.permission_timeout,
            nobody_to_ask: self.nobody_to_ask,
            workspace: workspace.into(),
            sessions: Arc::default(),
        })
    }
}

/// State files an older Loom kept in a workspace's `.loom/` (refused to
/// tools wherever they still are; the binary moves them out).
pub const LEGACY_STATE: &[&str] = &[
    "loom.db",
    "loom.db-wal",
    "loom.db-shm",
    "loom.db-journal",
    "web-session.key",
    "web-session.revoked",
];

/// Loom's own state in canonical form: what an older Loom kept in the
/// workspace's `.loom/`, the store's files (their directory resolved, as
/// the files may not exist yet) and what the builder was told to protect.
fn protected_paths(workspace: &Path, store: Option<&dyn Store>, more: &[PathBuf]) -> Arc<[PathBuf]> {
    // What older versions kept in the workspace's `.loom/` (the binary
    // moves it out on first start; refused wherever it still is).
    let mut paths: Vec<PathBuf> = LEGACY_STATE
        .iter()
        .map(|name| workspace.join(".loom").join(name))
        .collect();
    let files = store.map(Store::files).unwrap_or_default();
    for file in files.iter().chain(more) {
        let resolved = canonical(file);
        if !paths.iter().any(|known| resolved.starts_with(known)) {
            paths.push(resolved);
        }
    }
    paths.into()
}

/// `path` with its directory resolved (the file itself may not exist yet).
fn canonical(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => (if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .canonicalize()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// The user's task.
    pub prompt: String,
    /// Use this run id instead of a generated one.
    pub run_id: Option<String>,
    /// The session the run belongs to (default: the run id).
    pub session_id: Option<String>,
    /// The conversation so far, placed between the system prompt and the
    /// prompt. `None`: with a store, the session's earlier runs are loaded
    /// (see [`crate::recovery::session_history`]); without one, nothing.
    pub history: Option<Vec<crate::message::Message>>,
    /// Tool turns allowed for this run, instead of the agent's limit.
    pub max_steps: Option<u32>,
    /// Who the run belongs to, as recorded in the store (a server records
    /// the name of the token that started it, and shows a token only its
    /// own runs).
    pub principal: Option<String>,
    /// The run this one was forked from (with `history` as of its step),
    /// told in `lifecycle.start` ([`crate::rewind::fork`]).
    pub forked_from: Option<crate::event::ForkLink>,
    /// The client's W3C trace context: the run's trace span becomes its
    /// child (docs/telemetry.md). Told in `lifecycle.start`, inherited by
    /// the run's sub-agents, kept across a resume.
    pub trace_parent: Option<crate::trace_context::TraceParent>,
}

impl From<&str> for RunRequest {
    fn from(prompt: &str) -> Self {
        Self {
            prompt: prompt.to_string(),
            ..Self::default()
        }
    }
}

impl From<String> for RunRequest {
    fn from(prompt: String) -> Self {
        Self {
            prompt,
            ..Self::default()
        }
    }
}

/// A configured agent. Cheap to clone; each [`Agent::run`] is independent.
#[derive(Clone)]
pub struct Agent {
    engine: Arc<Engine>,
    limits: Limits,
    permission_timeout: Option<Duration>,
    nobody_to_ask: Option<Arc<str>>,
    workspace: Arc<Path>,
    /// "Always" grants per session id.
    sessions: Arc<GrantsBySession>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.engine.llm.model_name())
            .field("limits", &self.limits)
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl Agent {
    /// Starts building an agent.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The agent's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tools' jail, canonicalized.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Where the agent's runs record their workspace, if they do.
    pub fn snapshots(&self) -> Option<&Arc<dyn crate::snapshots::WorkspaceSnapshots>> {
        self.engine.snapshots.as_ref()
    }

    /// Where runs are recorded, if anywhere.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.engine.store.as_ref()
    }

    /// The same agent recording its runs in `store`: its model, tools and
    /// settings are shared, not rebuilt. A worker gives each run it
    /// executes the store of that run's lease ([`crate::lease::RunLeases::fenced`]).
    pub fn with_store(&self, store: Arc<dyn Store>) -> Agent {
        let mut engine = Engine::clone(&self.engine);
        engine.store = Some(store);
        Agent {
            engine: Arc::new(engine),
            ..self.clone()
        }
    }

    /// The "always" grants of a session, shared by its runs.
    fn session_grants(&self, session_id: &str) -> SessionGrants {
        self.sessions.of(session_id)
    }

    /// Starts a run on the current tokio runtime and returns its handle.
    pub fn run(&self, request: impl Into<RunRequest>) -> RunHandle {
        let request = request.into();
        let mut limits = self.limits.clone();
        if let Some(max_steps) = request.max_steps.filter(|steps| *steps > 0) {
            limits.max_steps = max_steps;
        }
        let (driver, handle) = self.prepare(request.run_id, request.session_id, LiveState::default(), limits);
        handle.spawn(driver.drive(Start::New {
            prompt: request.prompt,
            history: request.history,
            principal: request.principal,
            forked_from: request.forked_from,
            trace_parent: request.trace_parent,
        }))
    }

    /// Resumes a stored run whose process died (status `INTERRUPTED`, or
    /// `QUEUED`/`RUNNING`/`WAITING_PERMISSION` with an owner process that is
    /// gone) from its last
    /// checkpoint, in this process. Its events continue the stored `seq`.
    /// See [`crate::resume`] for how calls cut short by the crash are settled.
    pub async fn resume(&self, run_id: &str) -> Result<RunHandle, ResumeError> {
        self.prepare_resume(run_id).await?.start().await
    }

    /// Makes ready to resume a stopped run (as [`Agent::resume`]) without
    /// taking it over yet: its controller exists at once, showing the asks
    /// the run left open — an answer sent now applies when the resumed run
    /// asks again — while it waits for [`ResumingRun::start`] (a gateway's
    /// run waiting for a free slot).
    pub async fn prepare_resume(&self, run_id: &str) -> Result<ResumingRun, ResumeError> {
        let store = self.engine.store.clone().ok_or(ResumeError::NoStore)?;
        let record = store.load_run(run_id).await?.run;
        if let Some(parent) = record.parent {
            return Err(ResumeError::SubAgent {
                run_id: run_id.to_string(),
                parent: parent.run_id,
            });
        }
        crate::recovery::check_resumable(&record)?;
        // Read once here for what the run shows while it waits; not kept
        // (a long log held by every run waiting in line would add up).
        let log = store.events(run_id, 0).await?;
        let mut state = LiveState::from_log(run_id, &log);
        // Its place in a client's trace, told again when it resumes.
        let trace_parent = crate::recovery::trace_parent_told_in(&log);
        drop(log);
        // Its usage as of its checkpoint: what came after it is done again.
        state.metrics = record.metrics.clone();
        let last_seq = state.last_seq;
        let (mut driver, handle) = self.prepare(
            Some(record.run_id.clone()),
            Some(record.session_id.clone()),
            state,
            self.limits.clone(),
        );
        driver.trace_parent = trace_parent;
        Ok(ResumingRun {
            run_id: run_id.to_string(),
            store,
            owner: self.engine.owner.clone(),
            last_seq,
            driver,
            handle,
        })
    }

    /// The run's driver and the handle that controls it, not started yet.
    /// `state` is what the run shows until it starts (a resumed run's
    /// open asks and last `seq`); its events continue after its `last_seq`.
    fn prepare(
        &self,
        run_id: Option<String>,
        session_id: Option<String>,
        state: LiveState,
        limits: Limits,
    ) -> (Driver, PreparedHandle) {
        let last_seq = state.last_seq;
        let cancel = CancellationToken::new();
        let budget = BudgetNode::root(limits.budget);
        let ctx = RunContext::new(run_id, session_id, self.workspace.to_path_buf(), limits, cancel);
        let (event_tx, event_rx) = mpsc::unbounded_channel();
        let (steer_tx, steer_rx) = mpsc::unbounded_channel();
        let (pause_tx, pause_rx) = watch::channel(false);
        let (state_tx, state_rx) = watch::channel(state);
        let state_tx = Arc::new(state_tx);
        let pending = Arc::new(PendingAsks::new(state_tx.clone()));
        let gate = PermissionGate {
            pending: pending.clone(),
            grants: self.session_grants(ctx.session_id()),
            timeout: self.permission_timeout,
            nobody_to_ask: self.nobody_to_ask.clone(),
            state: state_tx.clone(),
            store: self.engine.store.clone().map(|store| (store, ctx.run_id_arc())),
        };
        let controller = RunController {
            ctx: ctx.clone(),
            pause_tx: Arc::new(pause_tx),
            steer_tx,
            state: state_rx,
            pending,
        };
        // Events become visible on the run's stream, after its state.
        let observer = self
            .engine
            .observer
            .clone()
            .map(|observer| (observer, Arc::<str>::from(ctx.session_id())));
        let stream = RunStream::new(ctx.run_id_arc(), state_tx.clone(), event_tx, observer);
        // With a store, only once stored (engine/event_log.rs).
        let (log, sink) = match &self.engine.store {
            Some(store) => EventLog::start(store.clone(), ctx.clone(), stream),
            None => EventLog::direct(stream),
        };
        let driver = Driver {
            engine: self.engine.clone(),
            events: EventEmitter::to_sink(ctx.run_id_arc(), ctx.depth(), sink).continuing_after(last_seq),
            log,
            store: self.engine.store.clone().unwrap_or_else(|| Arc::new(NoStore)),
            ctx,
            workspace: self.workspace.clone(),
            controls: Controls {
                steer_rx,
                pause_rx,
                state: state_tx,
            },
            gate,
            caches: Caches::default(),
            budget_warned: Vec::new(),
            tools: self.engine.tools.current(),
            child_slots: Arc::new(tokio::sync::Semaphore::new(self.engine.sub_agents.max_running)),
            budget,
            parent: None,
            children: tokio_util::task::TaskTracker::new(),
            step_deadline: None,
            principal: None,
            trace_parent: None,
            instructions: None,
            agent_name: None,
        };
        (
            driver,
            PreparedHandle {
                events: event_rx,
                controller,
            },
        )
    }
}

/// A stopped run made ready to resume ([`Agent::prepare_resume`]).
pub struct ResumingRun {
    run_id: String,
    store: Arc<dyn Store>,
    owner: String,
    /// The last `seq` of its log when it was made ready.
    last_seq: u64,
    driver: Driver,
    handle: PreparedHandle,
}

impl std::fmt::Debug for ResumingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumingRun").field("run_id", &self.run_id).finish()
    }
}

impl ResumingRun {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The client's trace context the run was started with, as its log
    /// tells it (docs/telemetry.md).
    pub fn trace_parent(&self) -> Option<crate::trace_context::TraceParent> {
        self.driver.trace_parent
    }

    /// The run's controls and state, before it starts and after.
    pub fn controller(&self) -> RunController {
        self.handle.controller.clone()
    }

    /// Takes the run over in the store (of two processes, one gets it) and
    /// continues it from its last checkpoint. A run that went on elsewhere
    /// since it was made ready (its log grew) is handed back, `INTERRUPTED`
    /// again, to be made ready anew.
    pub async fn start(self) -> Result<RunHandle, ResumeError> {
        let snapshot = crate::recovery::take_over(self.store.as_ref(), &self.run_id, &self.owner).await?;
        if snapshot.last_seq != self.last_seq {
            self.store.mark_interrupted(&self.run_id, &self.owner).await?;
            return Err(ResumeError::Changed { run_id: self.run_id });
        }
        Ok(self.handle.spawn(self.driver.drive(Start::Resumed(Box::new(snapshot)))))
    }
}

/// A handle whose run is not spawned yet.
struct PreparedHandle {
    events: mpsc::UnboundedReceiver<Box<crate::event::Event>>,
    controller: RunController,
}

impl PreparedHandle {
    fn spawn(self, drive: impl std::future::Future<Output = crate::outcome::RunOutcome> + Send + 'static) -> RunHandle {
        RunHandle {
            events: self.events,
            controller: self.controller,
            task: tokio::spawn(drive),
        }
    }
}
