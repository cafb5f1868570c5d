//! The keys of `loom.toml`, section by section (docs/cli.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

/// The keys of loom.toml. Keys the contract defines for later features are
/// accepted so one file serves every version; unknown keys are an error so
/// typos do not pass silently.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub model: Option<String>,
    /// `sqlite:PATH` (relative to this file) or `none`.
    pub store: Option<String>,
    pub max_steps: Option<u32>,
    /// Tokens a run may spend (prompt and completion, over all model calls).
    pub max_tokens: Option<u64>,
    /// US dollars a run may spend, at the model's `[prices]`.
    pub max_cost_usd: Option<f64>,
    pub run_timeout_secs: Option<u64>,
    pub step_timeout_secs: Option<u64>,
    /// How long a permission question waits for an answer (0: as long as the run).
    pub permission_timeout_secs: Option<u64>,
    /// Tool results longer than this many characters are cut.
    pub tool_output_max_chars: Option<usize>,
    pub context_window: Option<usize>,
    pub compression_threshold: Option<f64>,
    /// Share of the window that gives a `context.warning` (default 0.80).
    pub compression_warning: Option<f64>,
    /// Recent messages kept as they are when compressing (default 8).
    pub keep_recent_messages: Option<usize>,
    /// The model that writes compression summaries (default: the run's model).
    pub compression_model: Option<String>,
    /// How many times an answer cut off by the output limit is continued (default 3).
    pub max_continuations: Option<u32>,
    /// Tokens of the assembled system prompt (default: a quarter of the window, at most 16 000).
    pub system_prompt_budget: Option<usize>,
    pub feedback: Option<FeedbackConfig>,
    pub retrieval: Option<RetrievalConfig>,
    /// `tool` or `tool(arg=glob)` → allow | ask | deny, and `default`.
    pub permissions: Option<BTreeMap<String, String>>,
    pub scheduler: Option<SchedulerConfig>,
    /// How to reach the model's provider.
    pub provider: Option<ProviderConfig>,
    /// Prices per model (`"openai:gpt-4o-mini"` or just `"gpt-4o-mini"`).
    #[serde(default)]
    pub prices: BTreeMap<String, PriceConfig>,
    /// `[mcp.servers.NAME]`: MCP servers whose tools are offered as `NAME__tool`.
    pub mcp: Option<McpConfig>,
    /// `[tools.bash]` and other built-in tools' settings.
    pub tools: Option<ToolsConfig>,
    /// `[server]`: tokens and limits of `loom serve`.
    pub server: Option<crate::ServerSettings>,
    /// `[cluster]`: the Redis that processes on several machines share.
    pub cluster: Option<ClusterConfig>,
    /// `[[hooks]]`: commands run at points of a run (docs/extending.md).
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// How many times `stop` hooks may send a run back for another turn (default 1).
    pub max_stop_refusals: Option<u32>,
    /// `[snapshots]`: the workspace recorded per step for rewind and fork.
    pub snapshots: Option<SnapshotsConfig>,
    /// `[telemetry]`: runs as OpenTelemetry traces, sent over OTLP.
    pub telemetry: Option<TelemetryConfig>,
}

/// `[telemetry]` (docs/telemetry.md).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP collector's base URL (`http://localhost:4318`); spans go to
    /// its `/v1/traces` over HTTP/protobuf. Without it (and without
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`), no traces.
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export (an API key).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Share of run trees exported, 0 to 1 (default 1).
    pub sampling_ratio: Option<f64>,
    /// The service the spans are of (default `OTEL_SERVICE_NAME`, else `loom`).
    pub service_name: Option<String>,
    /// `http/protobuf` (default) or `grpc` (a build with the `grpc`
    /// feature); default: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub protocol: Option<String>,
    /// Record message text, tool arguments and results in the spans,
    /// redacted as the events are (default false).
    pub capture_content: Option<bool>,
}

/// `[snapshots]` (docs/rewind.md).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// `false`: runs record no snapshots (and cannot rewind files).
    pub enabled: Option<bool>,
    /// Only files matching one of these globs (default: every file
    /// `.gitignore` does not leave out).
    #[serde(default)]
    pub include: Vec<String>,
    /// Never files matching one of these globs.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Files larger than this are left out, and reported (default 2 MiB).
    pub max_file_bytes: Option<u64>,
    /// `false`: no kernel watches (inotify); every snapshot walks the whole
    /// workspace — for a workspace on a network file system changed from
    /// other machines.
    pub watch: Option<bool>,
}

/// One `[[hooks]]` entry (docs/extending.md).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// `session_start`, `user_prompt_submit`, `pre_tool_use`,
    /// `post_tool_use`, `stop` or `sub_agent_stop`.
    pub event: String,
    /// For tool events: a regular expression the whole tool name must match.
    pub matcher: Option<String>,
    /// Run with `bash -c` in the workspace.
    pub command: String,
    /// Seconds before the hook is stopped (default 30).
    pub timeout_secs: Option<u64>,
}

/// `[cluster]` (docs/cluster.md).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `redis://HOST:PORT/DB`: runs are recorded there.
    pub redis: Option<String>,
    /// Whether `loom serve` executes runs itself (default: no, `loom
    /// worker` processes do).
    pub execute: Option<bool>,
    /// How long a worker's lease on a run lasts without renewal, in
    /// seconds (default 3; renewed every third of it): a dead worker's
    /// runs are taken over after about this long.
    pub lease_secs: Option<f64>,
    /// A run waiting this long for a person is parked by its worker: it
    /// holds no worker until answered (default 5; 0: at once).
    pub park_after_secs: Option<f64>,
    /// Days a finished run is kept before workers remove it (default 30;
    /// 0: for ever).
    pub keep_finished_days: Option<f64>,
}

