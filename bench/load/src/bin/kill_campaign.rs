//! The kill campaign of `loom worker` (bench/README.md, "Kill campaign"):
//! a gateway and W workers on one Redis under a steady load of runs whose
//! every step is a side effect (a `bash` append to a file); every few
//! seconds a random worker is killed with SIGKILL and a fresh one started.
//! For each kill it measures, for every run the dead worker held, how long
//! until another worker took it over (the run's epoch moved on); at the
//! end it counts the runs that did not end DONE and the side effects
//! that happened more than once. Not a CI test: it takes minutes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../processes.rs"]
mod processes;

use anyhow::{anyhow, bail, Result};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::{PromptModel, PromptModelOptions};
use processes::{start, write_cluster_config};
use serde_json::{json, Value};

const TOKEN: &str = "kill-campaign-token-0123456789";

struct Options {
    kills: usize,
    workers: usize,
    max_runs: usize,
    interval: Duration,
    loom: PathBuf,
}

fn options() -> Result<Options> {
    let mut options = Options {
        kills: 100,
        workers: 3,
        max_runs: 4,
        interval: Duration::from_millis(1500),
        loom: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/loom"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--kills" => options.kills = value()?.parse()?,
            "--workers" => options.workers = value()?.parse()?,
            "--max-runs" => options.max_runs = value()?.parse()?,
            "--interval-ms" => options.interval = Duration::from_millis(value()?.parse()?),
            "--loom" => options.loom = PathBuf::from(value()?),
            "--help" | "-h" => {
                println!(
                    "loom-kill-campaign [--kills N] [--workers W] [--max-runs M] [--interval-ms MS] [--loom PATH]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if options.workers < 2 {
        bail!("--workers: at least 2 (one must be left to take the runs over)");
    }
    Ok(options)
}

/// The runs whose lease `pid` holds, with their epochs.
async fn held_by(redis: &mut redis::aio::MultiplexedConnection, pid: u32) -> Result<Vec<(String, u64)>> {
    let leased: Vec<String> = redis::cmd("ZRANGE")
        .arg("loom:leases")
        .arg(0)
        .arg(-1)
        .query_async(redis)
        .await?;
    let mut held = Vec::new();
    let marker = format!("/pid:{pid}/");
    for run in leased {
        let (owner, epoch): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(format!("loom:run:{run}"))
            .arg("lease_owner")
            .arg("epoch")
            .query_async(redis)
            .await?;
        if let (Some(owner), Some(epoch)) = (owner, epoch) {
            if owner.contains(&marker) {
                held.push((run, epoch));
            }
        }
    }
    Ok(held)
}

/// How long until `run`'s epoch moved past `epoch` (another worker took
/// it); `None` when it ended first, or not within a minute.
async fn taken_over(url: String, run: String, epoch: u64, killed: Instant) -> Option<Duration> {
    let client = redis::Client::open(url).ok()?;
    let mut redis = client.get_multiplexed_async_connection().await.ok()?;
    while killed.elapsed() < Duration::from_secs(60) {
        let (now, status): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(format!("loom:run:{run}"))
            .arg("epoch")
            .arg("status")
            .query_async(&mut redis)
            .await
            .ok()?;
        if now.is_some_and(|now| now > epoch) {
            return Some(killed.elapsed());
        }
        if matches!(status.as_deref(), Some("DONE" | "ERROR" | "CANCELED" | "TIMEOUT")) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let redis_server = RedisServer::start(state.path()).map_err(|err| anyhow!("{err}"))?;
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(100),
        keep_bodies: false,
        ..PromptModelOptions::default()
    });
    write_cluster_config(
        dir.path(),
        &model.url(),
        &redis_server.url(0),
        ("campaign", TOKEN),
        "",
        "",
    )?;
    let (_gateway, addr) = start(
        &options.loom,
        dir.path(),
        state.path(),
        &["serve", "--addr", "127.0.0.1:0"],
        "listening on http://",
    )?;
    let worker_args = ["worker", "--allow", "bash", "--max-runs", &options.max_runs.to_string()];
    let mut workers = Vec::new();
    for _ in 0..options.workers {
        workers.push(
            start(
                &options.loom,
                dir.path(),
                state.path(),
                &worker_args,
                "taking runs from",
            )?
            .0,
        );
    }
    let http = reqwest::Client::builder()
        .default_headers(
            [(reqwest::header::AUTHORIZATION, format!("Bearer {TOKEN}").parse()?)]
                .into_iter()
                .collect(),
        )
        .build()?;
    let client = redis::Client::open(redis_server.url(0))?;
    let mut redis = client.get_multiplexed_async_connection().await?;

    // The load: about half the workers' slots busy, so that a dead
    // worker's runs find room elsewhere at once.
    let in_flight = (options.workers * options.max_runs / 2).max(1);
    let mut active: Vec<String> = Vec::new();
    let mut all: Vec<String> = Vec::new();
    let mut takeovers = Vec::new();
    let mut watchers = Vec::new();
    let mut victims = 0;
    let mut next_kill = Instant::now() + options.interval;
    let mut kills = 0;
    let mut rng = fastrand::Rng::with_seed(7);
    let started = Instant::now();
    while kills < options.kills {
        // Keep the load up.
        let mut still = Vec::new();
        for run in active.drain(..) {
            let view: Value = http
                .get(format!("http://{addr}/v1/runs/{run}"))
                .send()
                .await?
                .json()
                .await?;
            if matches!(
                view["status"].as_str(),
                Some("QUEUED" | "RUNNING" | "WAITING_PERMISSION" | "INTERRUPTED")
            ) {
                still.push(run);
            }
        }
        active = still;
        while active.len() < in_flight {
            let n = all.len();
            let prompt = format!("steps=3 tool=bash bash=echo+r{n}-STEP+>>+effects.txt;sleep+0.3");
            let accepted: Value = http
                .post(format!("http://{addr}/v1/runs"))
                .json(&json!({"prompt": prompt}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let run = accepted["runId"]
                .as_str()
                .ok_or_else(|| anyhow!("no runId: {accepted}"))?
                .to_string();
            active.push(run.clone());
            all.push(run);
        }
        if Instant::now() >= next_kill {
            let index = rng.usize(..workers.len());
            let pid = workers[index].0.id();
            let held = held_by(&mut redis, pid).await?;
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let killed = Instant::now();
            victims += held.len();
            for (run, epoch) in held {
                watchers.push(tokio::spawn(taken_over(redis_server.url(0), run, epoch, killed)));
            }
            // A replacement, so the cluster keeps its size.
            workers[index] = start(
                &options.loom,
                dir.path(),
                state.path(),
                &worker_args,
                "taking runs from",
            )?
            .0;
            kills += 1;
            next_kill = Instant::now() + options.interval;
            if kills % 10 == 0 {
                eprintln!("{kills} kills, {} runs so far", all.len());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for watcher in watchers {
        if let Ok(Some(took)) = watcher.await {
            takeovers.push(took);
        }
    }
    // Every run accepted ends.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for run in &all {
        loop {
            let view: Value = http
                .get(format!("http://{addr}/v1/runs/{run}"))
                .send()
                .await?
                .json()
                .await?;
            let status = view["status"].as_str().unwrap_or("?").to_string();
            let live = matches!(
                status.as_str(),
                "QUEUED" | "RUNNING" | "WAITING_PERMISSION" | "INTERRUPTED"
            );
            if !live || Instant::now() > deadline {
                *statuses.entry(status).or_default() += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let effects = std::fs::read_to_string(dir.path().join("effects.txt")).unwrap_or_default();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for line in effects.lines() {
        *counts.entry(line).or_default() += 1;
    }
    let repeated = counts.values().filter(|times| **times > 1).count();
    let expected = all.len() * 3;
    takeovers.sort_unstable();
    println!(
        "kills={kills} workers={} max_runs={} interval_ms={} wall_s={:.0}",
        options.workers,
        options.max_runs,
        options.interval.as_millis(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "runs={} runs_held_by_killed_workers={victims} taken_over={}",
        all.len(),
        takeovers.len()
    );
    println!(
        "takeover_s p50={:.2} p99={:.2} max={:.2}",
        percentile(&takeovers, 0.50),
        percentile(&takeovers, 0.99),
        takeovers.last().map_or(0.0, Duration::as_secs_f64)
    );
    println!("statuses={statuses:?}");
    let lost = all.len() - statuses.get("DONE").copied().unwrap_or(0);
    println!("runs_lost={lost}");
    println!(
        "side_effects={} of {expected} steps, repeated={repeated}, not_run={} (cut off between its journal entry and its command: reported to the model, not repeated)",
        counts.len(),
        expected.saturating_sub(counts.len())
    );
    drop(workers);
    if lost > 0 || repeated > 0 {
        bail!("{lost} runs lost, {repeated} side effects repeated");
    }
    Ok(())
}
