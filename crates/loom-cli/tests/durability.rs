//! What a client was told survives the gateway's death: a run accepted
//! (queued or not) is stored before the answer, so after `kill -9` or a
//! SIGTERM and a restart it is executed, its idempotency key still finds
//! it, and runs taken back count against `max_runs` (docs/server.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::gateway::{config, http, Gateway, ALICE};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

fn run_id(accepted: &Value) -> String {
    accepted["runId"].as_str().unwrap().to_string()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_accepted_before_a_kill_9_are_executed_after_the_restart_and_their_keys_find_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), "max_runs = 1");
    let mut gateway = Gateway::start(dir.path(), &[]);
    let runs = accept_three(&gateway).await;
    // The busy run is under way when the gateway dies.
    let mut client = gateway.ws(ALICE).await;
    client
        .ok("run.subscribe", json!({"runId": runs[0], "afterSeq": 0}))
        .await;
    client.until(&runs[0], "step.completed").await;
    kill_9(&mut gateway);
    drop(gateway);

    let gateway = Gateway::start(dir.path(), &[]);
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
