//! `loom worker` processes on a real `redis-server` (docs/cluster.md): a
//! gateway that executes nothing accepts runs, workers execute them under
//! leases; a worker killed (SIGKILL) or frozen (SIGSTOP) mid-run loses
//! nothing a client was told and repeats no side effect.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway::{config, http, Gateway, ALICE};
use common::{json_lines, loom_in};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

/// A `loom worker` process, killed on drop.
struct WorkerProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl WorkerProcess {
    /// Starts a worker on the gateway's loom.toml in `dir`, allowed `bash`.
    fn start(dir: &Path, max_runs: u32) -> Self {
        let mut child = loom_in(dir)
            .args(["worker", "--config"])
            .arg(dir.join("loom.toml"))
            .arg("--workspace")
            .arg(dir)
            .args(["--allow", "bash", "--max-runs", &max_runs.to_string()])
            .env("OPENAI_API_KEY", "test-key")
            .env("LOOM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let ready = line.contains("taking runs from");
                lines.lock().unwrap().push(line);
                if ready {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            panic!("loom worker did not start: {:?}", log.lock().unwrap());
        }
        Self { child, log }
    }

    fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis, the fake model, and a gateway that executes nothing, all in `dir`.
fn cluster(dir: &Path) -> (RedisServer, PromptModel, Gateway) {
    let files = dir.join("redis");
    std::fs::create_dir_all(&files).unwrap();
    let server = RedisServer::start(&files).unwrap_or_else(|err| panic!("{err}"));
    let model = PromptModel::start(PromptModelOptions::default());
    config(
        dir,
        &model.url(),
        &format!("\n[cluster]\nredis = \"{}\"\n", server.url(0)),
    );
    let gateway = Gateway::start(dir, &[]);
    assert!(
        gateway.log_text().contains("execute on the cluster"),
        "{}",
        gateway.log_text()
    );
    (server, model, gateway)
}

/// Each `bash` call appends `TAG-STEP` to effects.txt, then sleeps.
fn prompt(tag: &str, steps: u32, sleep_s: f32) -> String {
    format!("steps={steps} tool=bash bash=echo+{tag}-STEP+>>+effects.txt;sleep+{sleep_s}")
}

async fn start(gateway: &Gateway, prompt: &str) -> String {
    let accepted = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status().as_u16(), 202);
    let accepted: Value = accepted.json().await.unwrap();
    accepted["runId"].as_str().unwrap().to_string()
}

async fn view(gateway: &Gateway, run: &str) -> Value {
    http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{run}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until `run` has ended; its view.
async fn ended(gateway: &Gateway, run: &str, within: Duration, why: impl Fn() -> String) -> Value {
    let started = Instant::now();
    loop {
        let view = view(gateway, run).await;
        if !matches!(
            view["status"].as_str(),
            Some("QUEUED" | "RUNNING" | "WAITING_PERMISSION" | "INTERRUPTED")
        ) {
            return view;
        }
        assert!(started.elapsed() < within, "run {run} did not end: {view}\n{}", why());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many times each effect line was written.
fn effects(dir: &Path) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("effects.txt"))
        .unwrap_or_default()
        .lines()
    {
        *seen.entry(line.to_string()).or_default() += 1;
    }
    seen
}

/// The stored log of `run`, as `loom runs events` prints it.
fn stored_events(dir: &Path, redis: &str, run: &str) -> Vec<Value> {
    let out = loom_in(dir)
        .args(["runs", "events", run, "--redis", redis])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    json_lines(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_execute_on_two_workers_and_one_killed_mid_run_loses_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster(dir.path());
    let first = WorkerProcess::start(dir.path(), 3);
    let second = WorkerProcess::start(dir.path(), 3);
    let why = || {
        format!(
            "gateway:\n{}\nfirst:\n{}\nsecond:\n{}",
            gateway.log_text(),
            first.log_text(),
            second.log_text()
        )
    };

    // Six runs of two steps each, every step a side effect then a second's wait.
    let mut runs = Vec::new();
    for i in 0..6 {
        runs.push(start(&gateway, &prompt(&format!("r{i}"), 2, 1.0)).await);
    }
    // A client follows each run live over the WebSocket, from the start.
    let mut client = gateway.ws(ALICE).await;
    for run in &runs {
        client.ok("run.subscribe", json!({"runId": run, "afterSeq": 0})).await;
    }
    // Both workers take runs.
    let started = Instant::now();
    while effects(dir.path()).len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the runs did not start: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.signal("-KILL");
    let killed = Instant::now();
    // The client reads on (a client that stops reading is dropped).
    for run in &runs {
        let end = tokio::time::timeout(Duration::from_secs(60), client.until(run, "lifecycle.end"))
            .await
            .unwrap_or_else(|_| panic!("run {run} did not end\n{}", why()));
        assert_eq!(end["payload"]["status"], "DONE", "{end}\n{}", why());
        assert_eq!(view(&gateway, run).await["status"], "DONE");
    }
    eprintln!("every run ended {:?} after the kill", killed.elapsed());

    // Every side effect happened at most once; a call cut off by the kill
    // had written its line before it slept, so each happened exactly once.
    let seen = effects(dir.path());
    for (line, times) in &seen {
        assert_eq!(*times, 1, "{line} happened {times} times: {seen:?}");
    }
    for i in 0..6 {
        for step in 1..=2 {
            assert!(
                seen.contains_key(&format!("r{i}-{step}")),
                "r{i}-{step} never ran: {seen:?}"
            );
        }
    }

    // The live client saw every stored event of every run exactly once, in order.
    let mut resumed = 0;
    for run in &runs {
        let stored = stored_events(dir.path(), &server.url(0), run);
        let stored_seqs: Vec<u64> = stored.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
        assert_eq!(client.seqs(run), stored_seqs, "run {run}");
        assert_eq!(stored_seqs, (1..=stored_seqs.len() as u64).collect::<Vec<_>>());
        let ends: Vec<&Value> = stored.iter().filter(|event| event["type"] == "lifecycle.end").collect();
        assert_eq!(ends.last().unwrap()["status"], "DONE");
        if stored
            .iter()
            .any(|event| event["type"] == "lifecycle.start" && event["resumed"] == true)
        {
            resumed += 1;
        }
    }
    // Every run the killed worker held was taken over by the other.
    let held = first.log_text().matches("run started").count();
    assert!(held >= 1, "the first worker took no run: {}", why());
    assert_eq!(resumed, held, "{}", why());
}