impl FileConfig {
    /// The Redis runs are recorded in, if `[cluster]` names one.
    pub fn cluster_redis(&self) -> Option<&str> {
        self.cluster.as_ref().and_then(|cluster| cluster.redis.as_deref())
    }
}

/// `[mcp]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    #[serde(default)]
    pub servers: BTreeMap<String, loom_tools::McpServerConfig>,
}

/// `[tools]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    pub bash: Option<BashConfig>,
    /// Offer the `task` tool (sub-agents). Default: only when the project
    /// defines agents (`.loom/agents/`) — a model offered it unasked
    /// delegates work it could do itself (docs/subagents.md).
    pub task: Option<bool>,
}

/// `[tools.bash]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashConfig {
    /// `false` leaves the tool out.
    pub enabled: Option<bool>,
    /// `landlock` or `none` (default).
    pub sandbox: Option<String>,
    /// Refuse sandboxed commands where namespaces cannot be made, instead
    /// of running them under Landlock alone (default false).
    pub require_namespaces: Option<bool>,
    /// The bwrap program, by absolute path (default: /usr/bin/bwrap, …).
    pub bwrap: Option<PathBuf>,
    /// A command's limit when the call gives none (default 120).
    pub timeout_secs: Option<u64>,
    /// The most a call may ask for (default 600).
    pub max_timeout_secs: Option<u64>,
    /// Variables added to the commands' environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// `[feedback]`: guidance for the next request (`enabled`) and the
/// recursion monitor (`monitor` and its thresholds). Counts are read as
/// signed numbers so that a negative one gets a clear message.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    pub enabled: Option<bool>,
    pub monitor: Option<bool>,
    pub duplicate_threshold: Option<i64>,
    pub loop_window: Option<i64>,
    pub error_threshold: Option<f64>,
    pub error_window: Option<i64>,
    pub warning_ratio: Option<f64>,
}

/// `[retrieval]`: a folder of documents searched with the user's request.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrievalConfig {
    /// The folder, relative to the config file.
    pub dir: PathBuf,
    /// Passages added to the system prompt (default 5).
    pub limit: Option<usize>,
}

/// `[provider]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub base_url: Option<String>,
    /// Stream answers (false for servers that cannot).
    pub stream: Option<bool>,
    pub max_tokens: Option<u32>,
    /// Read `<tool_call>` blocks from text, for models without tool calling.
    #[serde(default)]
    pub text_tool_calls: bool,
    /// Where guidance goes: "system" (a system message; the official OpenAI
    /// API only, refused for any other server) or "inline" (a reminder in
    /// the last tool or user message). Default: "system" at the official
    /// OpenAI API, "inline" anywhere else.
    pub guidance: Option<String>,
    /// Extra HTTP headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub max_attempts: Option<u32>,
    pub retry_base_ms: Option<u64>,
    pub retry_max_secs: Option<u64>,
    pub connect_timeout_secs: Option<u64>,
    pub first_byte_timeout_secs: Option<u64>,
    pub idle_timeout_secs: Option<u64>,
    pub requests_per_minute: Option<u32>,
    pub breaker_failures: Option<u32>,
    pub breaker_open_secs: Option<u64>,
}

/// `[prices."MODEL"]`, US dollars per million tokens.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// `[scheduler]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    pub max_concurrency: Option<usize>,
    pub tool_timeout_secs: Option<u64>,
    /// Per-tool limits in seconds (`[scheduler.tool_timeouts]`).
    #[serde(default)]
    pub tool_timeouts: BTreeMap<String, u64>,
}
