//! What a client was told survives the gateway's death: a run accepted
//! (queued or not) is stored before the answer, so after `kill -9` or a
//! SIGTERM and a restart it is executed, its idempotency key still finds
//! it, and runs taken back count against `max_runs` (docs/server.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::gateway::{config, http, run_id, Gateway, ALICE};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

/// `POST /v1/runs` with an idempotency key; the answer's status and body.
async fn post(gateway: &Gateway, key: &str, prompt: &str) -> (u16, Value) {
    let response = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .header("Idempotency-Key", key)
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn get(gateway: &Gateway, run: &str) -> (u16, Value) {
    let response = http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{run}")))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Follows `run` from its first event to `lifecycle.end`; its status.
async fn ends(gateway: &Gateway, run: &str) -> String {
    let mut client = gateway.ws(ALICE).await;
    client.ok("run.subscribe", json!({"runId": run, "afterSeq": 0})).await;
    let end = tokio::time::timeout(Duration::from_secs(60), client.until(run, "lifecycle.end"))
        .await
        .unwrap_or_else(|_| panic!("run {run} did not end: {}", gateway.log_text()));
    end["payload"]["status"].as_str().unwrap().to_string()
}

fn kill_9(gateway: &mut Gateway) {
    gateway.child.kill().unwrap();
    gateway.child.wait().unwrap();
}

/// Three accepted runs, one executing and two queued, with keys.
async fn accept_three(gateway: &Gateway) -> [String; 3] {
    let (status, busy) = post(gateway, "k-busy", "long steps=4 delay_ms=400").await;
    assert_eq!(status, 202, "{busy}");
    let (status, first) = post(gateway, "k-first", "first steps=0").await;
    assert_eq!((status, first["status"].as_str()), (202, Some("QUEUED")), "{first}");
    let (status, second) = post(gateway, "k-second", "second steps=1").await;
    assert_eq!((status, second["status"].as_str()), (202, Some("QUEUED")), "{second}");
    [run_id(&busy), run_id(&first), run_id(&second)]
}

/// The names of the tools a model request offered.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|tool| tool["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_taken_back_after_a_kill_9_keeps_the_tools_its_request_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    config(dir.path(), &model.url(), "");
    let mut gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
    let response = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "look steps=3 delay_ms=300", "tools": ["list_dir"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let run = run_id(&response.json().await.unwrap());
    let mut client = gateway.ws(ALICE).await;
    client.ok("run.subscribe", json!({"runId": run, "afterSeq": 0})).await;
    client.until(&run, "step.completed").await;
    kill_9(&mut gateway);
    drop(gateway);
    let before = model.request_count();

    // Not from a terminal, which knows neither its request nor the gateway's rules.
    let resumed = common::loom_in(dir.path())
        .args(["runs", "resume", &run, "--config"])
        .arg(dir.path().join("loom.toml"))
        .env("OPENAI_API_KEY", "test-key")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(2), "{said}");
    assert!(said.contains("belongs to a gateway"), "{said}");
    assert_eq!(model.request_count(), before, "nothing ran");

    let gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
    assert_eq!(ends(&gateway, &run).await, "DONE", "{}", gateway.log_text());
    let bodies = model.bodies();
    assert!(
        bodies[before..].iter().any(|body| offered(body) == ["list_dir"]),
        "the resumed run was offered its tool: {:?}",
        bodies[before..].iter().map(offered).collect::<Vec<_>>()
    );
    for (n, body) in bodies.iter().enumerate() {
        let tools = offered(body);
        assert!(
            tools.is_empty() || tools == ["list_dir"],
            "request {n} ({}) offered {tools:?}",
            if n < before {
                "before the kill"
            } else {
                "after the restart"
            }
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_accepted_before_a_kill_9_are_executed_after_the_restart_and_their_keys_find_them() {
    let dir = tempfile::tempdir().unwrap();
    accepted_runs_survive_a_kill_9(dir.path(), "max_runs = 1").await;
}

/// The same on Redis (docs/cluster.md): a gateway that executes its runs
/// itself, its store a real `redis-server` with its append-only file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_runs_accepted_before_a_kill_9_are_executed_after_the_restart_and_their_keys_find_them() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("redis");
    std::fs::create_dir(&files).unwrap();
    let redis = loom_testkit::redis_server::RedisServer::start(&files).unwrap_or_else(|err| panic!("{err}"));
    let workspace = dir.path().join("gateway");
    std::fs::create_dir(&workspace).unwrap();
    let extra = format!(
        "max_runs = 1\n\n[cluster]\nredis = \"{}\"\nexecute = true\n",
        redis.url(0)
    );
    accepted_runs_survive_a_kill_9(&workspace, &extra).await;
    assert!(
        !workspace.join(".loom").exists() && std::fs::read_dir(&workspace).unwrap().count() == 1,
        "only loom.toml is in the workspace: runs went to Redis"
    );
}

async fn accepted_runs_survive_a_kill_9(dir: &std::path::Path, extra: &str) {
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir, &model.url(), extra);
    let mut gateway = Gateway::start(dir, &[]);
    let runs = accept_three(&gateway).await;
    // The busy run is under way when the gateway dies.
    let mut client = gateway.ws(ALICE).await;
    client
        .ok("run.subscribe", json!({"runId": runs[0], "afterSeq": 0}))
        .await;
    client.until(&runs[0], "step.completed").await;
    kill_9(&mut gateway);
    drop(gateway);

    let gateway = Gateway::start(dir, &[]);
    // Every id answers, and a retry with the same key gets the same run.
    for run in &runs {
        let (status, view) = get(&gateway, run).await;
        assert_eq!(status, 200, "{run}: {view}");
    }
    let (status, again) = post(&gateway, "k-first", "first steps=0").await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(run_id(&again), runs[1]);
    let (_, again) = post(&gateway, "k-second", "second steps=1").await;
    assert_eq!(run_id(&again), runs[2]);
    // All three run to the end — one at a time: the resumed run counts
    // against max_runs, so the queued ones wait for it.
    for run in &runs {
        assert_eq!(ends(&gateway, run).await, "DONE", "{run}: {}", gateway.log_text());
    }
    let (_, listed) = {
        let response = http(ALICE).get(gateway.url("/v1/runs?limit=10")).send().await.unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    };
    let mut starts: Vec<(u64, u64)> = Vec::new();
    for run in &runs {
        let row = listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["runId"] == run.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{run} is listed: {listed}"));
        assert_eq!(row["status"], "DONE");
        starts.push((row["startedMs"].as_u64().unwrap(), row["endedMs"].as_u64().unwrap()));
    }
    // The queued runs started after the resumed one ended.
    assert!(starts[1].1 >= starts[0].1 && starts[2].1 >= starts[1].1, "{starts:?}");
    let log = gateway.log_text();
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_leaves_queued_runs_queued_for_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), "max_runs = 1");
    let mut gateway = Gateway::start(dir.path(), &[]);
    let runs = accept_three(&gateway).await;
    assert!(gateway.terminate().success(), "{}", gateway.log_text());
    drop(gateway);

    // Before the restart, the store says QUEUED (not CANCELED).
    let out = common::loom_in(dir.path())
        .args(["runs", "show", &runs[1], "--json"])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        shown["run"]["status"],
        "QUEUED",
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let gateway = Gateway::start(dir.path(), &[]);
    for run in &runs {
        assert_eq!(ends(&gateway, run).await, "DONE", "{run}: {}", gateway.log_text());
    }
}

