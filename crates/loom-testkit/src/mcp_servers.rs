//! The real MCP servers Loom's tests run against, installed by
//! `tests/mcp/install.sh` (which `.ci/run` calls): the pinned npm servers
//! `@modelcontextprotocol/server-everything` and `server-filesystem`, the
//! Python `mcp-server-time`, and the stdlib-only fixture server of
//! `tests/mcp/fixture_server.py`. A test that needs one and finds it
//! missing fails and says how to install it — it never skips silently.

use std::path::{Path, PathBuf};

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the servers are installed: `LOOM_MCP_SERVERS`, else
/// `target/mcp-servers`.
pub fn install_dir() -> PathBuf {
    std::env::var_os("LOOM_MCP_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/mcp-servers"))
}

/// How to start one server: a program, its arguments and extra variables.
#[derive(Debug, Clone)]
pub struct ServerCommand {
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables it needs.
    pub env: Vec<(String, String)>,
}

impl ServerCommand {
    /// As a `[mcp.servers.NAME]` table of loom.toml, with `extra` variables.
    pub fn toml(&self, name: &str, extra_env: &[(&str, &str)], more: &str) -> String {
        let args: Vec<String> = self.args.iter().map(|arg| format!("{arg:?}")).collect();
        let env: Vec<String> = self
            .env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .chain(extra_env.iter().copied())
            .map(|(name, value)| format!("{name} = {value:?}"))
            .collect();
        format!(
            "[mcp.servers.{name}]\ncommand = {:?}\nargs = [{}]\nenv = {{ {} }}\n{more}\n",
            self.command,
            args.join(", "),
            env.join(", ")
        )
    }
}

fn require(path: PathBuf, what: &str) -> PathBuf {
    if !path.exists() {
        panic!(
            "{what} is not installed at {}: run `bash tests/mcp/install.sh` (or set LOOM_MCP_SERVERS to where it is)",
            path.display()
        );
    }
    path
}

fn node() -> String {
    if std::process::Command::new("node").arg("--version").output().is_err() {
        panic!("node is not installed: the MCP tests need Node.js (tests/mcp/install.sh installs it)");
    }
    "node".to_string()
}

fn npm_server(package: &str) -> String {
    let entry = install_dir()
        .join("npm/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    require(entry, &format!("@modelcontextprotocol/{package}"))
        .display()
        .to_string()
}

/// `@modelcontextprotocol/server-everything` over stdio.
pub fn everything() -> ServerCommand {
    ServerCommand {
        command: node(),
        args: vec![npm_server("server-everything"), "stdio".to_string()],
        env: Vec::new(),
    }
}

/// `@modelcontextprotocol/server-filesystem`, allowed `root`.
pub fn filesystem(root: &Path) -> ServerCommand {
    ServerCommand {
        command: node(),
        args: vec![npm_server("server-filesystem"), root.display().to_string()],
        env: Vec::new(),
    }
}

/// The Python `mcp-server-time`.
pub fn time() -> ServerCommand {
    let dir = require(install_dir().join("py/mcp_server_time"), "mcp-server-time");
    let site = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    ServerCommand {
        command: "python3".to_string(),
        args: vec![
            "-m".to_string(),
            "mcp_server_time".to_string(),
            "--local-timezone".to_string(),
            "UTC".to_string(),
        ],
        env: vec![("PYTHONPATH".to_string(), site.display().to_string())],
    }
}

/// The fixture server (hangs, crashes, floods, forks on request).
pub fn fixture() -> ServerCommand {
    let script = require(
        repo().join("tests/mcp/fixture_server.py"),
        "tests/mcp/fixture_server.py",
    );
    ServerCommand {
        command: "python3".to_string(),
        args: vec![script.display().to_string()],
        env: Vec::new(),
    }
}

/// Pids of live processes whose environment holds `NAME=VALUE` — the
/// processes of servers started with that marker, and their children.
pub fn processes_with_env(name: &str, value: &str) -> Vec<u32> {
    let needle = format!("{name}={value}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|stat| {
                    stat.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
                })
                .ok()
                .flatten()
                .unwrap_or(true);
            !zombie
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| env.split(|&b| b == 0).any(|entry| entry == needle.as_bytes()))
                    .unwrap_or(false)
        })
        .collect()
}
