//! `[server]` of loom.toml and the limits the gateway runs with.

use std::time::Duration;

pub use loom_config::{ServerSettings, TokenEntry};

use crate::auth::{Grant, Principal, TokenError, Tokens};

/// The tokens of `[[server.tokens]]`: each given in clear or by its
/// digest, never both.
pub(crate) fn tokens_of(entries: &[TokenEntry]) -> Result<Tokens, TokenError> {
    let mut tokens = Tokens::default();
    for entry in entries {
        let principal = Principal::granted(entry.name.as_str(), grant_of(entry));
        match (&entry.token, &entry.token_sha256) {
            (Some(token), None) => tokens.add_clear_for(principal, token)?,
            (None, Some(hex)) => tokens.add_digest_for(principal, hex)?,
            _ => return Err(TokenError::OneOf(entry.name.clone())),
        }
    }
    Ok(tokens)
}

/// What a `[[server.tokens]]` entry grants.
pub fn grant_of(entry: &TokenEntry) -> Grant {
    Grant {
        role: entry.role,
        models: entry.models.clone(),
        tools: entry.tools.clone(),
    }
}

/// The gateway's settings, with defaults filled in.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Who may use the gateway; empty: anyone who can reach it (loopback only).
    pub tokens: Tokens,
    /// Runs executing at once.
    pub max_runs: usize,
    /// Runs executing at once per token.
    pub max_runs_per_token: usize,
    /// Runs waiting, before `OVERLOADED`.
    pub max_queued: usize,
    /// Requests per minute per token.
    pub requests_per_minute: u32,
    /// Largest frame or body.
    pub max_frame_bytes: usize,
    /// Events a subscriber may be behind.
    pub subscriber_buffer: usize,
    /// Between pings.
    pub ping_interval: Duration,
    /// How long a shutdown waits for runs to checkpoint.
    pub shutdown_grace: Duration,
    /// Largest `maxSteps`.
    pub max_steps_limit: u32,
    /// Models a client may name.
    pub models: Vec<String>,
    /// Permission modes a client may ask for.
    pub allowed_modes: Vec<loom_core::Mode>,
    /// Finished runs kept in memory without a store.
    pub keep_finished_runs: usize,
    /// Signs the web page's session cookies. Kept across restarts (the
    /// binary stores it beside the database), a signed-in page survives a
    /// restart; `None` draws one per process.
    pub session_key: Option<[u8; 32]>,
    /// Where signed-out sessions are remembered (beside the session key),
    /// so a sign-out survives a restart; `None` keeps them in memory only.
    pub session_revocations: Option<std::path::PathBuf>,
    /// Origins the page may be served from besides `http://` + Host,
    /// lower-case, without a trailing slash.
    pub allowed_origins: Vec<String>,
    /// For a request's headers (and between keep-alive requests).
    pub header_timeout: Duration,
    /// With no byte moving either way.
    pub idle_timeout: Duration,
    /// For a request's body.
    pub body_timeout: Duration,
    /// Client connections open at once.
    pub max_connections: usize,
}

/// The modes a gateway allows unless `allowed_modes` says otherwise: the
/// two that allow nothing more than the gateway's rules. `accept-edits`
/// and `bypass` let a client's run write (or do anything) where the
/// gateway would deny: the operator lists them.
pub const DEFAULT_MODES: &[loom_core::Mode] = &[loom_core::Mode::Default, loom_core::Mode::Plan];

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            tokens: Tokens::default(),
            max_runs: 64,
            max_runs_per_token: 16,
            max_queued: 1024,
            requests_per_minute: 1200,
            max_frame_bytes: 1 << 20,
            subscriber_buffer: 4096,
            ping_interval: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(10),
            max_steps_limit: 100,
            models: Vec::new(),
            allowed_modes: DEFAULT_MODES.to_vec(),
            keep_finished_runs: 1000,
            session_key: None,
            session_revocations: None,
            allowed_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Connections when neither loom.toml nor the descriptor limit says
/// (`loom serve` derives its default from the limit: `max_connections_for`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 768;

/// The largest `max_connections` loom.toml may give: each connection is a
/// descriptor, and no kernel allows a process more than this by default
/// (Linux's `nr_open`). Far beyond it a value is a typo, and tokio's
/// semaphores (which once held the cap) panic.
pub const MAX_CONNECTIONS_LIMIT: usize = 1 << 20;

