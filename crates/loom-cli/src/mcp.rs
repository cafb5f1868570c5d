//! The MCP servers of loom.toml in the binary: started once per process
//! (every agent of `loom serve` shares them), stopped before the process
//! exits, and listed by `loom mcp list`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use loom::tools::mcp::{Endpoint, ServerState};
use loom::tools::McpClients;
use serde_json::json;

use crate::config::{self, FileConfig};
use crate::exit::Failure;

/// Started once: agents built at the same time (two first runs of
/// `loom serve`) wait for the one start.
static CLIENTS: tokio::sync::OnceCell<Option<Arc<McpClients>>> = tokio::sync::OnceCell::const_new();

/// The process's MCP servers, started on first use (a failed start is a
/// warning: the server is tried again when one of its tools is called).
/// `None` when loom.toml configures none.
pub(crate) async fn clients(
    file: &FileConfig,
    workspace: &Path,
    isolation: loom::tools::Isolation,
) -> Result<Option<Arc<McpClients>>> {
    let clients = CLIENTS
        .get_or_try_init(|| async {
            let Some(servers) = file
                .mcp
                .as_ref()
                .map(|mcp| &mcp.servers)
                .filter(|servers| !servers.is_empty())
            else {
                return Ok(None);
            };
            let clients = Arc::new(
                McpClients::isolated(servers, workspace, isolation).map_err(|err| anyhow!("loom.toml: {err}"))?,
            );
            for report in clients.start().await {
                if let Err(why) = report.outcome {
                    say!("loom: warning: MCP server '{}' is not available: {why}", report.server);
                }
            }
            Ok::<_, anyhow::Error>(Some(clients))
        })
        .await?;
    Ok(clients.clone())
}

/// Stops every MCP server this process started: none outlives loom.
pub(crate) async fn shutdown() {
    if let Some(Some(clients)) = CLIENTS.get() {
        clients.shutdown().await;
    }
}

/// `loom mcp list`: starts each server, prints its state and tools, stops it.
pub(crate) async fn list(
    config_path: Option<&Path>,
    workspace: Option<&Path>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let loaded = config::load(config_path).map_err(Failure::Usage)?;
    if let Some(trusted) = crate::trust::require(&loaded, true).map_err(Failure::Usage)? {
        crate::trust_records::audit(trusted).await;
    }
    let workspace = match workspace {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|err| Failure::Usage(err.into()))?,
    };
    let servers = loaded
        .file
        .mcp
        .as_ref()
        .map(|mcp| mcp.servers.clone())
        .unwrap_or_default();
    let hidden = {
        let (loaded, workspace) = (loaded.clone(), workspace.clone());
        tokio::task::spawn_blocking(move || crate::hidden::Hidden::of(&loaded, &workspace, Vec::new()))
            .await
            .map_err(|err| Failure::Usage(anyhow!("finding Loom's places failed: {err}")))?
    };
    let bwrap = crate::shell_settings::bash_settings(&loaded.file, &workspace, false)
        .map_err(Failure::Usage)?
        .0
        .bwrap;
    let clients = Arc::new(
        McpClients::isolated(&servers, &workspace, hidden.isolation(bwrap))
            .map_err(|err| Failure::Usage(anyhow!("loom.toml: {err}")))?,
    );
    // Kept where `shutdown` finds it: a signal that ends the listing early
    // still stops every server that is up (stdin closed, then SIGTERM and
    // SIGKILL); one still in its handshake is killed with its group.
    let _ = CLIENTS.set(Some(clients.clone()));
    clients.start().await;
    let mut shown = Vec::new();
    for server in clients.servers() {
        let tools: Vec<_> = loom::ToolSource::tools(clients.as_ref())
            .into_iter()
            .filter(|tool| tool.name().starts_with(&format!("{}__", server.name())))
            .map(|tool| (tool.name().to_string(), tool.description().to_string()))
            .collect();
        let transport = match server.endpoint() {
            Endpoint::Stdio { command, .. } => format!("stdio: {command}"),
            Endpoint::Http { url } => format!("http: {url}"),
        };
        shown.push((server.clone(), transport, tools));
    }
    if json {
        for (server, transport, tools) in &shown {
            let line = json!({
                "server": server.name(),
                "state": state_name(&server.state()),
                "error": match server.state() { ServerState::Down(why) => Some(why), _ => None },
                "transport": transport,
                "tools": tools.iter().map(|(name, description)| json!({"name": name, "description": description})).collect::<Vec<_>>(),
                "skipped": server.skipped_tools(),
            });
            println!("{line}");
        }
    } else if shown.is_empty() {
        println!("no MCP servers configured ([mcp.servers.NAME] in loom.toml)");
    }
    if !json {
        for (server, transport, tools) in &shown {
            println!(
                "{}  {}  ({transport}, {} tools)",
                server.name(),
                server.state(),
                tools.len()
            );
            for (name, description) in tools {
                let first = description.lines().next().unwrap_or("");
                println!("  {name}  {}", crate::text::clip(first, 79));
            }
            for skipped in server.skipped_tools() {
                println!("  skipped: {skipped}");
            }
            if matches!(server.state(), ServerState::Down(_)) {
                let stderr = server.stderr_tail();
                for line in stderr.iter().skip(stderr.len().saturating_sub(STDERR_SHOWN)) {
                    println!("  stderr: {line}");
                }
            }
        }
    }
    // A script (or a health check) can tell that a server did not start.
    let any_down = shown
        .iter()
        .any(|(server, _, _)| matches!(server.state(), ServerState::Down(_)));
    clients.shutdown().await;
    Ok(if any_down {
        ExitCode::from(crate::exit::ERROR)
    } else {
        ExitCode::SUCCESS
    })
}

/// The last lines of a down server's stderr that `loom mcp list` shows.
const STDERR_SHOWN: usize = 8;

fn state_name(state: &ServerState) -> &'static str {
    match state {
        ServerState::Disabled => "disabled",
        ServerState::Idle => "idle",
        ServerState::Ready => "ready",
        ServerState::Down(_) => "down",
        ServerState::Stopped => "stopped",
    }
}