/// The run's own events an SSE stream carried: `(seq, event)` per `id:`.
fn sse_events(text: &str, run: &str) -> Vec<(u64, Value)> {
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut id = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(rest) = line.strip_prefix("id:") {
                id = rest.trim().parse::<u64>().ok();
            } else if let Some(rest) = line.strip_prefix("data:") {
                data = serde_json::from_str::<Value>(rest.trim()).ok();
            }
        }
        if let (Some(id), Some(data)) = (id, data) {
            if data["runId"] == run {
                events.push((id, data));
            }
        }
    }
    events
}

/// Reads an SSE response until the connection ends; whole events only.
async fn read_sse(mut response: reqwest::Response, run: String) -> Vec<(u64, Value)> {
    let mut text = String::new();
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(60), response.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // A block cut by the kill has no blank line after it: it is not whole.
    let whole = text.rfind("\n\n").map_or("", |end| &text[..end + 2]);
    sse_events(whole, &run)
}

async fn sse_from(gateway: &Gateway, run: &str, after: Option<u64>) -> reqwest::Response {
    let mut request = http(ALICE).get(gateway.url(&format!("/v1/runs/{run}/events")));
    if let Some(after) = after {
        request = request.header("Last-Event-ID", after.to_string());
    }
    request.send().await.unwrap()
}