/// Descriptors left for connections out of `descriptors`: a quarter of
/// them (at least 64) stay for the store, logs, tools and MCP servers.
fn descriptors_for_connections(descriptors: u64) -> u64 {
    let reserve = (descriptors / 4).max(64);
    descriptors.saturating_sub(reserve)
}

/// The connection cap for a process allowed `descriptors` open files:
/// what `descriptors_for_connections` leaves, at least 16, and never more
/// than 16 384 connections by default (memory).
pub fn max_connections_for(descriptors: u64) -> usize {
    let usable = descriptors_for_connections(descriptors).clamp(16, 16_384);
    usize::try_from(usable).unwrap_or(16_384)
}

/// A configured `max_connections` held under what `descriptors` open
/// files leave for connections (at least 16): more could not be open at
/// once, and reaching the descriptor limit would fail the store and the
/// tools instead of refusing a connection.
pub fn bound_max_connections(configured: usize, descriptors: u64) -> usize {
    let usable = usize::try_from(descriptors_for_connections(descriptors).max(16)).unwrap_or(usize::MAX);
    configured.min(usable)
}

/// The settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A token entry is wrong.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A limit makes no sense.
    #[error("[server] {0}")]
    Invalid(String),
}

impl ServerConfig {
    /// Whether the gateway may listen on `addr`: without a token only on a
    /// loopback address (anyone who can reach it could run agents).
    pub fn may_listen_on(&self, addr: std::net::SocketAddr) -> bool {
        !self.tokens.is_empty() || addr.ip().is_loopback()
    }

    /// The settings of loom.toml, plus `LOOM_TOKEN` (named `default`) when given.
    pub fn from_settings(settings: &ServerSettings, env_token: Option<&str>) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        let mut tokens = tokens_of(&settings.tokens)?;
        // An empty LOOM_TOKEN is no token; one of blanks is a mistake
        // (`add_clear` refuses it), never an open gateway.
        if let Some(token) = env_token.filter(|t| !t.is_empty()) {
            tokens.add_clear("default", token)?;
        }
        let seconds = |name: &str, value: Option<f64>, default: Duration| match value {
            Some(secs) => Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| ConfigError::Invalid(format!("{name} must be a positive number"))),
            None => Ok(default),
        };
        let config = Self {
            tokens,
            max_runs: settings.max_runs.unwrap_or(defaults.max_runs),
            max_runs_per_token: settings.max_runs_per_token.unwrap_or(defaults.max_runs_per_token),
            max_queued: settings.max_queued.unwrap_or(defaults.max_queued),
            requests_per_minute: settings.requests_per_minute.unwrap_or(defaults.requests_per_minute),
            max_frame_bytes: settings.max_frame_bytes.unwrap_or(defaults.max_frame_bytes),
            subscriber_buffer: settings.subscriber_buffer.unwrap_or(defaults.subscriber_buffer),
            ping_interval: match settings.ping_interval_secs {
                Some(secs) => Duration::try_from_secs_f64(secs)
                    .map_err(|_| ConfigError::Invalid("ping_interval_secs must be a positive number".into()))?,
                None => defaults.ping_interval,
            },
            shutdown_grace: settings
                .shutdown_grace_secs
                .map_or(defaults.shutdown_grace, Duration::from_secs),
            max_steps_limit: settings.max_steps_limit.unwrap_or(defaults.max_steps_limit),
            models: settings.models.clone(),
            allowed_modes: match &settings.allowed_modes {
                Some(names) => names
                    .iter()
                    .map(|name| {
                        name.parse()
                            .map_err(|err| ConfigError::Invalid(format!("allowed_modes: {err}")))
                    })
                    .collect::<Result<_, _>>()?,
                None => defaults.allowed_modes,
            },
            keep_finished_runs: settings.keep_finished_runs.unwrap_or(defaults.keep_finished_runs),
            session_key: None,
            session_revocations: None,
            allowed_origins: settings
                .allowed_origins
                .iter()
                .map(|origin| normalize_origin(origin))
                .collect::<Result<_, _>>()?,
            header_timeout: seconds(
                "header_timeout_secs",
                settings.header_timeout_secs,
                defaults.header_timeout,
            )?,
            idle_timeout: seconds("idle_timeout_secs", settings.idle_timeout_secs, defaults.idle_timeout)?,
            body_timeout: seconds("body_timeout_secs", settings.body_timeout_secs, defaults.body_timeout)?,
            max_connections: settings.max_connections.unwrap_or(defaults.max_connections),
        };
        for (name, value) in [
            ("max_runs", config.max_runs),
            ("max_runs_per_token", config.max_runs_per_token),
            ("max_frame_bytes", config.max_frame_bytes),
            ("subscriber_buffer", config.subscriber_buffer),
            ("requests_per_minute", config.requests_per_minute as usize),
            ("max_connections", config.max_connections),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be at least 1")));
            }
        }
        if config.max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(ConfigError::Invalid(format!(
                "max_connections must be at most {MAX_CONNECTIONS_LIMIT} (each connection is a file descriptor)"
            )));
        }
        if config.ping_interval < Duration::from_millis(10) {
            return Err(ConfigError::Invalid("ping_interval_secs must be at least 0.01".into()));
        }
        Ok(config)
    }
}

