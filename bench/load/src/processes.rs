//! The `loom` processes the cluster benches start (`loom-kill-campaign`,
//! `loom-parked`): each killed on drop, started in a workspace with its
//! loom.toml and waited for until it says it is ready.

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
