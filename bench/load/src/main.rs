//! The load harness of `loom serve` (bench/README.md): N concurrent runs,
//! each three tool turns against a fake model that answers after 200 ms,
//! driven over WebSockets or over HTTP + SSE; it prints wall time, runs per
//! second, the server's peak memory and memory per run, event latency
//! (model chunk → client) and runs lost.

#[allow(dead_code)] // gauge is the other benches'
mod readings;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use loom_testkit::{PromptModel, PromptModelOptions};
use readings::status_field;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "load-harness-token-0123456789";
/// Three tool turns, then an answer whose chunks carry the time they were sent.
const PROMPT: &str = "load steps=3 stamp=1";
/// Submissions a connection has unanswered at once.
const IN_FLIGHT: usize = 32;

struct Options {
    runs: usize,
    store: String,
    transport: String,
    connections: usize,
    loom: PathBuf,
    delay_ms: u64,
    /// `loom worker` processes executing the runs (with `--store redis`;
    /// 0: the gateway executes them itself).
    workers: usize,
    /// Each worker's `--max-runs`.
    worker_max_runs: usize,
    /// Whether the gateway records workspace snapshots per step (its
    /// default; `--no-snapshots` measures their cost).
    snapshots: bool,
}

fn options() -> Result<Options> {
    let mut options = Options {
        runs: 1000,
        store: "sqlite".into(),
        transport: "ws".into(),
        connections: 100,
        loom: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/loom"),
        delay_ms: 200,
        workers: 0,
        worker_max_runs: 50,
        snapshots: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--runs" => options.runs = value()?.parse()?,
            "--store" => options.store = value()?,
            "--transport" => options.transport = value()?,
            "--connections" => options.connections = value()?.parse()?,
            "--loom" => options.loom = PathBuf::from(value()?),
            "--delay-ms" => options.delay_ms = value()?.parse()?,
            "--workers" => options.workers = value()?.parse()?,
            "--worker-max-runs" => options.worker_max_runs = value()?.parse()?,
            "--no-snapshots" => options.snapshots = false,
            "--help" | "-h" => {
                println!("loom-load [--runs N] [--store sqlite|redis|none] [--transport ws|sse] [--connections C] [--loom PATH] [--delay-ms MS] [--workers K --worker-max-runs M] [--no-snapshots]");
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if !["sqlite", "redis", "none"].contains(&options.store.as_str())
        || !["ws", "sse"].contains(&options.transport.as_str())
    {
        bail!("--store sqlite|redis|none, --transport ws|sse");
    }
    if options.workers > 0 && options.store != "redis" {
        bail!("--workers needs --store redis (workers take runs from the cluster's Redis)");
    }
    options.connections = options.connections.clamp(1, options.runs.max(1));
    Ok(options)
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// User + system CPU seconds of a process (from `/proc/PID/stat`).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
    /// The server's state (its database), removed with the harness.
    _state: tempfile::TempDir,
    /// With `--store redis`: the Redis it records in (its files in `_state`).
    redis: Option<loom_testkit::redis_server::RedisServer>,
    /// With `--workers`: the `loom worker` processes.
    workers: Vec<Child>,
}

impl Drop for Server {
    /// SIGTERM first (the server shuts down cleanly, so a profiler around
    /// it can write its report), then SIGKILL after 30 s.
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..300 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(options: &Options, model_url: &str) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    // With Redis: Debian's redis-server, appendfsync always (every
    // acknowledged write on disk, as docs/cluster.md recommends).
    let redis = match options.store.as_str() {
        "redis" => Some(loom_testkit::redis_server::RedisServer::start(state.path()).map_err(|err| anyhow!("{err}"))?),
        _ => None,
    };
    let store = match (&redis, options.store.as_str()) {
        (Some(redis), _) => format!(
            "[cluster]\nredis = \"{}\"\nexecute = {}\n",
            redis.url(0),
            options.workers == 0
        ),
        (None, "none") => "store = \"none\"\n".to_string(),
        _ => String::new(),
    };
    let snapshots = if options.snapshots {
        ""
    } else {
        "[snapshots]\nenabled = false\n"
    };
    let n = options.runs.max(1);
    std::fs::write(
        dir.path().join("loom.toml"),
        format!(
            r#"model = "openai:fake"
{store}
[provider]
base_url = "{model_url}"
max_attempts = 1

[feedback]
monitor = false

{snapshots}
[server]
max_runs = {n}
max_runs_per_token = {n}
max_queued = {n}
requests_per_minute = 100000000
keep_finished_runs = {n}

[[server.tokens]]
name = "load"
token = "{TOKEN}"
"#
        ),
    )?;
    let mut child = Command::new(&options.loom)
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("loom.toml"))
        .arg("--workspace")
        .arg(dir.path())
        .env("OPENAI_API_KEY", "load")
        .env("LOOM_STATE_DIR", state.path())
        .env("LOOM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "cannot start {} (build it: cargo build --release -p loom-cli)",
                options.loom.display()
            )
        })?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            } else if line.contains("ERROR") || line.contains("error") {
                eprintln!("server: {line}");
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .context("loom serve did not start")?;
    let mut workers = Vec::new();
    for _ in 0..options.workers {
        workers.push(
            Command::new(&options.loom)
                .args(["worker", "--config"])
                .arg(dir.path().join("loom.toml"))
                .arg("--workspace")
                .arg(dir.path())
                .args(["--max-runs", &options.worker_max_runs.to_string()])
                .env("OPENAI_API_KEY", "load")
                .env("LOOM_STATE_DIR", state.path())
                .env("LOOM_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot start loom worker")?,
        );
    }
    Ok(Server {
        child,
        addr,
        _dir: dir,
        _state: state,
        redis,
        workers,
    })
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    done: AtomicUsize,
    events: AtomicUsize,
    latencies_us: Mutex<Vec<u64>>,
    /// When the fake model sent each final answer's chunks (µs since the epoch).
    sent_us: Mutex<Vec<u64>>,
    /// Of each chunk's latency, the part until the gateway emitted its event
    /// (the event's `ts`, in ms): reading the model's stream.
    to_emit_us: Mutex<Vec<u64>>,
    last_end: Mutex<Option<Instant>>,
}