/// `scheme://host[:port]`, as a browser writes it in `Origin`: lower-case,
/// no path, no trailing slash.
fn normalize_origin(origin: &str) -> Result<String, ConfigError> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .unwrap_or_default();
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(ConfigError::Invalid(format!(
            "allowed_origins: '{origin}' is not an origin such as https://loom.example.com"
        )));
    }
    Ok(origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::token_sha256;

    #[test]
    fn a_token_is_found_by_its_clear_text_or_its_digest() {
        let entries = vec![
            TokenEntry {
                name: "alice".into(),
                token: Some("alice-secret-token-1".into()),
                token_sha256: None,
                ..TokenEntry::default()
            },
            TokenEntry {
                name: "bob".into(),
                token: None,
                token_sha256: Some(token_sha256("bob-secret-token-22")),
                ..TokenEntry::default()
            },
        ];
        let tokens = tokens_of(&entries).unwrap();
        assert_eq!(tokens.check("alice-secret-token-1").unwrap().name(), "alice");
        assert_eq!(tokens.check("bob-secret-token-22").unwrap().name(), "bob");
        assert!(tokens.check("bob-secret-token-2").is_none());
        assert!(tokens.check("").is_none());
        assert!(matches!(
            tokens_of(&[TokenEntry {
                name: "x".into(),
                token: Some("short".into()),
                token_sha256: None,
                ..TokenEntry::default()
            }]),
            Err(TokenError::TooShort(_))
        ));
    }

    #[test]
    fn origins_are_normalized_and_checked() {
        assert_eq!(
            normalize_origin("HTTPS://Loom.Example.com/").unwrap(),
            "https://loom.example.com"
        );
        assert!(normalize_origin("loom.example.com").is_err());
        assert!(normalize_origin("https://loom.example.com/app").is_err());
        assert!(normalize_origin("https://").is_err());
    }

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_rest() {
        assert_eq!(max_connections_for(1024), 768);
        assert_eq!(max_connections_for(100), 36);
        assert_eq!(max_connections_for(10), 16);
        assert_eq!(max_connections_for(1 << 20), 16_384);
    }

    #[test]
    fn a_configured_connection_cap_is_checked_and_held_under_the_descriptors() {
        // Beyond tokio's `Semaphore::MAX_PERMITS` (usize::MAX >> 3): once
        // a panic at start.
        for huge in [usize::MAX >> 2, MAX_CONNECTIONS_LIMIT + 1] {
            let settings = ServerSettings {
                max_connections: Some(huge),
                ..ServerSettings::default()
            };
            let err = ServerConfig::from_settings(&settings, None).unwrap_err();
            assert!(err.to_string().contains("max_connections must be at most"), "{err}");
        }
        let settings = ServerSettings {
            max_connections: Some(MAX_CONNECTIONS_LIMIT),
            ..ServerSettings::default()
        };
        assert_eq!(
            ServerConfig::from_settings(&settings, None).unwrap().max_connections,
            MAX_CONNECTIONS_LIMIT
        );
        // The operator may go past the default's 16 384, not past the
        // descriptors.
        assert_eq!(bound_max_connections(100_000, 256), 192);
        assert_eq!(bound_max_connections(100, 256), 100);
        assert_eq!(bound_max_connections(100_000, 1 << 20), 100_000);
        assert_eq!(bound_max_connections(1 << 20, 1 << 20), 786_432);
        assert_eq!(bound_max_connections(100, 10), 16);
    }
}
