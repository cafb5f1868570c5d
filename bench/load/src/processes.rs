//! The `loom` processes the cluster benches start (`loom-kill-campaign`,
//! `loom-parked`): each killed on drop, started in a workspace with its
//! loom.toml (`write_cluster_config`) and waited for until it says it is
//! ready.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

/// A process killed on drop.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `loom` with `args` in `dir` (its `loom.toml`, Loom's state in
/// `state`); waits for the line holding `ready` on its stderr and returns
/// the word after it. Its warnings and errors go to this stderr.
pub(crate) fn start(loom: &Path, dir: &Path, state: &Path, args: &[&str], ready: &str) -> Result<(Process, String)> {
    let mut child = Command::new(loom)
        .args(args)
        .arg("--config")
        .arg(dir.join("loom.toml"))
        .arg("--workspace")
        .arg(dir)
        .env("OPENAI_API_KEY", "bench")
        .env("LOOM_STATE_DIR", state)
        .env("LOOM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {} (cargo build --release -p loom-cli)", loom.display()))?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split(&ready).nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            } else if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("{line}");
            }
        }
    });
    let found = rx
        .recv_timeout(Duration::from_secs(30))
        .with_context(|| format!("{args:?} did not start"))?;
    Ok((Process(child), found))
}

/// Writes `dir/loom.toml` for a cluster bench: the fake model at
/// `model_url`, Redis at `redis_url`, one token, no limits that would
/// throttle the bench; `top` goes before the first table, `cluster` into
/// `[cluster]`.
pub(crate) fn write_cluster_config(
    dir: &Path,
    model_url: &str,
    redis_url: &str,
    token: (&str, &str),
    top: &str,
    cluster: &str,
) -> Result<()> {
    let (name, secret) = token;
    std::fs::write(
        dir.join("loom.toml"),
        format!(
            r#"model = "openai:fake"
{top}
[provider]
base_url = "{model_url}"
max_attempts = 1

[feedback]
monitor = false

[server]
max_queued = 100000
max_runs_per_token = 100000
requests_per_minute = 100000000

[[server.tokens]]
name = "{name}"
token = "{secret}"

[cluster]
redis = "{redis_url}"
{cluster}
"#
        ),
    )?;
    Ok(())
}
