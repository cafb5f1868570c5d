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
        Self::start_with(dir, max_runs, &["--allow", "bash"])
    }

    /// Starts a worker with `args` besides.
    fn start_with(dir: &Path, max_runs: u32, args: &[&str]) -> Self {
        let mut child = loom_in(dir)
            .args(["worker", "--config"])
            .arg(dir.join("loom.toml"))
            .arg("--workspace")
            .arg(dir)
            .args(args)
            .args(["--max-runs", &max_runs.to_string()])
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

    /// Where its `--addr` routes listen.
    fn routes(&self) -> String {
        self.log_text()
            .split("health and metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no routes (--addr): {}", self.log_text()))
    }

    /// The value of `name` on its `/metrics`.
    async fn metric(&self, name: &str) -> f64 {
        let metrics = reqwest::get(format!("http://{}/metrics", self.routes()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name}: {metrics}"))
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
    cluster_with(dir, "")
}

/// [`cluster`] with more `[cluster]` settings.
fn cluster_with(dir: &Path, settings: &str) -> (RedisServer, PromptModel, Gateway) {
    cluster_configured(dir, "", settings)
}

/// [`cluster`] with more `[server]` and `[cluster]` settings.
fn cluster_configured(dir: &Path, server_settings: &str, settings: &str) -> (RedisServer, PromptModel, Gateway) {
    let files = dir.join("redis");
    std::fs::create_dir_all(&files).unwrap();
    let server = RedisServer::start(&files).unwrap_or_else(|err| panic!("{err}"));
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    config(
        dir,
        &model.url(),
        &format!(
            "{server_settings}\n[cluster]\nredis = \"{}\"\n{settings}\n",
            server.url(0)
        ),
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
/// The wall clock, as the gateway stamps runs.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

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

/// POSTs `body` to `path` on `gateway` as alice; the answer's JSON.
async fn post(gateway: &Gateway, path: &str, body: Value) -> Value {
    http(ALICE)
        .post(gateway.url(path))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// GETs `path` on `gateway` as alice; the answer's JSON.
async fn get(gateway: &Gateway, path: &str) -> Value {
    http(ALICE)
        .get(gateway.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn view(gateway: &Gateway, run: &str) -> Value {
    get(gateway, &format!("/v1/runs/{run}")).await
}

/// Waits until `run` has ended; its view.
async fn ended(gateway: &Gateway, run: &str, within: Duration, why: impl Fn() -> String) -> Value {
    let started = Instant::now();
    loop {
        let view = view(gateway, run).await;
        // A store coming back is asked again.
        let unavailable = view["error"]["code"] == "UNAVAILABLE";
        if !unavailable
            && !matches!(
                view["status"].as_str(),
                Some("QUEUED" | "RUNNING" | "WAITING_PERMISSION" | "INTERRUPTED")
            )
        {
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

/// A run's status as `loom runs list --redis` shows it.
fn listed_status(dir: &Path, redis: &str, run: &str) -> String {
    let out = loom_in(dir)
        .args(["runs", "list", "--json", "--redis", redis])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = runs.as_array().unwrap().iter().find(|listed| listed["runId"] == run);
    listed.unwrap_or_else(|| panic!("{run} not in {runs}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
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
    let second = WorkerProcess::start_with(dir.path(), 3, &["--allow", "bash", "--addr", "127.0.0.1:0"]);
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

    // Every side effect happened at most once. One that never happened
    // was cut off by the kill between its journal entry and its command:
    // the run that took it over told the model so, and did not run it.
    let seen = effects(dir.path());
    for (line, times) in &seen {
        assert_eq!(*times, 1, "{line} happened {times} times: {seen:?}");
    }
    let mut cut_off = 0;
    for (i, run) in runs.iter().enumerate() {
        for step in 1..=2 {
            if seen.contains_key(&format!("r{i}-{step}")) {
                continue;
            }
            cut_off += 1;
            let stored = stored_events(dir.path(), &server.url(0), run);
            assert!(
                stored.iter().any(|event| event["type"] == "tool.result"
                    && event["status"] == "error"
                    && event["content"].as_str().unwrap_or_default().contains("interrupted")),
                "r{i}-{step} never ran and nothing says why: {stored:?}"
            );
        }
    }
    assert!(cut_off <= 3, "at most one call per run the killed worker held");

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

    // The survivor says so on its own routes.
    let ready = reqwest::get(format!("http://{}/readyz", second.routes()))
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    assert_eq!(second.metric("loom_worker_takeovers_total").await as usize, held);
    assert!(second.metric("loom_worker_leases_renewed_total").await >= 1.0);
}

/// Waits until `line` is among the effects.
async fn effect(dir: &Path, line: &str, why: impl Fn() -> String) {
    let started = Instant::now();
    while !effects(dir).contains_key(line) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{line} never ran: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stored log holds every seq once, in order, and ends once.
fn assert_one_clean_log(stored: &[Value], status: &str) {
    let seqs: Vec<u64> = stored.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{stored:?}");
    let last = stored.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["status"].as_str()),
        (Some("lifecycle.end"), Some(status))
    );
}

/// A worker frozen (SIGSTOP) past its lease: another takes the run over;
/// thawed (SIGCONT), the first gives the run up, and none of its late
/// writes lands — the log and the files show only the new owner's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_is_fenced_off_the_run_another_took_over() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster(dir.path());
    let frozen = WorkerProcess::start_with(dir.path(), 1, &["--allow", "bash", "--addr", "127.0.0.1:0"]);
    let run = start(&gateway, &prompt("s", 3, 1.0)).await;
    let why = || format!("gateway:\n{}\nfrozen:\n{}", gateway.log_text(), frozen.log_text());
    effect(dir.path(), "s-1", why).await;
    frozen.signal("-STOP");
    let other = WorkerProcess::start(dir.path(), 1);
    let why = || {
        format!(
            "gateway:\n{}\nfrozen:\n{}\nother:\n{}",
            gateway.log_text(),
            frozen.log_text(),
            other.log_text()
        )
    };
    let done = ended(&gateway, &run, Duration::from_secs(60), why).await;
    assert_eq!(done["status"], "DONE", "{done}");
    let before = stored_events(dir.path(), &server.url(0), &run);

    frozen.signal("-CONT");
    let thawed = Instant::now();
    while !frozen.log_text().contains("giving the run up") {
        assert!(
            thawed.elapsed() < Duration::from_secs(10),
            "the thawed worker kept the run: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Time for whatever it would still do.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = stored_events(dir.path(), &server.url(0), &run);
    assert_eq!(after, before, "the frozen worker wrote after the take-over: {}", why());
    // What it tried is counted, and it refused all of it itself: the
    // time its last renewal bought had run out when it thawed.
    assert!(
        frozen.metric("loom_worker_writes_fenced_total").await >= 1.0,
        "{}",
        why()
    );
    assert_eq!(
        frozen.metric("loom_worker_writes_sent_stale_total").await,
        0.0,
        "{}",
        why()
    );
    assert_eq!(frozen.metric("loom_worker_leases_lost_total").await, 1.0);
    assert_one_clean_log(&after, "DONE");
    assert_eq!(view(&gateway, &run).await["status"], "DONE");
    let seen = effects(dir.path());
    assert_eq!(
        seen,
        BTreeMap::from([("s-1".into(), 1), ("s-2".into(), 1), ("s-3".into(), 1)]),
        "{}",
        why()
    );
}

/// A worker stopped with SIGTERM interrupts its run and hands it back at
/// once: with leases of 30 s another worker still takes it over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_hands_its_runs_back_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster_with(dir.path(), "lease_secs = 30");
    let mut leaving = WorkerProcess::start(dir.path(), 2);
    let runs = [
        start(&gateway, &prompt("a", 3, 1.0)).await,
        start(&gateway, &prompt("b", 3, 1.0)).await,
    ];
    let why = || format!("gateway:\n{}\nleaving:\n{}", gateway.log_text(), leaving.log_text());
    effect(dir.path(), "a-1", why).await;
    effect(dir.path(), "b-1", why).await;
    let staying = WorkerProcess::start(dir.path(), 2);
    leaving.signal("-TERM");
    let status = leaving.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let handed = Instant::now();
    for run in &runs {
        let view = ended(&gateway, run, Duration::from_secs(20), || staying.log_text()).await;
        assert_eq!(view["status"], "DONE", "{view}");
    }
    // Well inside the 30 s a lease that ran out would have taken.
    assert!(handed.elapsed() < Duration::from_secs(20));
    for run in &runs {
        let stored = stored_events(dir.path(), &server.url(0), run);
        assert_one_clean_log(&stored, "DONE");
        // Interrupted (no end in its log: it goes on), then resumed once.
        let resumed = stored
            .iter()
            .filter(|event| event["type"] == "lifecycle.start" && event["resumed"] == true)
            .count();
        assert_eq!(resumed, 1, "handed back once: {stored:?}");
    }
    for (line, times) in effects(dir.path()) {
        assert_eq!(times, 1, "{line} ran {times} times");
    }
}

/// A cancel reaches the run wherever it is: one no worker took yet ends
/// at once; one a worker executes stops there, and `agent.cancel`
/// answers with its final seq once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_reach_queued_runs_and_the_worker_that_executes_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster(dir.path());
    let mut client = gateway.ws(ALICE).await;

    // No worker yet: the runs wait in the store, accepted and not
    // started, and a cancel ends one there.
    let waiting = start(&gateway, &prompt("q", 1, 0.0)).await;
    let later = start(&gateway, &prompt("l", 1, 1.0)).await;
    let queued = view(&gateway, &waiting).await;
    assert_eq!(queued["status"], "QUEUED");
    assert!(
        queued["acceptedMs"].as_u64().is_some() && queued.get("startedMs").is_none(),
        "{queued}"
    );
    let cancelled = client.ok("agent.cancel", json!({"runId": waiting})).await;
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    let stored = stored_events(dir.path(), &server.url(0), &waiting);
    assert_eq!(
        cancelled["finalSeq"].as_u64(),
        stored.last().and_then(|event| event["seq"].as_u64())
    );
    assert_one_clean_log(&stored, "CANCELED");

    let worker_started_ms = now_ms();
    let worker = WorkerProcess::start(dir.path(), 1);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    // The run that waited shows when the worker began it, live and after
    // its end, beside when it was accepted.
    effect(dir.path(), "l-1", why).await;
    let began = |view: &Value| view["startedMs"].as_u64().filter(|ms| *ms >= worker_started_ms);
    let live = loop {
        let live = view(&gateway, &later).await;
        if began(&live).is_some() || live["status"] != "QUEUED" && live["status"] != "RUNNING" {
            break live;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(live["status"], "RUNNING", "{live}");
    assert!(began(&live).is_some(), "{live}");
    let done = ended(&gateway, &later, Duration::from_secs(30), why).await;
    assert_eq!(done["status"], "DONE", "{done}");
    assert!(began(&done).is_some(), "{done}");
    assert!(done["acceptedMs"].as_u64().unwrap() <= worker_started_ms, "{done}");
    let running = start(&gateway, &prompt("c", 3, 5.0)).await;
    effect(dir.path(), "c-1", why).await;
    let asked = Instant::now();
    let cancelled = client.ok("agent.cancel", json!({"runId": running})).await;
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    // Within a renewal and the bash tool's kill, not the 5 s sleep.
    assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
    let stored = stored_events(dir.path(), &server.url(0), &running);
    assert_eq!(
        cancelled["finalSeq"].as_u64(),
        stored.last().and_then(|event| event["seq"].as_u64())
    );
    assert_one_clean_log(&stored, "CANCELED");
    assert_eq!(view(&gateway, &running).await["status"], "CANCELED");
    // The cancelled queued run never ran; the cancelled running one
    // stopped in its first call.
    assert_eq!(
        effects(dir.path()),
        BTreeMap::from([("c-1".into(), 1), ("l-1".into(), 1)])
    );
    // The worker is free again.
    let next = start(&gateway, &prompt("n", 1, 0.0)).await;
    assert_eq!(
        ended(&gateway, &next, Duration::from_secs(30), why).await["status"],
        "DONE"
    );
}

/// A control does not wait for the next renewal: Redis nudges the worker
/// that holds the run. With 30 s leases a worker renews every 10 s; the
/// cancel still reaches the run within a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_reaches_its_worker_before_the_next_renewal() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster_with(dir.path(), "lease_secs = 30");
    let worker = WorkerProcess::start(dir.path(), 1);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    let mut client = gateway.ws(ALICE).await;
    let running = start(&gateway, &prompt("n", 3, 20.0)).await;
    effect(dir.path(), "n-1", why).await;
    let asked = Instant::now();
    let cancelled = client.ok("agent.cancel", json!({"runId": running})).await;
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    // Not the renewal 10 s after the run started, nor the 20 s sleep.
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}\n{}",
        asked.elapsed(),
        why()
    );
    let stored = stored_events(dir.path(), &server.url(0), &running);
    assert_eq!(
        cancelled["finalSeq"].as_u64(),
        stored.last().and_then(|event| event["seq"].as_u64())
    );
    assert_one_clean_log(&stored, "CANCELED");
}

/// A model that turns hostile on a worker tries the cluster's Redis over
/// TCP: sandboxed, its command has an empty network namespace and reaches
/// nothing; without the sandbox it does (docs/cluster.md, "Security"),
/// which shows the probe would tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_model_cannot_reach_the_clusters_redis() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster_configured(dir.path(), "[tools.bash]\nsandbox = \"landlock\"", "");
    let port = server
        .url(0)
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    // Connects, says PING, and notes whether it got through.
    let probe = |tag: &str| {
        format!(
            "steps=1 tool=bash bash=echo+{tag}-tried+>>+effects.txt;exec+3<>/dev/tcp/127.0.0.1/{port}+&&+printf+'PING\\r\\n'+>&3+&&+echo+{tag}-reached+>>+effects.txt"
        )
    };
    let worker = WorkerProcess::start(dir.path(), 1);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    let run = start(&gateway, &probe("boxed")).await;
    let done = ended(&gateway, &run, Duration::from_secs(30), why).await;
    assert_eq!(done["status"], "DONE", "{done}");
    assert_one_clean_log(&stored_events(dir.path(), &server.url(0), &run), "DONE");
    let seen = effects(dir.path());
    assert_eq!(seen.get("boxed-tried"), Some(&1), "{seen:?} {}", why());
    assert_eq!(seen.get("boxed-reached"), None, "the sandboxed command reached Redis");
    drop(worker);

    let path = dir.path().join("loom.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("sandbox = \"landlock\"", "sandbox = \"none\"")).unwrap();
    let worker = WorkerProcess::start(dir.path(), 1);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    let run = start(&gateway, &probe("open")).await;
    assert_eq!(
        ended(&gateway, &run, Duration::from_secs(30), why).await["status"],
        "DONE"
    );
    assert_eq!(effects(dir.path()).get("open-reached"), Some(&1), "{}", why());
}

/// A gateway killed with SIGKILL while clients start runs: every run it
/// acknowledged (its id given) executes on the workers and is served by
/// another gateway, once; a run it did not acknowledge ran at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_load_loses_no_run_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _model, gateway) = cluster(dir.path());
    let worker = WorkerProcess::start(dir.path(), 4);
    let url = gateway.url("/v1/runs");
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let starts: Vec<_> = (0..30)
        .map(|n| {
            let (url, answered) = (url.clone(), answered.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50 * n)).await;
                let answer = http(ALICE)
                    .post(url)
                    .json(&json!({"prompt": prompt(&format!("g{n}"), 1, 0.2)}))
                    .send()
                    .await
                    .ok()?;
                let accepted: Value = answer.json().await.ok()?;
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Some((n, accepted["runId"].as_str()?.to_string()))
            })
        })
        .collect();
    // Killed once a few runs were acknowledged, while more come.
    let since = Instant::now();
    while answered.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        assert!(since.elapsed() < Duration::from_secs(30), "{}", gateway.log_text());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(gateway);
    let mut acknowledged = Vec::new();
    for start in starts {
        if let Some(found) = start.await.unwrap() {
            acknowledged.push(found);
        }
    }
    assert!(
        (1..30).contains(&acknowledged.len()),
        "the kill came mid-load: {} acknowledged",
        acknowledged.len()
    );

    let other = Gateway::start(dir.path(), &[]);
    let why = || format!("other:\n{}\nworker:\n{}", other.log_text(), worker.log_text());
    for (n, run) in &acknowledged {
        let done = ended(&other, run, Duration::from_secs(60), why).await;
        assert_eq!(done["status"], "DONE", "g{n}: {done}");
    }
    let seen = effects(dir.path());
    for (n, _) in &acknowledged {
        assert_eq!(seen.get(&format!("g{n}-1")), Some(&1), "g{n}: {seen:?}");
    }
    assert!(seen.values().all(|count| *count == 1), "a run ran twice: {seen:?}");
}

/// A client of one gateway moves to another mid-run and resubscribes
/// after its last seq: between them it sees every event once; the other
/// gateway can steer and cancel the run too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moves_to_another_gateway_and_resubscribes_after_its_last_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (server, model, gateway) = cluster(dir.path());
    let other = Gateway::start(dir.path(), &[]);
    let worker = WorkerProcess::start(dir.path(), 2);
    let why = || {
        format!(
            "gateway:\n{}\nother:\n{}\nworker:\n{}",
            gateway.log_text(),
            other.log_text(),
            worker.log_text()
        )
    };

    let mut first = gateway.ws(ALICE).await;
    let accepted = first.ok("agent.run", json!({"prompt": prompt("m", 3, 0.5)})).await;
    let run = accepted["runId"].as_str().unwrap().to_string();
    first.until(&run, "tool.result").await;
    let seen_first = first.seqs(&run);
    let last = *seen_first.last().unwrap();
    drop(first);

    let mut second = other.ws(ALICE).await;
    second
        .ok("run.subscribe", json!({"runId": run, "afterSeq": last}))
        .await;
    let end = tokio::time::timeout(Duration::from_secs(60), second.until(&run, "lifecycle.end"))
        .await
        .unwrap_or_else(|_| panic!("no end on the other gateway: {}", why()));
    assert_eq!(end["payload"]["status"], "DONE");
    let mut seqs = seen_first.clone();
    seqs.extend(second.seqs(&run));
    let stored = stored_events(dir.path(), &server.url(0), &run);
    let stored_seqs: Vec<u64> = stored.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, stored_seqs, "every event once across the two gateways");

    // A run accepted by one gateway is its session's live run on the
    // other too (`onBusy`), and is cancelled through it.
    let long = post(
        &gateway,
        "/v1/runs",
        json!({"prompt": prompt("l", 3, 1.0), "sessionId": "shared-1"}),
    )
    .await;
    let long = long["runId"].as_str().unwrap().to_string();
    effect(dir.path(), "l-1", why).await;
    let refused = second
        .error(
            "agent.run",
            json!({"prompt": "more", "sessionId": "shared-1", "onBusy": "reject"}),
        )
        .await;
    assert_eq!(refused, "CONFLICT");
    let steered = second
        .ok(
            "agent.run",
            json!({"prompt": "also mention zebras", "sessionId": "shared-1", "onBusy": "steer"}),
        )
        .await;
    assert_eq!(
        (steered["runId"].as_str(), steered["steered"].as_bool()),
        (Some(long.as_str()), Some(true))
    );
    // The steer reached the worker: the model reads it at the next turn.
    let steered_at = Instant::now();
    while !model
        .bodies()
        .iter()
        .any(|body| body.to_string().contains("also mention zebras"))
    {
        assert!(
            steered_at.elapsed() < Duration::from_secs(20),
            "the steer never reached the model: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Over HTTP: the WebSocket client above stopped reading meanwhile.
    let cancelled = post(&other, &format!("/v1/runs/{long}/cancel"), json!({})).await;
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    assert_eq!(view(&gateway, &long).await["status"], "CANCELED");
}

/// The value of the gauge `name` on a gateway's `/metrics`.
async fn gauge(gateway: &Gateway, name: &str) -> f64 {
    let text = gateway.metrics_text().await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Waits (at most 20 s) until a gateway's run gauges read `active` and
/// `queued`.
async fn gauges_reach(gateway: &Gateway, active: f64, queued: f64) {
    let started = Instant::now();
    loop {
        let now = (
            gauge(gateway, "loom_runs_active").await,
            gauge(gateway, "loom_runs_queued").await,
        );
        if now == (active, queued) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "gauges (active, queued) stay {now:?}, not {:?}",
            (active, queued)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A cluster gateway's gauges of runs are the cluster's: runs wait while
/// no worker takes them, one executes on the one slot, and a gateway
/// started again reads the same while they execute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gateways_run_gauges_count_the_clusters_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _model, mut gateway) = cluster(dir.path());
    gauges_reach(&gateway, 0.0, 0.0).await;
    start(&gateway, &prompt("a", 40, 0.5)).await;
    start(&gateway, &prompt("b", 40, 0.5)).await;
    gauges_reach(&gateway, 0.0, 2.0).await;
    let _worker = WorkerProcess::start(dir.path(), 1);
    gauges_reach(&gateway, 1.0, 1.0).await;
    gateway.terminate();
    let again = Gateway::start(dir.path(), &[]);
    gauges_reach(&again, 1.0, 1.0).await;
}

/// A run waiting for a person is parked: it frees its worker (another
/// run executes meanwhile), and the answer — given to any gateway —
/// brings it back on whichever worker is free, where it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_a_person_frees_its_worker_until_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster_with(dir.path(), "park_after_secs = 0.5");
    let parker = WorkerProcess::start_with(dir.path(), 1, &["--ask", "bash"]);
    let mut client = gateway.ws(ALICE).await;
    let asking = client.ok("agent.run", json!({"prompt": prompt("p", 1, 0.0)})).await;
    let asking = asking["runId"].as_str().unwrap().to_string();
    {
        let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), parker.log_text());
        let request = client.until(&asking, "permission.request").await;
        let request_id = request["payload"]["requestId"].as_str().unwrap().to_string();
        let started = Instant::now();
        while !parker.log_text().contains("parked until a person answers") {
            assert!(started.elapsed() < Duration::from_secs(10), "never parked: {}", why());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let parked = view(&gateway, &asking).await;
        assert_eq!(parked["status"], "WAITING_PERMISSION", "{parked}");
        assert_eq!(parked["pendingAsks"][0]["requestId"], request_id.as_str());
        // And so does the store, read without the gateway.
        assert_eq!(listed_status(dir.path(), &server.url(0), &asking), "WAITING_PERMISSION");

        // The only slot of the only worker is free: another run executes.
        let other = start(&gateway, "steps=0").await;
        assert_eq!(
            ended(&gateway, &other, Duration::from_secs(30), why).await["status"],
            "DONE"
        );
    }
    // The worker that parked it goes away; answered through the gateway,
    // the run comes back on another and goes on.
    drop(parker);
    assert_eq!(
        listed_status(dir.path(), &server.url(0), &asking),
        "WAITING_PERMISSION",
        "a parked run outlives its worker"
    );
    let taker = WorkerProcess::start_with(dir.path(), 1, &["--ask", "bash"]);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), taker.log_text());
    let request_id = view(&gateway, &asking).await["pendingAsks"][0]["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    client
        .ok(
            "permission.respond",
            json!({"runId": asking, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    let done = ended(&gateway, &asking, Duration::from_secs(30), why).await;
    assert_eq!(done["status"], "DONE", "{done}\n{}", why());
    assert_eq!(effects(dir.path()), BTreeMap::from([("p-1".into(), 1)]));
    let stored = stored_events(dir.path(), &server.url(0), &asking);
    assert_one_clean_log(&stored, "DONE");
    assert!(
        stored
            .iter()
            .any(|event| event["type"] == "lifecycle.start" && event["resumed"] == true),
        "resumed from its checkpoint: {stored:?}"
    );
    let end = client.until(&asking, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
}

/// Redis killed (SIGKILL) under load and restarted from its append-only
/// file: every run the gateway accepted ends `DONE` once it is back, no
/// side effect twice, every log whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_loses_no_accepted_run() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, _model, gateway) = cluster(dir.path());
    let first = WorkerProcess::start(dir.path(), 4);
    let second = WorkerProcess::start(dir.path(), 4);
    let why = || {
        format!(
            "gateway:\n{}\nfirst:\n{}\nsecond:\n{}",
            gateway.log_text(),
            first.log_text(),
            second.log_text()
        )
    };
    let mut runs = Vec::new();
    for i in 0..12 {
        runs.push(start(&gateway, &prompt(&format!("k{i}"), 2, 0.5)).await);
    }
    let started = Instant::now();
    while effects(dir.path()).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the runs did not start: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart().unwrap();
    for run in &runs {
        let done = ended(&gateway, run, Duration::from_secs(90), why).await;
        assert_eq!(done["status"], "DONE", "{done}\n{}", why());
        assert_one_clean_log(&stored_events(dir.path(), &server.url(0), run), "DONE");
    }
    for (line, times) in effects(dir.path()) {
        assert_eq!(times, 1, "{line} ran {times} times\n{}", why());
    }
}

/// The cluster's line: runs wait in the store with their place shown,
/// one past its bound is refused `OVERLOADED`, and a token executes at
/// most its cap at once whatever the workers could take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_line_is_bounded_shows_places_and_caps_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster_configured(dir.path(), "max_queued = 3\nmax_runs_per_token = 1", "");
    let mut waiting = Vec::new();
    for i in 0..3 {
        let accepted = post(
            &gateway,
            "/v1/runs",
            json!({"prompt": prompt(&format!("w{i}"), 1, 0.5)}),
        )
        .await;
        assert_eq!(accepted["status"], "QUEUED", "{accepted}");
        assert_eq!(accepted["queuePosition"], i + 1, "{accepted}");
        waiting.push(accepted["runId"].as_str().unwrap().to_string());
    }
    let refused = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "steps=0"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "OVERLOADED", "{body}");
    assert_eq!(view(&gateway, &waiting[2]).await["queuePosition"], 3);

    // A worker with room for three executes alice's runs one at a time.
    let worker = WorkerProcess::start(dir.path(), 3);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    effect(dir.path(), "w0-1", why).await;
    assert_eq!(view(&gateway, &waiting[1]).await["queuePosition"], 1);
    for run in &waiting {
        assert_eq!(
            ended(&gateway, run, Duration::from_secs(30), why).await["status"],
            "DONE"
        );
    }
    // Never two at once: each run began after the one before had ended.
    let spans: Vec<(String, String)> = waiting
        .iter()
        .map(|run| {
            let stored = stored_events(dir.path(), &server.url(0), run);
            let ts = |event: &Value| event["ts"].as_str().unwrap().to_string();
            (ts(&stored[0]), ts(stored.last().unwrap()))
        })
        .collect();
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "two of alice's runs overlapped: {spans:?}");
    }
}

