//! `loom run` against real provider wire formats, served by a fake server
//! on 127.0.0.1: whole runs, a missing key, retries exhausted, Ctrl-C on a
//! slow stream, prices, and a recorded run replayed offline.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::loom_in;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use loom_testkit::{
    anthropic_text, anthropic_tool_use, comparable_events, openai_text, openai_tool_calls, FakeServer, Reply,
};
use serde_json::{json, Value};

fn events(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn write_call_then_answer_openai() -> Vec<Reply> {
    vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_w",
            "write_file",
            r#"{"path": "notes/hello.txt", "content": "hello from the model"}"#,
        )])),
        Reply::Sse(openai_text("I wrote notes/hello.txt.", 5)),
    ]
}

#[test]
fn openai_compatible_run_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(write_call_then_answer_openai());
    let output = loom_in(dir.path())
        .env("OPENAI_API_KEY", "sk-test-123")
        .args([
            "run",
            "--json",
            "--allow",
            "write_file",
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
        ])
        .arg(format!("{}/v1", server.url()))
        .arg("write a note")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/hello.txt")).unwrap(),
        "hello from the model"
    );
    let events = events(&output);
    let end = events.last().unwrap();
    assert_eq!(end["type"], "lifecycle.end");
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["content"], "I wrote notes/hello.txt.");
    assert_eq!(end["metrics"]["inputTokens"], 70);
    assert_eq!(events[0]["model"], "openai:gpt-4o-mini");
    let requests = server.requests();
    assert_eq!(requests[0].headers["authorization"], "Bearer sk-test-123");
    assert_eq!(requests[1].body["messages"][3]["role"], "tool");
    assert_eq!(requests[1].body["messages"][3]["tool_call_id"], "call_w");
}

#[test]
fn anthropic_run_end_to_end_with_env_base_url() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "forty-two").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(anthropic_tool_use(
            "Reading.",
            &[("toolu_r", "read_file", r#"{"path": "data.txt"}"#)],
        )),
        Reply::Sse(anthropic_text("The file says forty-two.")),
    ]);
    let output = loom_in(dir.path())
        .env("ANTHROPIC_API_KEY", "ant-key")
        .env("ANTHROPIC_BASE_URL", server.url())
        .args([
            "run",
            "--model",
            "anthropic:claude-sonnet-4-20250514",
            "what does data.txt say?",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("The file says forty-two."), "{stdout}");
    assert!(stderr(&output).contains("✓ read_file(path=data.txt)"));
    let second = &server.requests()[1];
    assert_eq!(second.headers["x-api-key"], "ant-key");
    assert_eq!(second.body["messages"][2]["content"][0]["type"], "tool_result");
    assert!(second.body["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap()
        .contains("forty-two"));
}

#[test]
fn a_missing_api_key_is_one_line_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let output = loom_in(dir.path())
        .args(["run", "--model", "openai:gpt-4o-mini", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert_eq!(text.trim_end().lines().count(), 1, "{text}");
    assert!(text.contains("OPENAI_API_KEY is not set"), "{text}");
    let output = loom_in(dir.path())
        .args(["run", "--model", "anthropic:claude-x", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("ANTHROPIC_API_KEY is not set"));
}

#[test]
fn retries_exhausted_exit_1_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.toml"),
        "[provider]\nmax_attempts = 2\nretry_base_ms = 10\n",
    )
    .unwrap();
    let server = FakeServer::start(vec![
        Reply::status(502, json!({"error": {"message": "bad gateway"}})),
        Reply::status(502, json!({"error": {"message": "bad gateway"}})),
    ]);
    let output = loom_in(dir.path())
        .args(["run", "--model", "openai:m", "--base-url"])
        .arg(server.url())
        .arg("x")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(text.contains("LLM_SERVER"), "{text}");
    assert!(text.contains("gave up after 2 attempts"), "{text}");
    assert!(
        text.contains("model call failed; retrying"),
        "the retry is logged: {text}"
    );
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn prices_in_the_config_give_the_cost() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.toml"),
        "[prices.\"openai:gpt-4o-mini\"]\ninput_per_mtok = 0.15\noutput_per_mtok = 0.60\n",
    )
    .unwrap();
    let server = FakeServer::start(vec![Reply::Sse(openai_text("cheap", 5))]);
    let output = loom_in(dir.path())
        .args(["run", "--json", "--model", "openai:gpt-4o-mini", "--base-url"])
        .arg(server.url())
        .arg("x")
        .output()
        .unwrap();
    let events = events(&output);
    let cost = events.last().unwrap()["metrics"]["costUsd"].as_f64().unwrap();
    let expected = (20.0 * 0.15 + 2.0 * 0.60) / 1e6;
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_slow_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(vec![Reply::SlowSse {
        body: openai_text("a very slow answer that takes many seconds to stream", 3),
        delay: Duration::from_millis(300),
    }]);
    let mut child = loom_in(dir.path())
        .args(["run", "--json", "--model", "openai:m", "--base-url"])
        .arg(server.url())
        .arg("x")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().contains("\"llm.delta\"") {
            break;
        }
    }
    let started = Instant::now();
    assert!(Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "cancel reached the stream");
    assert_eq!(status.code(), Some(130));
    let last: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(last["status"], "CANCELED");
}

#[test]
fn a_recorded_run_replays_offline_with_the_same_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(write_call_then_answer_openai());
    let live = loom_in(dir.path())
        .args([
            "run",
            "--json",
            "--allow",
            "write_file",
            "--record",
            "run.json",
            "--model",
            "openai:m",
            "--base-url",
        ])
        .arg(server.url())
        .arg("write a note")
        .output()
        .unwrap();
    assert_eq!(live.status.code(), Some(0), "{}", stderr(&live));
    std::fs::remove_dir_all(dir.path().join("notes")).unwrap();

    let replay = loom_in(dir.path())
        .args([
            "run",
            "--json",
            "--allow",
            "write_file",
            "--model",
            "scripted:run.json",
            "write a note",
        ])
        .output()
        .unwrap();
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    // The snapshots differ on purpose: the replay's step 0 records what
    // changed since the live run (its notes/ removed, the recording made).
    let without_snapshots = |events: Vec<Value>| -> Vec<Value> {
        comparable_events(&events)
            .into_iter()
            .filter(|event| event["type"] != "snapshot.recorded")
            .collect()
    };
    assert_eq!(without_snapshots(events(&live)), without_snapshots(events(&replay)));
    assert!(
        dir.path().join("notes/hello.txt").exists(),
        "the replay ran the tools for real"
    );
    let script: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(script[0]["tool_calls"][0]["id"], "call_w");
    assert_eq!(script[1]["content"], "I wrote notes/hello.txt.");
}
