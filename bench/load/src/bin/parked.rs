//! Runs waiting for a person hold no worker (bench/README.md, "Parked
//! runs"): one `loom worker` (`--max-runs 50`, `park_after_secs = 0`)
//! takes N runs that each ask to run a command; each is parked once it
//! asks. With all N waiting it prints what the worker holds, how long a
//! new run takes to finish, Redis's memory per parked run; then every ask
//! is answered through the gateway and it times the N runs to their end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "../processes.rs"]
mod processes;
#[path = "../readings.rs"]
#[allow(dead_code)] // status_field is not used here
mod readings;

use anyhow::{anyhow, bail, Result};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::{PromptModel, PromptModelOptions};
use processes::{start, write_cluster_config};
use readings::gauge;
use serde_json::{json, Value};

const TOKEN: &str = "parked-bench-token-0123456789";

/// How many of a page of runs are in `status`, and the page.
async fn runs_in(http: &reqwest::Client, addr: &str, status: &str) -> Result<Vec<Value>> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("http://{addr}/v1/runs?status={status}&limit=500");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let page: Value = http.get(url).send().await?.error_for_status()?.json().await?;
        found.extend(page["runs"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(found),
        }
    }
}

async fn used_memory(redis: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| anyhow!("no used_memory"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut runs = 1000usize;
    let mut loom = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/loom");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--runs" => runs = args.next().ok_or_else(|| anyhow!("--runs N"))?.parse()?,
            "--loom" => loom = PathBuf::from(args.next().ok_or_else(|| anyhow!("--loom PATH"))?),
            other => bail!("loom-parked [--runs N] [--loom PATH]: unknown {other}"),
        }
    }
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let redis_server = RedisServer::start(state.path()).map_err(|err| anyhow!("{err}"))?;
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(20),
        keep_bodies: false,
        ..PromptModelOptions::default()
    });
    write_cluster_config(
        dir.path(),
        &model.url(),
        &redis_server.url(0),
        ("bench", TOKEN),
        "permission_timeout_secs = 0",
        "park_after_secs = 0",
    )?;
    let (_gateway, addr) = start(
        &loom,
        dir.path(),
        state.path(),
        &["serve", "--addr", "127.0.0.1:0"],
        "listening on http://",
    )?;
    let worker_args = ["worker", "--ask", "bash", "--max-runs", "50", "--addr", "127.0.0.1:0"];
    let (_worker, routes) = start(
        &loom,
        dir.path(),
        state.path(),
        &worker_args,
        "health and metrics on http://",
    )?;
    let http = reqwest::Client::builder()
        .default_headers(
            [(reqwest::header::AUTHORIZATION, format!("Bearer {TOKEN}").parse()?)]
                .into_iter()
                .collect(),
        )
        .build()?;
    let client = redis::Client::open(redis_server.url(0))?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let memory_before = used_memory(&mut redis).await?;
    eprintln!("gateway http://{addr}, worker http://{routes}, {}", redis_server.url(0));

    let started = Instant::now();
    for _ in 0..runs {
        http.post(format!("http://{addr}/v1/runs"))
            .json(&json!({"prompt": "steps=1 tool=bash"}))
            .send()
            .await?
            .error_for_status()?;
    }
    let mut last_told = Instant::now();
    let waiting = loop {
        let parked: usize = redis::cmd("ZCARD").arg("loom:parked").query_async(&mut redis).await?;
        if parked == runs {
            let waiting = runs_in(&http, &addr, "WAITING_PERMISSION").await?;
            if waiting.len() == runs {
                break waiting;
            }
            if started.elapsed() > Duration::from_secs(120) {
                let shown: std::collections::HashSet<&str> =
                    waiting.iter().filter_map(|run| run["runId"].as_str()).collect();
                let ids: Vec<String> = redis::cmd("ZRANGE")
                    .arg("loom:parked")
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut redis)
                    .await?;
                for id in ids.iter().filter(|id| !shown.contains(id.as_str())) {
                    let view: Value = http
                        .get(format!("http://{addr}/v1/runs/{id}"))
                        .send()
                        .await?
                        .json()
                        .await?;
                    let events = http
                        .get(format!("http://{addr}/v1/runs/{id}/events"))
                        .send()
                        .await?
                        .text()
                        .await?;
                    eprintln!("DIAG {id}: {view}\n{events}");
                }
                bail!("{} parked runs are not shown waiting", runs - waiting.len());
            }
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("only {parked} of {runs} runs parked in 10 minutes");
        }
        if last_told.elapsed() > Duration::from_secs(5) {
            last_told = Instant::now();
            eprintln!(
                "{parked} of {runs} parked after {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let parked_in = started.elapsed();
    let metrics = reqwest::get(format!("http://{routes}/metrics")).await?.text().await?;
    let memory_parked = used_memory(&mut redis).await?;

    // A run that asks nothing, while all of them wait.
    let other = Instant::now();
    let accepted: Value = http
        .post(format!("http://{addr}/v1/runs"))
        .json(&json!({"prompt": "steps=0"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let other_id = accepted["runId"]
        .as_str()
        .ok_or_else(|| anyhow!("no runId"))?
        .to_string();
    // When Redis has it done, and when the gateway shows it so.
    let mut stored_done = None;
    loop {
        if stored_done.is_none() {
            let status: Option<String> = redis::cmd("HGET")
                .arg(format!("loom:run:{other_id}"))
                .arg("status")
                .query_async(&mut redis)
                .await?;
            if status.as_deref() == Some("DONE") {
                stored_done = Some(other.elapsed());
            }
        }
        let view: Value = http
            .get(format!("http://{addr}/v1/runs/{other_id}"))
            .send()
            .await?
            .json()
            .await?;
        if view["status"] == "DONE" {
            break;
        }
        if other.elapsed() > Duration::from_secs(60) {
            bail!("a new run did not finish while the others were parked: {view}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other_took = other.elapsed();

    // Every ask answered through the gateway.
    let answering = Instant::now();
    for run in &waiting {
        let run_id = run["runId"].as_str().unwrap_or_default();
        let view: Value = http
            .get(format!("http://{addr}/v1/runs/{run_id}"))
            .send()
            .await?
            .json()
            .await?;
        let Some(request) = view["pendingAsks"][0]["requestId"].as_str() else {
            bail!("run {run_id} shows no ask: {view}");
        };
        http.post(format!("http://{addr}/v1/runs/{run_id}/permissions/{request}"))
            .json(&json!({"decision": "allow"}))
            .send()
            .await?
            .error_for_status()?;
    }
    let done = loop {
        let done = runs_in(&http, &addr, "DONE").await?.len();
        if done == runs + 1 || answering.elapsed() > Duration::from_secs(600) {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let finished_in = answering.elapsed();
    println!("runs={runs} worker_max_runs=50 park_after_secs=0");
    println!(
        "parked={} in {:.1} s; the worker holds {} runs (loom_worker_runs_owned), parked {} (loom_worker_runs_parked_total)",
        waiting.len(),
        parked_in.as_secs_f64(),
        gauge(&metrics, "loom_worker_runs_owned "),
        gauge(&metrics, "loom_worker_runs_parked_total "),
    );
    println!(
        "redis_memory_per_parked_run_kb={:.1}",
        memory_parked.saturating_sub(memory_before) as f64 / runs.max(1) as f64 / 1024.0
    );
    println!(
        "a_new_run_done_in_ms={:.0} (while {runs} wait; stored done after {:.0} ms)",
        other_took.as_secs_f64() * 1000.0,
        stored_done.unwrap_or(other_took).as_secs_f64() * 1000.0
    );
    println!(
        "answered_and_done={} of {runs} in {:.1} s",
        done.saturating_sub(1),
        finished_in.as_secs_f64()
    );
    if done != runs + 1 {
        bail!("{} runs did not finish after their answers", runs + 1 - done);
    }
    Ok(())
}