impl Tally {
    fn event(&self, event: &Value) -> bool {
        let name = event["type"].as_str().unwrap_or_default();
        self.events.fetch_add(1, Ordering::Relaxed);
        if name == "llm.delta" {
            let received = now_micros();
            if let Some(sent) = event["text"]
                .as_str()
                .and_then(|text| text.strip_prefix("t="))
                .and_then(|rest| rest.trim_end_matches(';').parse::<u64>().ok())
            {
                if let Ok(mut latencies) = self.latencies_us.lock() {
                    latencies.push(received.saturating_sub(sent));
                }
                if let Ok(mut sent_us) = self.sent_us.lock() {
                    sent_us.push(sent);
                }
                let emitted = event["ts"]
                    .as_str()
                    .and_then(|ts| humantime::parse_rfc3339(ts).ok())
                    .and_then(|ts| ts.duration_since(std::time::UNIX_EPOCH).ok());
                if let (Some(emitted), Ok(mut to_emit)) = (emitted, self.to_emit_us.lock()) {
                    // `ts` has milliseconds: its chunk was sent within the millisecond before.
                    let emitted = emitted.as_micros() as u64 + 999;
                    to_emit.push(emitted.saturating_sub(sent));
                }
            }
        }
        if name == "lifecycle.end" {
            if event["status"] == "DONE" {
                self.done.fetch_add(1, Ordering::SeqCst);
            }
            if let Ok(mut last) = self.last_end.lock() {
                *last = Some(Instant::now());
            }
            return true;
        }
        false
    }
}

/// Whether a frame is one the tally reads (a response, an `llm.delta`,
/// a `lifecycle.end`); the others are only counted.
fn needs_reading(frame: &str) -> bool {
    [
        "\"type\":\"response\"",
        "\"type\":\"llm.delta\"",
        "\"type\":\"lifecycle.end\"",
    ]
    .iter()
    .any(|marker| frame.contains(marker))
}

