//! MCP client tools: every tool of the configured Model Context Protocol
//! servers (`[mcp.servers.NAME]`, docs/tools.md), offered as `NAME__tool` and
//! run through the whole pipeline like any other tool.
//!
//! - **Stdio servers** run in a process group of their own, with an
//!   environment cleared to an allowlist plus their `env`, stderr always
//!   drained into the log, and a parent-death signal; shutdown closes
//!   stdin, then SIGTERM and SIGKILL go to the group.
//! - **Streamable HTTP servers** are reached at their `url`.
//! - Start-up is bounded by `startup_timeout_secs`; every call by a
//!   timeout. A call Loom gives up on (timeout, cancel) is cancelled at the
//!   server with `notifications/cancelled`.
//! - A server that dies fails its calls at once and is restarted on next
//!   use, with backoff when it keeps dying.
//! - `notifications/tools/list_changed` refreshes the list; a run picks it
//!   up before its next model call ([`loom_core::ToolSource`]).

mod config;
mod connection;
mod listing;
mod server;
mod tool;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use loom_core::{DynTool, ToolSource};

pub use config::{Endpoint, McpConfigError, McpServerConfig};
use server::CallError;
pub use server::{McpServer, ServerState};
use tool::McpTool;

use crate::shell::Isolation;

/// The configured MCP servers, as one source of tools.
#[derive(Debug)]
pub struct McpClients {
    servers: Vec<Arc<McpServer>>,
}

/// What `start` found for one server.
#[derive(Debug, Clone)]
pub struct StartReport {
    /// The server.
    pub server: String,
    /// Its tools offered, or why it is not available.
    pub outcome: Result<usize, String>,
}

impl McpClients {
    /// The servers of `configs`; stdio servers run in `workspace` unless
    /// they name a `cwd`, in namespaces of their own without privileges
    /// (see [`McpClients::isolated`]). Nothing starts yet.
    pub fn new(configs: &BTreeMap<String, McpServerConfig>, workspace: &Path) -> Result<Self, McpConfigError> {
        Self::isolated(configs, workspace, Isolation::default())
    }

    /// As [`McpClients::new`], with stdio servers kept from `isolation`'s
    /// paths (Loom's state hidden, its configuration read-only), as
    /// `bash`'s commands are (docs/security.md).
    pub fn isolated(
        configs: &BTreeMap<String, McpServerConfig>,
        workspace: &Path,
        isolation: Isolation,
    ) -> Result<Self, McpConfigError> {
        let isolation = Arc::new(isolation);
        let mut servers = Vec::new();
        for (name, config) in configs {
            let endpoint = config.endpoint(name)?;
            let dir = config.cwd.clone().unwrap_or_else(|| workspace.to_path_buf());
            servers.push(McpServer::new(
                name.clone(),
                config.clone(),
                endpoint,
                dir,
                isolation.clone(),
            ));
        }
        Ok(Self { servers })
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The servers, in name order.
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// Starts every enabled server at once, each within its start-up
    /// limit. A server that fails is reported (and tried again on use).
    pub async fn start(&self) -> Vec<StartReport> {
        let starts = self
            .servers
            .iter()
            .filter(|server| server.is_enabled())
            .map(|server| async move {
                let outcome = match server.connection().await {
                    Ok(_) => Ok(server.tool_infos().len()),
                    // The report names the server already.
                    Err(CallError::Unavailable { why, .. }) => Err(why),
                    Err(err) => Err(err.to_string()),
                };
                StartReport {
                    server: server.name().to_string(),
                    outcome,
                }
            });
        futures_util::future::join_all(starts).await
    }

    /// Stops every server; none outlives this call.
    pub async fn shutdown(&self) {
        futures_util::future::join_all(self.servers.iter().map(|server| server.shutdown())).await;
    }

    /// The same tools, only those named in `names` (a gateway client's
    /// choice of tools).
    pub fn only(self: &Arc<Self>, names: Vec<String>) -> Arc<dyn ToolSource> {
        Arc::new(Only {
            clients: self.clone(),
            names,
        })
    }

    /// Every tool name offered now.
    pub fn tool_names(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|server| {
                server
                    .tool_infos()
                    .iter()
                    .map(|info| info.name.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// How long a run waits for a tool list being fetched again.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

impl ToolSource for McpClients {
    fn generation(&self) -> u64 {
        self.servers.iter().map(|server| server.generation()).sum()
    }

    fn settle(&self) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            for server in &self.servers {
                server.retry_if_due();
            }
            futures_util::future::join_all(self.servers.iter().map(|server| server.settle(SETTLE_LIMIT))).await;
        })
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        self.servers
            .iter()
            .flat_map(|server| {
                server
                    .tool_infos()
                    .iter()
                    .map(|info| {
                        Arc::new(McpTool {
                            info: info.clone(),
                            server: server.clone(),
                        }) as Arc<dyn DynTool>
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// A subset of the servers' tools, by name.
struct Only {
    clients: Arc<McpClients>,
    names: Vec<String>,
}

impl ToolSource for Only {
    fn generation(&self) -> u64 {
        self.clients.generation()
    }

    fn settle(&self) -> futures_util::future::BoxFuture<'_, ()> {
        self.clients.settle()
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        let mut tools = self.clients.tools();
        tools.retain(|tool| self.names.iter().any(|name| name == tool.name()));
        tools
    }
}
