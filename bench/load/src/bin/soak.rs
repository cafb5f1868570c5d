//! A soak (bench/README.md, "Soak"): one `loom serve` on its SQLite store,
//! runs started wave after wave over WebSocket against a fake model that
//! answers at once (compressed time), until at least `--events` events have
//! reached the clients. After every wave it samples the gateway's resident
//! memory, open descriptors, threads and the live runs it reports, and the
//! database's size; at the end it prints the curve's start, middle and end,
//! so growth shows. Every run must end DONE.
//!
//!   loom-soak [--events N] [--wave W] [--loom PATH]

use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "../processes.rs"]
#[allow(dead_code)] // the cluster benches' config writer is not used here
mod processes;
#[path = "../readings.rs"]
mod readings;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use loom_testkit::{PromptModel, PromptModelOptions};
use processes::start;
use readings::{gauge, status_field};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "soak-bench-token-0123456789";
/// What each run does: two tool turns, then an answer of 40 chunks.
const PROMPT: &str = "soak steps=2 long=40";

struct Sample {
    events: u64,
    runs: u64,
    rss_mb: f64,
    /// Of it, the heap and other anonymous memory; the rest is files and
    /// shared memory mapped (SQLite's WAL index among them).
    anon_mb: f64,
    fds: usize,
    threads: u64,
    db_mb: f64,
    active: f64,
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// The database's size with its write-ahead log, in MB.
fn db_mb(state: &std::path::Path) -> f64 {
    let mut bytes = 0;
    let mut stack = vec![state.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("loom.db"))
            {
                bytes += entry.metadata().map_or(0, |meta| meta.len());
            }
        }
    }
    bytes as f64 / 1_048_576.0
}

/// Runs one connection starts at once: well under the gateway's requests
/// in progress per connection.
const PER_CONNECTION: usize = 20;

/// One wave: `runs` runs, [`PER_CONNECTION`] per WebSocket; the events read.
async fn wave(addr: &str, runs: usize) -> Result<u64> {
    let mut connections = Vec::new();
    let mut left = runs;
    while left > 0 {
        let here = left.min(PER_CONNECTION);
        left -= here;
        connections.push(tokio::spawn(connection(addr.to_string(), here)));
    }
    let mut events = 0;
    for connection in connections {
        events += connection.await??;
    }
    Ok(events)
}

/// `runs` runs over one WebSocket; the events read.
async fn connection(addr: String, runs: usize) -> Result<u64> {
    let mut request = format!("ws://{addr}/ws").into_client_request()?;
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {TOKEN}").parse()?);
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await?;
    for id in 0..runs {
        let frame = json!({"type": "request", "id": id, "method": "agent.run", "payload": {"prompt": PROMPT}});
        socket.send(Message::text(frame.to_string())).await?;
    }
    let (mut ended, mut events) = (0, 0u64);
    while ended < runs {
        let message = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .context("no frame for 60 s")?
            .ok_or_else(|| anyhow!("the connection closed"))??;
        let Message::Text(text) = message else { continue };
        let frame: Value = serde_json::from_str(text.as_str())?;
        if frame["type"] == "response" && frame["ok"] == false {
            bail!("refused: {frame}");
        }
        if frame["type"] != "event" {
            continue;
        }
        events += 1;
        if frame["event"] == "lifecycle.end" && frame["payload"]["parentRunId"].is_null() {
            if frame["payload"]["status"] != "DONE" {
                bail!("a run ended {}", frame["payload"]["status"]);
            }
            ended += 1;
        }
    }
    let _ = socket.close(None).await;
    Ok(events)
}

fn print_sample(label: &str, sample: &Sample) {
    println!(
        "{label:<6} events={:>9} runs={:>6} rss_mb={:>7.1} anon_mb={:>7.1} fds={:>4} threads={:>3} live_runs={:>3} db_mb={:>8.1}",
        sample.events,
        sample.runs,
        sample.rss_mb,
        sample.anon_mb,
        sample.fds,
        sample.threads,
        sample.active,
        sample.db_mb
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut target_events: u64 = 1_000_000;
    let mut wave_size = 200;
    let mut loom = PathBuf::from("target/release/loom");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--events" => target_events = value()?.parse()?,
            "--wave" => wave_size = value()?.parse()?,
            "--loom" => loom = PathBuf::from(value()?),
            _ => bail!("loom-soak [--events N] [--wave W] [--loom PATH]"),
        }
    }
    let model = PromptModel::start(PromptModelOptions::default());
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("loom.toml"),
        format!(
            r#"model = "openai:fake"
[provider]
base_url = "{}"
max_attempts = 1

[feedback]
monitor = false

[server]
max_runs = {wave_size}
max_runs_per_token = {wave_size}
requests_per_minute = 100000000

[[server.tokens]]
name = "soak"
token = "{TOKEN}"
"#,
            model.url()
        ),
    )?;
    let loom = loom
        .canonicalize()
        .with_context(|| format!("{} (cargo build --release -p loom-cli)", loom.display()))?;
    let (server, addr) = start(
        &loom,
        dir.path(),
        state.path(),
        &["serve", "--addr", "127.0.0.1:0"],
        "listening on http://",
    )?;
    let pid = server.0.id();
    let http = reqwest::Client::new();
    let sample = |events: u64, runs: u64, metrics: String| Sample {
        events,
        runs,
        rss_mb: status_field(pid, "VmRSS:") as f64 / 1024.0,
        anon_mb: status_field(pid, "RssAnon:") as f64 / 1024.0,
        fds: open_fds(pid),
        threads: status_field(pid, "Threads:"),
        db_mb: db_mb(state.path()),
        active: gauge(&metrics, "loom_runs_active "),
    };
    let metrics = || async {
        http.get(format!("http://{addr}/metrics"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    };
    let started = Instant::now();
    let mut samples = vec![sample(0, 0, metrics().await.unwrap_or_default())];
    let (mut events, mut runs) = (0u64, 0u64);
    while events < target_events {
        events += wave(&addr, wave_size).await?;
        runs += wave_size as u64;
        samples.push(sample(events, runs, metrics().await.unwrap_or_default()));
    }
    let wall = started.elapsed();
    // Settled: a moment for the last runs' tasks and connections to go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = sample(events, runs, metrics().await.unwrap_or_default());
    println!(
        "soak: {events} events, {runs} runs ({} waves of {wave_size}) in {:.0} s ({:.0} events/s), every run DONE",
        samples.len() - 1,
        wall.as_secs_f64(),
        events as f64 / wall.as_secs_f64()
    );
    let n = samples.len() - 1;
    for (label, index) in [
        ("start", 0),
        ("wave1", 1.min(n)),
        ("10%", n / 10),
        ("25%", n / 4),
        ("50%", n / 2),
        ("75%", 3 * n / 4),
        ("end", n),
    ] {
        print_sample(label, &samples[index]);
    }
    print_sample("idle", &settled);
    let first = &samples[1.min(n)];
    let per_run_db_kb = (settled.db_mb - first.db_mb) * 1024.0 / (runs - first.runs).max(1) as f64;
    println!(
        "growth from the first wave to idle: rss {:+.1} MB (anonymous {:+.1}), fds {:+}, threads {:+}; database {:.1} KB per run kept",
        settled.rss_mb - first.rss_mb,
        settled.anon_mb - first.anon_mb,
        settled.fds as i64 - first.fds as i64,
        settled.threads as i64 - first.threads as i64,
        per_run_db_kb
    );
    Ok(())
}