/// A WebSocket client's events of `run`: `(seq, event)`.
fn ws_events(client: &common::gateway::Client, run: &str) -> Vec<(u64, Value)> {
    client
        .events
        .iter()
        .filter(|frame| frame["runId"] == run)
        .map(|frame| (frame["seq"].as_u64().unwrap(), frame["payload"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_clients_saw_before_a_kill_9_and_after_the_restart_is_the_stored_log() {
    // Trials at different moments of the run: before, during and after
    // tool calls, while the model streams.
    let trials: u64 = if std::env::var_os("LOOM_LONG_TRIALS").is_some() {
        40
    } else {
        6
    };
    let mut mismatches = Vec::new();
    for trial in 0..trials {
        let seed = 1_000 + trial;
        let mut rng = fastrand::Rng::with_seed(seed);
        let dir = tempfile::tempdir().unwrap();
        let model = PromptModel::start(PromptModelOptions::default());
        config(dir.path(), &model.url(), "");
        let mut gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
        let mut client = gateway.ws(ALICE).await;
        let accepted = client
            .ok(
                "agent.run",
                json!({"prompt": "work steps=4 tool=write_file delay_ms=120 chunk_ms=15 long=6"}),
            )
            .await;
        // The run's events follow on this connection.
        let run = run_id(&accepted);
        let sse = tokio::spawn(read_sse(sse_from(&gateway, &run, None).await, run.clone()));
        let reader = tokio::spawn(async move {
            while client.frame().await.is_some() {}
            client
        });
        tokio::time::sleep(Duration::from_millis(rng.u64(50..1_400))).await;
        kill_9(&mut gateway);
        drop(gateway);
        let client = reader.await.unwrap();
        let mut ws_seen = ws_events(&client, &run);
        let mut sse_seen = sse.await.unwrap();

        let gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
        // Each client continues after the last seq it got.
        let mut again = gateway.ws(ALICE).await;
        let after = ws_seen.last().map_or(0, |(seq, _)| *seq);
        again
            .ok("run.subscribe", json!({"runId": run, "afterSeq": after}))
            .await;
        again.until(&run, "lifecycle.end").await;
        ws_seen.extend(ws_events(&again, &run));
        let after = sse_seen.last().map(|(seq, _)| *seq);
        sse_seen.extend(read_sse(sse_from(&gateway, &run, after).await, run.clone()).await);

        // The stored log, read whole by a new client.
        let mut log_reader = gateway.ws(ALICE).await;
        log_reader
            .ok("run.subscribe", json!({"runId": run, "afterSeq": 0}))
            .await;
        let end = log_reader.until(&run, "lifecycle.end").await;
        assert_eq!(end["payload"]["status"], "DONE", "trial {seed}: {}", gateway.log_text());
        let log = ws_events(&log_reader, &run);
        let seqs: Vec<u64> = log.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "trial {seed}: the log has no gap"
        );
        for (client, seen) in [("websocket", &ws_seen), ("sse", &sse_seen)] {
            if *seen != log {
                let first = seen
                    .iter()
                    .zip(&log)
                    .position(|(a, b)| a != b)
                    .unwrap_or(seen.len().min(log.len()));
                mismatches.push(format!(
                    "trial {seed} ({client}): {} events seen, {} in the log; first difference at #{first}: saw {:?}, log has {:?}",
                    seen.len(),
                    log.len(),
                    seen.get(first).map(|(seq, e)| (seq, e["type"].clone())),
                    log.get(first).map(|(seq, e)| (seq, e["type"].clone())),
                ));
            }
        }
        // Each of the four writes has one result, whatever the moment of
        // the kill: none ran twice (a call the kill cut short is reported
        // as such, not run again).
        let mut calls: Vec<String> = log
            .iter()
            .filter(|(_, e)| e["type"] == "tool.result")
            .map(|(_, e)| e["callId"].as_str().unwrap().to_string())
            .collect();
        let results = calls.len();
        calls.sort();
        calls.dedup();
        let story: Vec<String> = log
            .iter()
            .filter(|(_, e)| {
                let kind = e["type"].as_str().unwrap_or_default();
                kind.starts_with("tool.") || kind.starts_with("lifecycle.") || kind == "llm.finish"
            })
            .map(|(seq, e)| format!("{seq} {} {}", e["type"], e["callId"]))
            .collect();
        assert_eq!((results, calls.len()), (4, 4), "trial {seed}: {story:#?}");
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
