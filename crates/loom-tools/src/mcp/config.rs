//! `[mcp.servers.NAME]` (docs/tools.md): how to reach one MCP server.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// One server's settings: `command` (stdio) or `url` (streamable HTTP).
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program of a stdio server.
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables it gets besides the allowlist (these may be secrets: the
    /// server needs them and the user put them here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory (default: the workspace).
    pub cwd: Option<std::path::PathBuf>,
    /// The endpoint of a streamable HTTP server.
    pub url: Option<String>,
    /// Limit of one call (default: the scheduler's tool timeout).
    pub timeout_secs: Option<u64>,
    /// Limit of start-up and the first tool list (default 30 s).
    pub startup_timeout_secs: Option<u64>,
    /// `false` keeps the server configured but off.
    pub enabled: Option<bool>,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A child process speaking JSON-RPC on stdin/stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// Streamable HTTP.
    Http {
        /// The URL.
        url: String,
    },
}

/// A configuration that makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum McpConfigError {
    /// Neither or both of `command` and `url`.
    #[error("mcp server '{0}': give either `command` (stdio) or `url` (streamable HTTP)")]
    Endpoint(String),
    /// The name cannot prefix tool names.
    #[error("mcp server name '{0}' is invalid: use letters, digits, '_' or '-' (at most 32)")]
    Name(String),
}

impl McpServerConfig {
    /// Whether the server is on (default yes).
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The start-up limit.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_secs(self.startup_timeout_secs.unwrap_or(30).max(1))
    }

    /// The per-call limit, if set (0 is none).
    pub fn call_timeout(&self) -> Option<Duration> {
        self.timeout_secs.filter(|secs| *secs > 0).map(Duration::from_secs)
    }

    /// The endpoint, checked.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint, McpConfigError> {
        check_name(name)?;
        match (&self.command, &self.url) {
            (Some(command), None) => Ok(Endpoint::Stdio {
                command: command.clone(),
                args: self.args.clone(),
            }),
            (None, Some(url)) => Ok(Endpoint::Http { url: url.clone() }),
            _ => Err(McpConfigError::Endpoint(name.to_string())),
        }
    }
}

fn check_name(name: &str) -> Result<(), McpConfigError> {
    let valid =
        !name.is_empty() && name.len() <= 32 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(McpConfigError::Name(name.to_string()))
    }
}