/// One WebSocket connection that starts `runs` runs and reads their events.
async fn ws_client(addr: String, runs: usize, tally: Arc<Tally>) -> Result<()> {
    let mut request = format!("ws://{addr}/ws").into_client_request()?;
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {TOKEN}").parse()?);
    let (socket, _) = tokio_tungstenite::connect_async(request).await?;
    let (mut sink, mut stream) = socket.split();
    // At most IN_FLIGHT submissions unanswered per connection (the server
    // answers more with OVERLOADED).
    let window = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let answered = window.clone();
    let sender = tokio::spawn(async move {
        for i in 0..runs {
            let Ok(permit) = window.acquire().await else { break };
            permit.forget();
            let frame = json!({"type": "request", "id": i, "method": "agent.run", "payload": {"prompt": PROMPT}});
            if sink.send(Message::text(frame.to_string())).await.is_err() {
                break;
            }
        }
        sink
    });
    let mut ended = 0;
    let mut refused = 0;
    while ended + refused < runs {
        let Some(message) = stream.next().await else { break };
        let Message::Text(text) = message? else { continue };
        if !needs_reading(text.as_str()) {
            // Counted, not parsed: the clients must not be the bottleneck.
            tally.events.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let frame: Value = serde_json::from_str(text.as_str())?;
        match frame["type"].as_str() {
            Some("event") if tally.event(&frame["payload"]) => ended += 1,
            Some("response") => {
                answered.add_permits(1);
                if frame["ok"] == false {
                    eprintln!("refused: {}", frame["error"]);
                    refused += 1;
                }
            }
            _ => {}
        }
    }
    let _ = sender.await;
    Ok(())
}

/// One run over HTTP: POST, then its SSE stream to the end.
async fn sse_run(client: reqwest::Client, addr: String, tally: Arc<Tally>) -> Result<()> {
    let accepted: Value = client
        .post(format!("http://{addr}/v1/runs"))
        .json(&json!({"prompt": PROMPT}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let run_id = accepted["runId"]
        .as_str()
        .ok_or_else(|| anyhow!("no runId: {accepted}"))?;
    let mut stream = client
        .get(format!("http://{addr}/v1/runs/{run_id}/events"))
        .send()
        .await?
        .error_for_status()?
        .bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            for line in block.lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    if !needs_reading(data) {
                        tally.events.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let event: Value = serde_json::from_str(data.trim())?;
                    if tally.event(&event) {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Where the store's time went, from the server's `/metrics`: per
/// operation, the writes, their mean latency and the bucket bound their
/// p99 falls under — as the runs waited (`loom_store_write_seconds`) and
/// the store's own part (`loom_store_commit_seconds`).
async fn store_writes(addr: &str) -> Option<String> {
    let text = reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let lines: Vec<String> = ["loom_store_write_seconds", "loom_store_commit_seconds"]
        .iter()
        .filter_map(|metric| histogram_summary(&text, metric).map(|summary| format!("{metric} {summary}")))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// `op: count × mean ms (p99 ≤ bound ms)` for each `op` of `metric`.
fn histogram_summary(text: &str, metric: &str) -> Option<String> {
    #[derive(Default)]
    struct Op {
        sum: f64,
        count: f64,
        buckets: Vec<(f64, f64)>,
    }
    let mut ops: std::collections::BTreeMap<String, Op> = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let Some((kind, rest)) = rest.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .map(|value| value.trim_end_matches('"').to_string())
        };
        let Some(op) = label("op") else { continue };
        let entry = ops.entry(op).or_default();
        match kind {
            "_sum" => entry.sum = value,
            "_count" => entry.count = value,
            "_bucket" => {
                let bound = label("le").and_then(|le| le.parse().ok()).unwrap_or(f64::INFINITY);
                entry.buckets.push((bound, value));
            }
            _ => {}
        }
    }
    if ops.is_empty() {
        return None;
    }
    let parts: Vec<String> = ops
        .iter()
        .map(|(op, entry)| {
            let mut buckets = entry.buckets.clone();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let p99 = buckets
                .iter()
                .find(|(_, below)| *below >= entry.count * 0.99)
                .map(|(bound, _)| format!("{:.1}", bound * 1000.0))
                .unwrap_or_else(|| "?".into());
            format!(
                "{op}: {:.0} × {:.3} ms (p99 ≤ {p99} ms)",
                entry.count,
                entry.sum / entry.count.max(1.0) * 1000.0
            )
        })
        .collect();
    Some(parts.join(", "))
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(options.delay_ms),
        keep_bodies: false,
        ..PromptModelOptions::default()
    });
    let server = start_server(&options, &model.url())?;
    let pid = server.child.id();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline_kib = status_field(pid, "VmRSS:");
    let baseline_cpu = cpu_seconds(pid);
    let redis_pid = server.redis.as_ref().map(|redis| redis.pid());
    let redis_baseline_cpu = redis_pid.map_or(0.0, cpu_seconds);
    let harness_baseline_cpu = cpu_seconds(std::process::id());
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let mut tasks = Vec::new();
    if options.transport == "ws" {
        let per = options.runs / options.connections;
        let extra = options.runs % options.connections;
        for c in 0..options.connections {
            let runs = per + usize::from(c < extra);
            tasks.push(tokio::spawn(ws_client(server.addr.clone(), runs, tally.clone())));
        }
    } else {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("Authorization", format!("Bearer {TOKEN}").parse()?);
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(options.runs)
            .build()?;
        for _ in 0..options.runs {
            tasks.push(tokio::spawn(sse_run(
                client.clone(),
                server.addr.clone(),
                tally.clone(),
            )));
        }
    }
    let deadline = Duration::from_secs(300);
    for task in tasks {
        match tokio::time::timeout(deadline, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => eprintln!("client: {err:#}"),
            Ok(Err(err)) => eprintln!("client task: {err}"),
            Err(_) => eprintln!("client: timed out"),
        }
    }
    let wall = tally
        .last_end
        .lock()
        .ok()
        .and_then(|last| *last)
        .map_or(started.elapsed(), |last| last - started);
    let peak_kib = status_field(pid, "VmHWM:");
    let server_cpu = cpu_seconds(pid) - baseline_cpu;
    let redis_cpu = redis_pid.map(|redis| cpu_seconds(redis) - redis_baseline_cpu);
    let harness_cpu = cpu_seconds(std::process::id()) - harness_baseline_cpu;
    let done = tally.done.load(Ordering::SeqCst);
    let mut latencies = tally.latencies_us.lock().map(|l| l.clone()).unwrap_or_default();
    latencies.sort_unstable();
    let per_run_kib = peak_kib.saturating_sub(baseline_kib) as f64 / options.runs.max(1) as f64;
    println!(
        "runs={} transport={} store={} connections={} model_delay_ms={} workers={}",
        options.runs,
        options.transport,
        options.store,
        options.connections,
        options.delay_ms,
        if options.workers == 0 {
            "none (the gateway executes)".to_string()
        } else {
            format!("{} × max {} runs", options.workers, options.worker_max_runs)
        }
    );
    println!(
        "wall_time_s={:.3} (ideal {:.1})",
        wall.as_secs_f64(),
        4.0 * options.delay_ms as f64 / 1000.0
    );
    println!("runs_per_s={:.0}", options.runs as f64 / wall.as_secs_f64());
    println!(
        "server_peak_rss_mb={:.1} baseline_rss_mb={:.1} memory_per_run_kb={:.1}",
        peak_kib as f64 / 1024.0,
        baseline_kib as f64 / 1024.0,
        per_run_kib * 1.024
    );
    println!(
        "event_latency_ms p50={:.2} p99={:.2} (n={})",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.len()
    );
    let mut to_emit = tally.to_emit_us.lock().map(|s| s.clone()).unwrap_or_default();
    to_emit.sort_unstable();
    println!(
        "of which until emitted (the gateway reading the model's stream) p50={:.2} p99={:.2}",
        percentile(&to_emit, 0.50),
        percentile(&to_emit, 0.99)
    );
    // How bunched the final answers came: the more runs answer at once,
    // the longer each of their events waits behind the others'.
    let mut sent = tally.sent_us.lock().map(|s| s.clone()).unwrap_or_default();
    sent.sort_unstable();
    println!(
        "final_answers_sent_within_ms p10-p90={:.0} p1-p99={:.0}",
        (percentile(&sent, 0.90) - percentile(&sent, 0.10)),
        (percentile(&sent, 0.99) - percentile(&sent, 0.01))
    );
    println!(
        "server_cpu_s={server_cpu:.2} ({:.2} ms/run) harness_cpu_s={harness_cpu:.2} (fake model + clients)",
        server_cpu * 1000.0 / options.runs.max(1) as f64
    );
    if let Some(redis_cpu) = redis_cpu {
        println!(
            "redis_cpu_s={redis_cpu:.2} ({:.2} ms/run)",
            redis_cpu * 1000.0 / options.runs.max(1) as f64
        );
    }
    println!(
        "events_per_run={:.1}",
        tally.events.load(Ordering::Relaxed) as f64 / options.runs.max(1) as f64
    );
    if let Some(line) = store_writes(&server.addr).await {
        println!("{line}");
    }
    println!("model_requests={}", model.request_count());
    println!("runs_lost={}", options.runs - done);
    if done != options.runs {
        bail!("{} runs did not end DONE", options.runs - done);
    }
    Ok(())
}
