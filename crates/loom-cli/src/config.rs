//! `loom.toml` (docs/cli.md): found, parsed and merged under the command line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The keys of loom.toml. Keys the contract defines for later features are
/// accepted so one file serves every version; unknown keys are an error so
/// typos do not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
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
    pub server: Option<loom_server::ServerSettings>,
    /// `[cluster]`: the Redis that processes on several machines share.
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]` (docs/cluster.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterConfig {
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
    pub(crate) fn cluster_redis(&self) -> Option<&str> {
        self.cluster.as_ref().and_then(|cluster| cluster.redis.as_deref())
    }
}

/// `[mcp]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpConfig {
    #[serde(default)]
    pub servers: BTreeMap<String, loom::tools::McpServerConfig>,
}

/// `[tools]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsConfig {
    pub bash: Option<BashConfig>,
}

/// `[tools.bash]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BashConfig {
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
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FeedbackConfig {
    pub enabled: Option<bool>,
    pub monitor: Option<bool>,
    pub duplicate_threshold: Option<i64>,
    pub loop_window: Option<i64>,
    pub error_threshold: Option<f64>,
    pub error_window: Option<i64>,
    pub warning_ratio: Option<f64>,
}

/// `[retrieval]`: a folder of documents searched with the user's request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetrievalConfig {
    /// The folder, relative to the config file.
    pub dir: PathBuf,
    /// Passages added to the system prompt (default 5).
    pub limit: Option<usize>,
}

/// `[provider]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderConfig {
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
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PriceConfig {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// `[scheduler]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SchedulerConfig {
    pub max_concurrency: Option<usize>,
    pub tool_timeout_secs: Option<u64>,
    /// Per-tool limits in seconds (`[scheduler.tool_timeouts]`).
    #[serde(default)]
    pub tool_timeouts: BTreeMap<String, u64>,
}

/// Where a configuration came from: what decides whether it must be
/// trusted before it can run commands (docs/security.md).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// No file: built-in defaults.
    #[default]
    None,
    /// Named with `--config`: the person's own choice.
    Explicit,
    /// Found as `./loom.toml`: it came with the project, and anyone who
    /// could write the project (a model included) may have written it.
    Project,
    /// The user's own `~/.config/loom/loom.toml`.
    User,
}

/// A loaded configuration and where it came from.
#[derive(Debug, Default)]
pub(crate) struct LoadedConfig {
    pub file: FileConfig,
    /// The file's directory, for paths written in it.
    pub dir: Option<PathBuf>,
    /// The file itself.
    pub path: Option<PathBuf>,
    pub origin: Origin,
    /// The SHA-256 of the text that was parsed, in hex (what trust records).
    pub digest: String,
    pub notes: Vec<String>,
}

/// Loads `explicit`, or else `./loom.toml`, or else the user's config file.
pub(crate) fn load(explicit: Option<&Path>) -> Result<LoadedConfig> {
    let found = match explicit {
        Some(path) => {
            if !path.is_file() {
                bail!("config file {} does not exist", path.display());
            }
            Some((path.to_path_buf(), Origin::Explicit))
        }
        None => [
            Some((PathBuf::from("loom.toml"), Origin::Project)),
            user_config_file().map(|path| (path, Origin::User)),
        ]
        .into_iter()
        .flatten()
        .find(|(candidate, _)| candidate.is_file()),
    };
    let Some((path, origin)) = found else {
        return Ok(LoadedConfig::default());
    };
    load_file(&path, origin)
}

/// Loads only `explicit` (`loom serve`: never a file found in a workspace).
pub(crate) fn load_explicit(explicit: Option<&Path>) -> Result<LoadedConfig> {
    match explicit {
        Some(_) => load(explicit),
        None => Ok(LoadedConfig::default()),
    }
}

fn load_file(path: &Path, origin: Origin) -> Result<LoadedConfig> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let digest = crate::trust::sha256_hex(text.as_bytes());
    let file: FileConfig = toml::from_str(&text).map_err(|err| {
        // One line that says where: the file, the line, the key when known.
        let line = err
            .span()
            .and_then(|span| text.get(..span.start))
            .map(|before| before.matches('\n').count() + 1);
        let at = line.map(|n| format!(":{n}")).unwrap_or_default();
        let key = line
            .and_then(|n| text.lines().nth(n - 1))
            .and_then(|l| l.split_once('='))
            .map(|(key, _)| format!(" ({})", key.trim()))
            .unwrap_or_default();
        anyhow::anyhow!("{}{at}: {}{key}", path.display(), err.message().trim())
    })?;
    let notes = Vec::new();
    let dir = path.parent().map(|dir| {
        if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_path_buf()
        }
    });
    let path = resolved_dir(&path);
    Ok(LoadedConfig {
        file,
        dir,
        path: Some(path),
        origin,
        digest,
        notes,
    })
}

/// `path` with its directory resolved and its own name kept: a
/// `loom.toml` that is a link is known by where it was found, not by what
/// it points to (trust given to one project's file does not follow a link
/// to it from another project).
pub(crate) fn resolved_dir(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            dir.canonicalize()
                .map(|dir| dir.join(name))
                .unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

pub(crate) fn user_config_file() -> Option<PathBuf> {
    Some(user_config_dir()?.join("loom.toml"))
}

/// `$XDG_CONFIG_HOME/loom`, else `~/.config/loom`.
pub(crate) fn user_config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("loom"))
}

/// A model string from the config file, with a relative script path taken
/// relative to the file's directory.
pub(crate) fn model_from_file(model: &str, dir: Option<&Path>) -> String {
    match (model.strip_prefix("scripted:"), dir) {
        (Some(path), Some(dir)) if Path::new(path).is_relative() => {
            format!("scripted:{}", dir.join(path).display())
        }
        _ => model.to_string(),
    }
}
