//! The real `loom serve` a fault scenario runs against, and what the
//! scenario asks of it over HTTP: start runs, wait for their ends, read
//! their errors. The gateway's log goes to a file, read for panics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

pub(crate) const TOKEN: &str = "faults-bench-token-0123456789";

/// A `loom serve` process, killed on drop.
pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) addr: String,
    pub(crate) log: PathBuf,
    pub(crate) http: reqwest::Client,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `dir/loom.toml`: the fake model at `model_url` with three
/// attempts per call, one token, limits that do not throttle; `top` goes
/// before the first table.
pub(crate) fn write_config(dir: &Path, model_url: &str, top: &str) -> Result<()> {
    std::fs::write(
        dir.join("loom.toml"),
        format!(
            r#"model = "openai:fake"
{top}
[provider]
base_url = "{model_url}"
max_attempts = 3

[feedback]
monitor = false

[server]
max_runs = 64
max_queued = 10000
max_runs_per_token = 64
requests_per_minute = 100000000

[[server.tokens]]
name = "faults"
token = "{TOKEN}"
"#
        ),
    )?;
    Ok(())
}

/// `loom serve` in `dir` with `args`, its log in `dir/gateway-N.log`;
/// waits until it listens (or exits: the error is its log).
pub(crate) fn start(loom: &Path, dir: &Path, state: &Path, args: &[&str]) -> Result<Gateway> {
    start_with(loom, dir, state, args, &[])
}

/// [`start`] with more environment (`env`).
pub(crate) fn start_with(
    loom: &Path,
    dir: &Path,
    state: &Path,
    args: &[&str],
    env: &[(&str, String)],
) -> Result<Gateway> {
    let mut n = 0;
    let log = loop {
        let log = dir.join(format!("gateway-{n}.log"));
        if !log.exists() {
            break log;
        }
        n += 1;
    };
    let child = Command::new(loom)
        .args(["serve", "--addr", "127.0.0.1:0", "--allow", "bash", "--config"])
        .arg(dir.join("loom.toml"))
        .arg("--workspace")
        .arg(dir)
        .args(args)
        .env("OPENAI_API_KEY", "faults")
        .env("LOOM_STATE_DIR", state)
        .env("LOOM_LOG", "info")
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("cannot start {} (cargo build --release -p loom-cli)", loom.display()))?;
    let mut gateway = Gateway {
        child,
        addr: String::new(),
        log,
        http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?,
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let text = std::fs::read_to_string(&gateway.log).unwrap_or_default();
        if let Some(rest) = text.split("listening on http://").nth(1) {
            gateway.addr = rest.split_whitespace().next().unwrap_or_default().to_string();
            return Ok(gateway);
        }
        if let Some(status) = gateway.child.try_wait()? {
            bail!("loom serve exited ({status}): {}", text.trim());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "loom serve did not start: {}",
        std::fs::read_to_string(&gateway.log).unwrap_or_default()
    )
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Starts a run: its id, or the error code the gateway answered.
    pub(crate) async fn submit(&self, prompt: &str) -> Result<String, String> {
        let response = self
            .http
            .post(self.url("/v1/runs"))
            .bearer_auth(TOKEN)
            .json(&json!({"prompt": prompt}))
            .send()
            .await
            .map_err(|err| format!("no answer: {err}"))?;
        let body: Value = response.json().await.map_err(|err| format!("no JSON: {err}"))?;
        match body["runId"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => Err(body["error"]["code"].as_str().unwrap_or("UNTYPED").to_string()),
        }
    }

    /// The run's status as the gateway shows it.
    pub(crate) async fn status(&self, run_id: &str) -> Option<String> {
        let response = self
            .http
            .get(self.url(&format!("/v1/runs/{run_id}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .ok()?;
        let body: Value = response.json().await.ok()?;
        body["status"].as_str().map(str::to_string)
    }

    /// Waits until every run of `ids` has ended (or `patience` is over):
    /// each id with its last status seen.
    pub(crate) async fn wait_all(&self, ids: &[String], patience: Duration) -> Vec<(String, String)> {
        let started = Instant::now();
        let mut ended: Vec<(String, String)> = Vec::new();
        let mut open: Vec<String> = ids.to_vec();
        while !open.is_empty() && started.elapsed() < patience {
            let mut still = Vec::new();
            for id in open {
                match self.status(&id).await {
                    Some(status) if is_terminal(&status) => ended.push((id, status)),
                    _ => still.push(id),
                }
            }
            open = still;
            if !open.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for id in open {
            let status = self.status(&id).await.unwrap_or_else(|| "UNKNOWN".into());
            ended.push((id, status));
        }
        ended
    }

    /// The run's events as the SSE route gives them.
    pub(crate) async fn events_text(&self, run_id: &str) -> String {
        let response = self
            .http
            .get(self.url(&format!("/v1/runs/{run_id}/events")))
            .bearer_auth(TOKEN)
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match response {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The code of the run's `error` event, if it has one.
    pub(crate) async fn error_code(&self, run_id: &str) -> Option<String> {
        let text = self.events_text(run_id).await;
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .filter(|event| event["type"] == "error")
            .find_map(|event| event["code"].as_str().map(str::to_string))
    }

    /// Whether `/healthz` answers.
    pub(crate) async fn healthy(&self) -> bool {
        self.http
            .get(self.url("/healthz"))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
    }

    /// Runs the gateway took back after its store failed under them.
    pub(crate) fn took_back(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("the interrupted run is taken back"))
            .count()
    }

    /// Lines of the gateway's log that report a panic.
    pub(crate) fn panics(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("panicked"))
            .count()
    }
}

/// An end a run does not come back from. `INTERRUPTED` is not one: a
/// gateway takes back a run its store failed under once the store answers.
pub(crate) fn is_terminal(status: &str) -> bool {
    matches!(status, "DONE" | "ERROR" | "CANCELED" | "TIMEOUT")
}

/// Lines of `effects` written more than once (each step appends one line
/// naming its run and step: a repeat is a side effect that ran twice).
pub(crate) fn repeated_effects(effects: &Path) -> usize {
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut lines: Vec<&str> = text.lines().collect();
    let all = lines.len();
    lines.sort_unstable();
    lines.dedup();
    all - lines.len()
}

/// A run's prompt: `steps` tool turns, each appending `TAG-STEP` to
/// `effects.txt`, and `more` directives (`long=40`).
pub(crate) fn prompt(tag: &str, steps: usize, more: &str) -> String {
    format!("fault steps={steps} tool=bash bash=echo+{tag}-STEP+>>+effects.txt {more}")
}
