//! `[server]` of loom.toml: the gateway's settings as written (the gateway
//! turns them into the limits it runs with), its tokens and their roles.

use serde::{Deserialize, Serialize};

/// `[server]` as written in loom.toml.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// `[[server.tokens]]`: who may use the gateway.
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
    /// Runs executing at once, over all tokens (default 64).
    pub max_runs: Option<usize>,
    /// Runs executing at once per token (default 16).
    pub max_runs_per_token: Option<usize>,
    /// Runs waiting for a slot, over all tokens, before submissions are
    /// refused with `OVERLOADED` (default 1024).
    pub max_queued: Option<usize>,
    /// Requests per minute per token (WebSocket requests and HTTP calls
    /// alike) before `RATE_LIMITED` (default 1200).
    pub requests_per_minute: Option<u32>,
    /// Largest WebSocket frame or HTTP body in bytes (default 1 MiB).
    pub max_frame_bytes: Option<usize>,
    /// Events a subscriber may be behind before it is dropped (default 4096).
    pub subscriber_buffer: Option<usize>,
    /// Seconds between WebSocket pings; a connection silent for two of
    /// them is closed (default 20).
    pub ping_interval_secs: Option<f64>,
    /// Seconds a shutdown waits for live runs to checkpoint (default 10).
    pub shutdown_grace_secs: Option<u64>,
    /// The largest `maxSteps` a client may ask for (default 100).
    pub max_steps_limit: Option<u32>,
    /// Models a client may name in `model`, besides the default one.
    #[serde(default)]
    pub models: Vec<String>,
    /// Permission modes a client may ask for in `mode` (default:
    /// `default` and `plan`; `accept-edits` and `bypass` only when listed).
    pub allowed_modes: Option<Vec<String>>,
    /// Finished runs kept in memory when there is no store (default 1000).
    pub keep_finished_runs: Option<usize>,
    /// Origins besides `http://` + the request's Host that the web page
    /// may be served from, e.g. `https://loom.example.com` for a gateway
    /// behind a TLS proxy (docs/server.md, "Web page origin").
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Seconds a connection gets to send a request's headers, counted from
    /// its opening and from the end of the previous response (default 10).
    pub header_timeout_secs: Option<f64>,
    /// Seconds a connection may move no byte either way before it is
    /// closed (default 60).
    pub idle_timeout_secs: Option<f64>,
    /// Seconds a request gets to send its whole body (default 30).
    pub body_timeout_secs: Option<f64>,
    /// Client connections open at once; at the cap the one waiting
    /// longest for a request is closed for a newcomer, and a newcomer is
    /// answered 503 only when none is (default: from the process's
    /// descriptor limit; at most `MAX_CONNECTIONS_LIMIT`).
    pub max_connections: Option<usize>,
}

/// One `[[server.tokens]]` entry: a name and the token, or its SHA-256;
/// its role and limits.
#[derive(Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who holds it: runs are recorded under this name.
    pub name: String,
    /// The token itself.
    pub token: Option<String>,
    /// The token's SHA-256 as 64 hex digits, so the file holds no secret.
    pub token_sha256: Option<String>,
    /// `admin`, `operator` (the default) or `viewer` (docs/server.md, "Roles").
    #[serde(default)]
    pub role: Role,
    /// The only models the token's runs may use.
    pub models: Option<Vec<String>>,
    /// The only tools the token's runs may have.
    pub tools: Option<Vec<String>>,
}

impl std::fmt::Debug for TokenEntry {
    // Never print a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// What a token may do (`role` in `[[server.tokens]]`, docs/server.md,
/// "Roles").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees and controls every token's runs, and reads the audit trail.
    Admin,
    /// Starts, steers, answers and cancels its own runs.
    #[default]
    Operator,
    /// Sees its own runs and their events; changes nothing.
    Viewer,
}

impl Role {
    /// As written in loom.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Operator => "operator",
            Self::Viewer => "viewer",
        }
    }
}