/// A sub-agent started on a worker: a client of the gateway sees its
/// events live under its parent's, and answers its ask through the
/// gateway like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_events_and_asks_reach_the_clients_of_a_cluster_gateway() {
    let dir = tempfile::tempdir().unwrap();
    // Sub-agents are offered when loom.toml asks for them (docs/subagents.md).
    let (server, _model, gateway) = cluster_configured(dir.path(), "[tools]\ntask = true", "park_after_secs = 60");
    let worker = WorkerProcess::start_with(dir.path(), 1, &["--allow", "task", "--ask", "bash"]);
    let why = || format!("gateway:\n{}\nworker:\n{}", gateway.log_text(), worker.log_text());
    let mut client = gateway.ws(ALICE).await;
    let accepted = client
        .ok(
            "agent.run",
            json!({"prompt": "steps=1 tool=task child=steps:1+tool:bash"}),
        )
        .await;
    let run = accepted["runId"].as_str().unwrap().to_string();
    let asked = tokio::time::timeout(Duration::from_secs(30), client.until_any("permission.request"))
        .await
        .unwrap_or_else(|_| panic!("the sub-agent's ask never came: {}", why()));
    let child = asked["runId"].as_str().unwrap().to_string();
    assert_ne!(child, run, "the ask is the sub-agent's");
    let request_id = asked["payload"]["requestId"].as_str().unwrap().to_string();
    let shown = view(&gateway, &run).await;
    assert_eq!(shown["status"], "WAITING_PERMISSION", "{shown}");
    assert_eq!(shown["pendingAsks"][0]["runId"], child.as_str());
    client
        .ok(
            "permission.respond",
            json!({"runId": child, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    let end = tokio::time::timeout(Duration::from_secs(30), client.until(&run, "lifecycle.end"))
        .await
        .unwrap_or_else(|_| panic!("the run did not end: {}", why()));
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    // The sub-agent's whole log reached the client, once, in order.
    let stored = stored_events(dir.path(), &server.url(0), &child);
    let stored_seqs: Vec<u64> = stored.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(client.seqs(&child), stored_seqs, "{}", why());
    assert_one_clean_log(&stored, "DONE");
}

/// A worker with nothing to take runs from, or told to keep them
/// elsewhere, or given a lease too short to renew in time, says so and
/// exits 2 — before it takes any run.
#[test]
fn a_worker_refuses_what_it_cannot_keep() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    let refused = |toml: &str, args: &[&str], says: &str| {
        std::fs::write(dir.path().join("w.toml"), toml).unwrap();
        let out = loom_in(dir.path())
            .args(["worker", "--model", "scripted:s.json", "--config"])
            .arg(dir.path().join("w.toml"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{toml} {args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{says}: {stderr}");
    };
    refused("", &[], "a worker needs the cluster's Redis");
    // A worker has no database: it takes no --db, and its help offers none.
    refused(
        "",
        &["--redis", "redis://127.0.0.1:1/0", "--db", "x.db"],
        "unexpected argument '--db'",
    );
    let help = loom_in(dir.path()).args(["worker", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--redis") && !help.contains("--db"), "{help}");
    let cluster = "[cluster]\nredis = \"redis://127.0.0.1:1/0\"\n";
    refused(&format!("{cluster}lease_secs = 0.5\n"), &[], "lease_secs = 0.5");
    refused(&format!("{cluster}park_after_secs = -1\n"), &[], "park_after_secs");
    refused(
        &format!("{cluster}keep_finished_days = -3\n"),
        &[],
        "keep_finished_days",
    );
    refused(cluster, &[], "cannot use the Redis at redis://127.0.0.1:1/0");
}

/// Workers read `[server] allowed_modes` from their own file: a run the
/// gateway accepted in a mode the workers' file no longer allows is closed
/// cancelled with the reason, not executed; a run in an allowed mode runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_does_not_execute_a_run_in_a_mode_its_file_no_longer_allows() {
    let dir = tempfile::tempdir().unwrap();
    let (_redis, _model, gateway) =
        cluster_configured(dir.path(), "allowed_modes = [\"default\", \"accept-edits\"]", "");
    // The operator takes accept-edits off; the gateway has not restarted yet.
    let path = dir.path().join("loom.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(", \"accept-edits\"", "")).unwrap();
    let _worker = WorkerProcess::start(dir.path(), 2);
    let refused = post(
        &gateway,
        "/v1/runs",
        json!({"prompt": "write steps=1 tool=write_file", "mode": "accept-edits"}),
    )
    .await;
    let refused = refused["runId"].as_str().unwrap().to_string();
    let view = ended(&gateway, &refused, Duration::from_secs(30), String::new).await;
    assert_eq!(view["status"], "CANCELED", "{view}");
    assert!(!dir.path().join("out_1.txt").exists());
    let fine = start(&gateway, "steps=1").await;
    let view = ended(&gateway, &fine, Duration::from_secs(30), String::new).await;
    assert_eq!(view["status"], "DONE", "{view}");
}

/// Rewind and fork of a run a worker executed (docs/rewind.md): the
/// worker recorded the workspace in Redis after each step; the gateway
/// reads a step's file from there, and has the worker of the workspace's
/// machine restore the files; the fork's prompt runs on a worker. With no
/// worker serving the workspace, the gateway says so and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_a_worker_executed_is_rewound_and_forked_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster(dir.path());
    // Redis keeps its files in the workspace here: not the run's.
    std::fs::write(dir.path().join(".gitignore"), "redis/\n").unwrap();
    let worker = WorkerProcess::start(dir.path(), 2);
    let why = || worker.log_text();
    let run = start(
        &gateway,
        "steps=3 tool=bash bash=echo+STEP+>>+effects.txt;echo+made+>+fSTEP.txt",
    )
    .await;
    let view = ended(&gateway, &run, Duration::from_secs(60), why).await;
    assert_eq!(view["status"], "DONE", "{view}\n{}", why());
    assert!(dir.path().join("f3.txt").exists());
    let stored = stored_events(dir.path(), &server.url(0), &run);
    let recorded: Vec<u64> = stored
        .iter()
        .filter(|e| e["type"] == "snapshot.recorded")
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(recorded, [0, 1, 2, 3], "the worker recorded each step: {stored:?}");

    // The gateway reads a step's file from the snapshots in Redis.
    let file = get(&gateway, &format!("/v1/runs/{run}/files?step=1&path=effects.txt")).await;
    assert_eq!(file["content"], "1\n", "{file}");

    // A dry run, then the rewind: done by the worker, on its machine.
    let dry = post(
        &gateway,
        &format!("/v1/runs/{run}/rewind"),
        json!({"step": 1, "dryRun": true}),
    )
    .await;
    assert_eq!(dry["write"], json!(["effects.txt"]), "{dry}");
    assert_eq!(dry["remove"], json!(["f2.txt", "f3.txt"]), "{dry}");
    assert!(dir.path().join("f3.txt").exists(), "a dry run changes nothing");
    let rewound = post(&gateway, &format!("/v1/runs/{run}/rewind"), json!({"step": 1})).await;
    assert_eq!(rewound["remove"], json!(["f2.txt", "f3.txt"]), "{rewound}");
    assert_eq!(std::fs::read_to_string(dir.path().join("effects.txt")).unwrap(), "1\n");
    assert!(dir.path().join("f1.txt").exists());
    assert!(!dir.path().join("f2.txt").exists() && !dir.path().join("f3.txt").exists());
    let continuation = rewound["continuedBy"].as_str().unwrap_or_else(|| panic!("{rewound}"));
    let stored = stored_events(dir.path(), &server.url(0), &run);
    let told = stored
        .iter()
        .find(|e| e["type"] == "run.rewound")
        .expect("run.rewound is stored");
    assert_eq!(told["continuedBy"], continuation);

    // A fork at step 0 with a prompt: the files go back to before any
    // tool ran, and the prompt's run executes on a worker from there.
    let forked = post(
        &gateway,
        &format!("/v1/runs/{run}/fork"),
        json!({"step": 0, "prompt": "steps=1 tool=bash bash=echo+forked+>+g.txt"}),
    )
    .await;
    assert_eq!(forked["remove"], json!(["effects.txt", "f1.txt"]), "{forked}");
    let started = forked["started"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{forked}"));
    let view = ended(&gateway, started, Duration::from_secs(60), why).await;
    assert_eq!(view["status"], "DONE", "{view}");
    assert_eq!(view["sessionId"], forked["sessionId"]);
    assert!(dir.path().join("g.txt").exists() && !dir.path().join("f1.txt").exists());

    // No worker serves the workspace any more: the gateway says so once
    // its patience ran out, and nothing changed.
    let before = std::fs::read_dir(dir.path()).unwrap().count();
    drop(worker);
    let refused = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/rewind")))
        .json(&json!({"step": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let refused: Value = refused.json().await.unwrap();
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("no worker"),
        "{refused}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), before);
    assert!(!dir.path().join("f3.txt").exists());
    // A worker of the workspace started afterwards does not do it late.
    let _again = WorkerProcess::start(dir.path(), 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!dir.path().join("f3.txt").exists(), "the withdrawn rewind was not done");
    let lines = std::process::Command::new("redis-cli")
        .args(["-u", &server.url(0), "--scan", "--pattern", "loom:jobs:*"])
        .output()
        .unwrap();
    assert!(lines.stdout.is_empty(), "{}", String::from_utf8_lossy(&lines.stdout));
}

/// A snapshot record written into the cluster's Redis by whoever reaches
/// it (docs/security.md, "A crafted snapshot record"): the worker that
/// restores the files for a gateway refuses the whole rewind, the answer
/// names the record, and nothing in the workspace changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_a_crafted_snapshot_record_and_the_answer_names_it() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let (server, _model, gateway) = cluster(dir.path());
    std::fs::write(dir.path().join(".gitignore"), "redis/\n").unwrap();
    std::fs::create_dir_all(dir.path().join(".git/hooks")).unwrap();
    let worker = WorkerProcess::start(dir.path(), 2);
    let why = || worker.log_text();
    let run = start(&gateway, "steps=1 tool=bash bash=echo+made+>+f1.txt").await;
    let view = ended(&gateway, &run, Duration::from_secs(60), why).await;
    assert_eq!(view["status"], "DONE", "{view}\n{}", why());

    // The attacker's record: a hook at step 0, gone at step 1, so the
    // workspace as last recorded does not hold it and no `force` is needed.
    let url = server.url(0);
    let redis = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-u", &url])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let key = format!("loom:snap-point:{run}");
    let hook = "#!/bin/sh\nid > /tmp/loom-crafted-snapshot-pwned\n";
    let hash: String = sha2::Sha256::digest(hook).iter().map(|b| format!("{b:02x}")).collect();
    let mut zero: Value = serde_json::from_str(redis(&["HGET", &key, "0"]).trim()).unwrap();
    zero["delta"]["changed"][".git/hooks/pre-commit"] = json!({"hash": hash, "size": hook.len(), "mode": 0o755});
    redis(&["HSET", &key, "0", &zero.to_string()]);
    let mut one: Value = serde_json::from_str(redis(&["HGET", &key, "1"]).trim()).unwrap();
    one["delta"]["removed"]
        .as_array_mut()
        .unwrap()
        .push(json!(".git/hooks/pre-commit"));
    redis(&["HSET", &key, "1", &one.to_string()]);
    redis(&["SET", &format!("loom:snap-content:{hash}"), hook]);

    let answer = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/rewind")))
        .json(&json!({"step": 0}))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let answer: Value = answer.json().await.unwrap();
    assert!(!status.is_success(), "{status} {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(".git/hooks/pre-commit") && message.contains("refused"),
        "{answer}"
    );
    assert!(!dir.path().join(".git/hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f1.txt")).unwrap(),
        "made\n",
        "nothing was restored"
    );
}

/// A run a client started inside its trace (`traceparent`), executed by a
/// worker killed with SIGKILL mid-run and taken over by another, is one
/// trace beneath the client's span: the trace context is stored with the
/// run, and both workers' log lines about it carry its trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_taken_over_by_another_worker_stays_in_its_clients_trace() {
    use loom_testkit::otlp_receiver::OtlpReceiver;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const GIVEN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let (_server, _model, gateway) = cluster_with(
        dir.path(),
        &format!("\n[telemetry]\notlp_endpoint = \"{}\"\n", receiver.url()),
    );
    let first = WorkerProcess::start(dir.path(), 1);
    let accepted: Value = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .header("traceparent", GIVEN)
        .json(&json!({"prompt": prompt("t", 3, 1.5)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = accepted["runId"].as_str().unwrap().to_string();
    effect(dir.path(), "t-1", || first.log_text()).await;
    // The first worker's spans of the run have gone out (within a second).
    let waited = Instant::now();
    let before = loop {
        let spans = receiver.spans();
        if !spans.is_empty() {
            break spans;
        }
        assert!(waited.elapsed() < Duration::from_secs(10), "{}", first.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    first.signal("-KILL");
    let second = WorkerProcess::start(dir.path(), 1);
    let why = || format!("first:\n{}\nsecond:\n{}", first.log_text(), second.log_text());
    let end = ended(&gateway, &run, Duration::from_secs(60), why).await;
    assert_eq!(end["status"], "DONE", "{}", why());

    // The second worker resumed it, knowing nothing but what was stored.
    assert!(second.log_text().contains("run started"), "{}", why());
    let started = Instant::now();
    let spans = loop {
        let spans = receiver.spans();
        if spans
            .iter()
            .any(|span| span.name == "invoke_agent loom" && span.attributes["gen_ai.agent.id"] == run.as_str())
        {
            break spans;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{spans:#?}\n{}", why());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(spans.iter().all(|span| span.trace_id == GIVEN_TRACE), "{spans:#?}");
    let root = spans.iter().find(|span| span.name == "invoke_agent loom").unwrap();
    assert_eq!(root.parent.as_deref(), Some("00f067aa0ba902b7"));
    // Both workers' spans, in one trace beneath the same run span.
    assert!(spans.len() > before.len(), "the second worker sent its own: {spans:#?}");
    for sent in &before {
        assert!(spans.contains(sent), "{sent:#?}");
        assert_eq!(sent.trace_id, GIVEN_TRACE);
    }
    assert!(
        before
            .iter()
            .any(|span| span.parent.as_deref() == Some(root.span_id.as_str())),
        "the first worker's spans hang beneath the run span the second sent: {before:#?}"
    );
    let mut ids: Vec<&str> = spans.iter().map(|span| span.span_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), spans.len(), "no span sent twice: {spans:#?}");
    for worker in [&first, &second] {
        let log = worker.log_text();
        let line = log
            .lines()
            .find(|line| line.contains(&run) && line.contains("run started"))
            .unwrap_or_else(|| panic!("{log}"));
        assert!(line.contains(&format!("trace_id={GIVEN_TRACE}")), "{line}");
    }
}
