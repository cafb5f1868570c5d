//! Command-line arguments (docs/cli.md).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Loom: run an agent that thinks, calls tools and answers.
#[derive(Debug, Parser)]
#[command(name = "loom", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run one task: the answer streams to stdout, tool activity to stderr.
    Run(Box<RunArgs>),
    /// Run a suite of tasks against a model and judge the outcomes (docs/eval.md).
    Eval(Box<EvalArgs>),
    /// An interactive session: one task after another in one conversation.
    Chat(Box<ChatArgs>),
    /// Look at, resume or cancel recorded runs.
    Runs(Box<RunsArgs>),
    /// The gateway: runs as a service over WebSocket JSON-RPC and HTTP with SSE.
    ///
    /// Every tool that is not read-only is denied unless --allow or --ask names it.
    Serve(Box<ServeArgs>),
    /// Execute the runs a cluster's gateways accept, serving no clients (docs/cluster.md).
    ///
    /// Needs the cluster's Redis: --redis, LOOM_REDIS_URL or [cluster] redis in --config.
    Worker(Box<WorkerArgs>),
    /// The MCP servers of loom.toml.
    Mcp(McpArgs),
    /// Trust a project's loom.toml as it is now, so that its settings that
    /// run commands or widen permissions take effect (docs/security.md).
    Trust(TrustArgs),
    /// The audit trail: who started, steered, cancelled or answered what,
    /// sign-ins, refused tokens and trusted files (docs/server.md).
    Audit(AuditArgs),
    /// Sub-agents defined in files: .loom/agents/NAME.md and
    /// ~/.config/loom/agents/NAME.md (docs/agents.md).
    Agents(DefinitionsArgs),
    /// Skills defined in files: .loom/skills/NAME/SKILL.md and
    /// ~/.config/loom/skills/NAME/SKILL.md (docs/agents.md).
    Skills(DefinitionsArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DefinitionsArgs {
    #[command(subcommand)]
    pub command: DefinitionsCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DefinitionsCommand {
    /// Shows each one, and what is wrong with a file that did not load
    /// (its line and key); exits 1 when one did not.
    List {
        /// The workspace whose .loom/ to read (default: the current directory).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only records from this moment on: a time ago (`90m`, `2h`, `7days`)
    /// or an RFC 3339 time (`2026-11-26T18:00:00Z`).
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,

    /// Only the records of the token with this name (`[[server.tokens]]` name).
    #[arg(long, value_name = "NAME")]
    pub token: Option<String>,

    /// At most this many records: the newest.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,

    /// The database (default: the workspace's, in Loom's state directory).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,

    /// Read the trail a Redis keeps instead (`redis://HOST:PORT/DB`; docs/cluster.md).
    #[arg(long, value_name = "URL", env = "LOOM_REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,

    /// The workspace whose database to read (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TrustArgs {
    /// The file to trust (default: ./loom.toml).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(subcommand)]
    pub command: McpCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Starts each configured server and shows its state and tools.
    List {
        /// Configuration file (default: ./loom.toml, then the user's config directory).
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Where stdio servers run (default: the current directory).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Where to listen. Without a token ([[server.tokens]] or LOOM_TOKEN) only a loopback address is allowed.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080")]
    pub addr: String,

    #[command(flatten)]
    pub place: PlaceArgs,

    #[command(flatten)]
    pub agent: CommonAgentArgs,

    /// Log lines as text for people or as JSON for machines.
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: LogFormat,

    /// Print the protocol's JSON Schema (requests, answers, event frames) and exit.
    #[arg(long)]
    pub print_schema: bool,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// Serve /healthz, /readyz and /metrics here (default: none). No token guards them: bind where only your supervisor and Prometheus reach.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,

    /// Runs executed at once.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs: u32,

    #[command(flatten)]
    pub place: ClusterPlaceArgs,

    #[command(flatten)]
    pub agent: CommonAgentArgs,

    /// Log lines as text for people or as JSON for machines.
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: LogFormat,
}

/// Where a worker works: its workspace and the cluster's Redis (a worker
/// has no database of its own, so it takes no `--db`).
#[derive(Debug, Clone, Args)]
pub(crate) struct ClusterPlaceArgs {
    /// The directory the tools are confined to (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// The cluster's Redis (`redis://HOST:PORT/DB`; default: loom.toml's [cluster] redis; docs/cluster.md).
    #[arg(long, value_name = "URL", env = "LOOM_REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
}

/// How `loom serve` and `loom worker` write their log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One readable line per record.
    Human,
    /// One JSON object per record.
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,

    /// The database (default: the workspace's, in Loom's state directory).
    #[arg(long, value_name = "PATH", global = true)]
    pub db: Option<PathBuf>,

    /// Read the runs a Redis keeps instead (`redis://HOST:PORT/DB`; docs/cluster.md).
    #[arg(
        long,
        value_name = "URL",
        env = "LOOM_REDIS_URL",
        global = true,
        hide_env_values = true
    )]
    pub redis: Option<String>,

    /// The workspace whose database to read (default: the current directory).
    #[arg(long, value_name = "DIR", global = true)]
    pub workspace: Option<PathBuf>,

    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// The newest runs.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only the runs of this session (a `loom chat` or `--session` conversation).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
    /// One run: status, timings, metrics, suggestions, the answer.
    Show {
        /// The run id.
        id: String,
        /// Also print the turn tree: each model call and tool call with its
        /// timing and status, sub-agents under their calls.
        #[arg(long)]
        tree: bool,
    },
    /// A run's recorded events, one JSON line each.
    Events {
        /// The run id.
        id: String,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Continue a run whose process died (crash, kill, reboot) from its last checkpoint.
    Resume {
        /// The run id.
        id: String,
        #[command(flatten)]
        agent: Box<AgentArgs>,
    },
    /// Cancel a run: a live one is stopped by its process, an interrupted or queued one is closed.
    Cancel {
        /// The run id.
        id: String,
    },
    /// Take a run that is not executing back to a step: its workspace as the step left it, and its session's conversation as of the step (docs/rewind.md).
    Rewind {
        /// The run id.
        id: String,
        /// The step: 0 is before any tool ran, N after the tools of step N (as `step.completed` counts).
        #[arg(long, value_name = "N")]
        step: u32,
        /// Only the workspace's files.
        #[arg(long, conflicts_with_all = ["conversation", "both"])]
        files: bool,
        /// Only the conversation the session continues from.
        #[arg(long, conflicts_with = "both")]
        conversation: bool,
        /// Both (the default).
        #[arg(long)]
        both: bool,
        /// Only list what would change.
        #[arg(long)]
        dry_run: bool,
        /// Restore files that were changed outside Loom since it last recorded them, losing that change.
        #[arg(long)]
        force: bool,
    },
    /// Start a new session from a step of a run that is not executing: its conversation as of the step, the workspace restored to it (in place, or into a copy).
    Fork {
        /// The run id.
        id: String,
        /// The step to fork from (as `loom runs rewind` counts).
        #[arg(long, value_name = "N")]
        step: u32,
        /// Run this prompt in the new session at once (else the session waits for `loom chat --session`).
        #[arg(long, value_name = "TEXT")]
        prompt: Option<String>,
        /// Restore the workspace into this new or empty folder instead, leaving the original as it is; the new session works there.
        #[arg(long, value_name = "DIR")]
        into: Option<PathBuf>,
        /// Restore files in place that were changed outside Loom since it last recorded them.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        agent: Box<AgentArgs>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The task for the agent; `-` reads it from stdin, as does no task when stdin is not a terminal.
    pub prompt: Option<String>,

    /// Read the task from this file.
    #[arg(long, value_name = "PATH")]
    pub prompt_file: Option<PathBuf>,

    #[command(flatten)]
    pub place: PlaceArgs,

    #[command(flatten)]
    pub agent: AgentArgs,

    /// Continue this session's conversation (default: a new session named after the run).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,

    /// Print every event as one JSON line on stdout instead of the answer.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub place: PlaceArgs,

    #[command(flatten)]
    pub agent: AgentArgs,

    /// Continue this session's conversation (default: a new session).
    #[arg(long, value_name = "ID", conflicts_with = "continue_last")]
    pub session: Option<String>,

    /// Continue the most recent session of the workspace.
    #[arg(long = "continue", short = 'c')]
    pub continue_last: bool,
}

/// Where the tools work and where runs are recorded.
#[derive(Debug, Args)]
pub(crate) struct PlaceArgs {
    /// The directory the tools are confined to (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// The SQLite database that makes runs durable (default: loom.db in the workspace's state directory, see docs/security.md).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,

    /// Record runs in this Redis instead (`redis://HOST:PORT/DB`; docs/cluster.md; `--db` wins).
    #[arg(long, value_name = "URL", env = "LOOM_REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
}

/// How every command configures its agents alike: the model, the step and
/// time limits, permissions, the configuration file.
#[derive(Debug, Clone, Args)]
pub(crate) struct CommonAgentArgs {
    /// The model as PROVIDER:MODEL: openai:MODEL, anthropic:MODEL or scripted:PATH.
    #[arg(long, env = "LOOM_MODEL")]
    pub model: Option<String>,

    /// The API base of the model's provider, e.g. http://localhost:11434/v1 (else OPENAI_BASE_URL / ANTHROPIC_BASE_URL).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,

    /// Tool turns before the model must give its final answer (for served runs: those that do not say).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,

    /// Time limit of a run in seconds (0: none).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,

    /// Allow a tool (or a rule such as 'write_file(path=docs/**)') without asking. Repeatable.
    #[arg(long, value_name = "TOOL")]
    pub allow: Vec<String>,

    /// Ask before a tool (or rule) runs. Repeatable.
    #[arg(long, value_name = "TOOL")]
    pub ask: Vec<String>,

    /// Never run a tool (or rule). Repeatable.
    #[arg(long, value_name = "TOOL")]
    pub deny: Vec<String>,

    /// Configuration file (default for run and chat: ./loom.toml, then the user's config directory; serve reads only this one).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// How a run on the terminal is configured: the common settings, and what
/// only a person at a terminal asks for.
#[derive(Debug, Clone, Args)]
pub(crate) struct AgentArgs {
    #[command(flatten)]
    pub common: CommonAgentArgs,

    /// Write the model's answers to PATH as a script, to replay the run offline with --model scripted:PATH.
    #[arg(long, value_name = "PATH")]
    pub record: Option<PathBuf>,

    /// Tokens (prompt and completion, over all model calls) the run may spend; then it stops (BUDGET_EXHAUSTED).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,

    /// US dollars the run may spend at the model's prices ([prices] in loom.toml); then it stops (BUDGET_EXHAUSTED).
    #[arg(long, value_name = "USD", value_parser = positive_dollars)]
    pub max_cost: Option<f64>,

    /// Offer the model only these tools (comma-separated names, e.g. read_file,write_file,bash); `task` here offers sub-agents even where loom.toml does not.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub tools: Vec<String>,

    /// Approve every permission request without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,

    /// How much the run may do without asking (docs/cli.md): default;
    /// plan (only tools that read; the answer is a plan you approve before
    /// anything changes); accept-edits (write_file and edit_file without
    /// asking); bypass (every tool without asking). Rules that match still
    /// decide: a deny is never overridden.
    #[arg(long, value_name = "MODE", default_value = "default")]
    pub mode: loom::Mode,

    /// Show guidance, compression and retrieval as they happen, and a run summary with suggestions at the end.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// `loom eval`.
#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    /// The suite file (TOML; docs/eval.md).
    pub suite: PathBuf,

    /// The model of every case that names none (else loom.toml's).
    #[arg(long, env = "LOOM_MODEL")]
    pub model: Option<String>,

    /// The model server's URL (an OpenAI-compatible endpoint).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,

    /// Attempts of each case.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Attempts run at once.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub jobs: u64,

    /// Only this case (repeat the flag for several).
    #[arg(long, value_name = "NAME")]
    pub case: Vec<String>,

    /// Write every attempt and every case as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write JUnit XML to FILE (a test case per attempt).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,

    /// Print the change against an earlier --json FILE.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    /// Record the runs in this SQLite file (default: eval.db in the current directory's state directory).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,

    /// Keep each attempt's final workspace in DIR (as CASE-N) instead of deleting it.
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,

    /// Read this loom.toml instead of the current directory's.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// A budget in dollars: a finite number above zero.
fn positive_dollars(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(dollars) if dollars.is_finite() && dollars > 0.0 => Ok(dollars),
        _ => Err(format!("'{text}' is not an amount of dollars above zero (e.g. 0.50)")),
    }
}
