//! The real-model smoke (docs/eval.md, bench/realmodel/README.md): two short
//! tasks of `bench/realmodel/smoke.toml` through `loom eval`, against a real
//! small model behind llama.cpp's server. It asserts the mechanics, not the
//! tasks' success: the server accepts every request body Loom sends, every
//! tool call the model makes is executed or answered, and every run ends
//! with a typed status, all read from the stored events.
//!
//! It needs the server: `eval "$(bash bench/realmodel/setup.sh)"` sets
//! `BASE_URL` and `MODEL`, which this test reads as `LOOM_REALMODEL_URL`
//! and `LOOM_REALMODEL_MODEL`. Without them it is skipped — except under
//! `CI=true`, where `.ci/run` starts the server and a missing one fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

/// Statuses a run may end with (docs/events.md, `lifecycle.end`).
const TYPED_STATUSES: [&str; 5] = ["DONE", "ERROR", "CANCELED", "TIMEOUT", "INTERRUPTED"];

fn server() -> Option<(String, String)> {
    let url = std::env::var("LOOM_REALMODEL_URL").ok().filter(|url| !url.is_empty());
    let model = std::env::var("LOOM_REALMODEL_MODEL")
        .ok()
        .filter(|model| !model.is_empty());
    match (url, model) {
        (Some(url), Some(model)) => Some((url, model)),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but LOOM_REALMODEL_URL and LOOM_REALMODEL_MODEL are not set: .ci/run starts the real model with bench/realmodel/setup.sh"
            );
            eprintln!(
                "skipped: no real model (set LOOM_REALMODEL_URL and LOOM_REALMODEL_MODEL; bench/realmodel/setup.sh)"
            );
            None
        }
    }
}

fn events_of(dir: &Path, db: &Path, run_id: &str) -> Vec<Value> {
    let out = common::loom_in(dir)
        .args(["runs", "events", run_id, "--db"])
        .arg(db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn the_real_model_smoke_runs_every_request_and_call_to_a_typed_end() {
    let Some((url, model)) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/realmodel/smoke.toml");
    let (json, db) = (dir.path().join("smoke.json"), dir.path().join("runs.db"));
    let out = common::loom_in(dir.path())
        .arg("eval")
        .arg(&suite)
        .args(["--model", &format!("openai:{model}"), "--base-url", &url, "--json"])
        .arg(&json)
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // min_pass_rate is 0: the exit code says the suite ran, not that the model succeeded.
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let attempts = report["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{report}");
    for attempt in attempts {
        let run_id = attempt["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no run: {attempt}"));
        let events = events_of(dir.path(), &db, run_id);
        let named = |name: &'static str| events.iter().filter(move |event| event["type"] == name);

        // Every request body was accepted: each model call finished, and no
        // error came from the model or its server.
        assert!(named("llm.start").count() >= 1, "{attempt}");
        assert_eq!(named("llm.start").count(), named("llm.finish").count(), "{attempt}");
        for error in named("error") {
            let code = error["code"].as_str().unwrap_or_default();
            assert!(!code.starts_with("LLM"), "the server refused a request: {error}");
        }

        // Every call the model made was executed or answered (a result
        // each, an error result for a call to no tool).
        let called: BTreeSet<String> = named("tool_calls.start")
            .flat_map(|event| event["calls"].as_array().cloned().unwrap())
            .map(|call| call["callId"].as_str().unwrap().to_string())
            .collect();
        let answered: BTreeSet<String> = named("tool.result")
            .map(|event| event["callId"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(called, answered, "every call gets a result: {attempt}");

        // A typed end, the same the report gives.
        let end = named("lifecycle.end")
            .next_back()
            .unwrap_or_else(|| panic!("no end: {attempt}"));
        let status = end["status"].as_str().unwrap();
        assert!(TYPED_STATUSES.contains(&status), "{end}");
        assert_eq!(attempt["status"], status, "{attempt}");
        eprintln!(
            "{}: {status}, {} model calls, {} tool calls, passed: {}",
            attempt["case"],
            attempt["model_calls"],
            called.len(),
            attempt["passed"]
        );
    }
}
