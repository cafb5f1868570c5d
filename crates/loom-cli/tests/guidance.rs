//! Guidance as a real model sees it: part of the next request only, never
//! of the stored history, at most one block per request, only on a signal,
//! placed where the provider accepts it — checked in the request bodies the
//! fake server received. And the recursion monitor: defaults that let a
//! model recover from failed calls, its own stop reason, its switches.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in, message_texts, of_type, reminders, script_at, succeeded};

use loom_testkit::{anthropic_text, anthropic_tool_use, openai_text, openai_tool_calls, FakeServer, Reply};
use serde_json::{json, Value};

const TURNS: usize = 50;
/// The turn whose call fails (a file that does not exist).
const FAILING: usize = 25;

fn notes(dir: &std::path::Path) {
    let text: String = (1..=300).map(|n| format!("line {n} of the notes\n")).collect();
    std::fs::write(dir.join("notes.txt"), text).unwrap();
}

fn stored_messages(dir: &std::path::Path, run_id: &str) -> Vec<Value> {
    let out = loom_in(dir).args(["runs", "show", run_id, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["messages"].as_array().unwrap().clone()
}

#[test]
fn the_last_request_of_a_50_turn_run_holds_the_history_and_one_guidance_block() {
    let dir = tempfile::tempdir().unwrap();
    notes(dir.path());
    let mut replies: Vec<Reply> = (0..TURNS)
        .map(|i| {
            let args = if i == FAILING {
                r#"{"path": "missing.txt"}"#.to_string()
            } else {
                format!(r#"{{"path": "notes.txt", "offset": {}, "limit": 3}}"#, i * 3 + 1)
            };
            Reply::Sse(openai_tool_calls(&[(&format!("call_{i}"), "read_file", &args)]))
        })
        .collect();
    replies.push(Reply::Sse(openai_text("I read the notes.", 6)));
    let server = FakeServer::start(replies);
    let output = succeeded(
        loom_in(dir.path())
            .args([
                "run",
                "--json",
                "--model",
                "openai:local",
                "--max-steps",
                "50",
                "--base-url",
            ])
            .arg(server.url())
            .arg("read the notes"),
    );
    let requests = server.requests();
    assert_eq!(requests.len(), TURNS + 1);

    // The last request: the system prompt, the request, 50 × (assistant +
    // tool), and the final-answer instruction as the one guidance block —
    // a reminder in the last tool message, not a second system message.
    let last = &requests[TURNS].body;
    let messages = last["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    let mut expected = vec!["system", "user"];
    for _ in 0..TURNS {
        expected.extend(["assistant", "tool"]);
    }
    assert_eq!(roles, expected);
    assert_eq!(reminders(last), 1, "one guidance block");
    let texts = message_texts(last);
    assert!(
        texts[texts.len() - 1].contains("Maximum iterations reached"),
        "{}",
        texts[texts.len() - 1]
    );
    assert!(last.get("tools").is_none(), "the final call offers no tools");
    // No earlier guidance survives into it.
    assert!(!last.to_string().contains("Approaching iteration limit"));
    assert!(!last.to_string().contains("tool call failed"));

    // Guidance only where there was a signal, at most one block per request.
    for (index, request) in requests.iter().enumerate() {
        assert!(reminders(&request.body) <= 1, "request {index}");
        let systems = request.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "system")
            .count();
        assert_eq!(systems, 1, "request {index}: one system message");
    }
    let guided: Vec<usize> = (0..=TURNS).filter(|i| reminders(&requests[*i].body) == 1).collect();
    // After the failure; at 80 % of the step limit; the final call.
    assert_eq!(guided, vec![FAILING + 1, 40, TURNS]);
    assert!(requests[FAILING + 1]
        .body
        .to_string()
        .contains("The tool call failed (read_file)"));
    assert!(requests[40]
        .body
        .to_string()
        .contains("Approaching iteration limit (10 remaining)"));

    // The stored transcript holds no guidance.
    let events = json_lines(&output.stdout);
    let run_id = events[0]["runId"].as_str().unwrap();
    let stored = stored_messages(dir.path(), run_id);
    assert_eq!(stored.len(), 2 + 2 * TURNS + 1);
    assert_eq!(stored.iter().filter(|m| m["role"] == "system").count(), 1);
    let text = Value::Array(stored).to_string();
    assert!(!text.contains("system-reminder"));
    assert!(!text.contains("Maximum iterations reached"));
    assert!(!text.contains("Approaching iteration limit"));

    // The events still say what was given, with its content.
    let guidance: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["type"] == "guidance.injected")
        .map(|e| (e["reason"].as_str().unwrap(), e["content"].as_str().unwrap()))
        .collect();
    let reasons: Vec<&str> = guidance.iter().map(|(reason, _)| *reason).collect();
    assert_eq!(reasons, vec!["error", "iteration_warning", "max_steps"]);
    assert!(guidance.iter().all(|(_, content)| !content.is_empty()));
    let final_call = events.iter().rfind(|e| e["type"] == "llm.start").unwrap();
    assert_eq!(final_call["finalAnswer"], "max_steps");
}

#[test]
fn a_trailing_system_message_is_refused_at_any_server_but_the_official_api() {
    // Chat templates of local servers raise on a second system message,
    // drop it, or put it in place of the system prompt: `guidance =
    // "system"` is a configuration error there, said before any request.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.toml"), "[provider]\nguidance = \"system\"\n").unwrap();
    let server = FakeServer::start(vec![Reply::Sse(openai_text("done", 4))]);
    let output = loom_in(dir.path())
        .args(["run", "--model", "openai:local", "--base-url"])
        .arg(server.url())
        .arg("read")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("guidance = \"system\" is only for the official OpenAI API"),
        "{stderr}"
    );
    assert!(stderr.contains(&server.url()), "names the server: {stderr}");
    assert_eq!(server.request_count(), 0, "refused before any request");

    // `inline` is accepted, and is what a local server gets by default.
    std::fs::write(dir.path().join("loom.toml"), "[provider]\nguidance = \"inline\"\n").unwrap();
    succeeded(
        loom_in(dir.path())
            .args(["run", "--model", "openai:local", "--base-url"])
            .arg(server.url())
            .arg("read"),
    );
    assert_eq!(server.request_count(), 1);
}

#[test]
fn anthropic_guidance_is_a_reminder_block_in_the_last_user_turn() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(anthropic_tool_use(
            "Looking.",
            &[("tu_1", "read_file", r#"{"path": "nope.txt"}"#)],
        )),
        Reply::Sse(anthropic_text("There is no such file.")),
    ]);
    succeeded(
        loom_in(dir.path())
            .env("ANTHROPIC_API_KEY", "test-key")
            .args(["run", "--model", "anthropic:claude-test", "--base-url"])
            .arg(server.url())
            .arg("read nope.txt"),
    );
    let second = &server.requests()[1].body;
    assert!(
        !second["system"].as_str().unwrap().contains("failed"),
        "system holds only the prompt"
    );
    let turns = second["messages"].as_array().unwrap();
    let last = turns.last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"][0]["type"], "tool_result");
    assert_eq!(last["content"][1]["type"], "text");
    let reminder = last["content"][1]["text"].as_str().unwrap();
    assert!(
        reminder.starts_with("<system-reminder>\nThe tool call failed (read_file)."),
        "{reminder}"
    );
    assert_eq!(reminders(second), 1);
}

// ---- the recursion monitor ----

fn read(path: &str) -> Value {
    json!({"name": "read_file", "arguments": {"path": path}})
}

fn run_script(dir: &std::path::Path, turns: Value, extra: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    std::fs::write(dir.join("here.txt"), "here\n").unwrap();
    let model = script_at(dir, "script.json", &turns);
    let output = loom_in(dir)
        .args(["run", "--json", "--model", &model])
        .args(extra)
        .arg("explore")
        .output()
        .unwrap();
    (
        output.status.code(),
        json_lines(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn failed_reads_while_exploring_do_not_stop_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // Four calls, two failing: the old defaults took the tools away here.
    let turns = json!([
        {"tool_calls": [read("a.txt"), read("here.txt")]},
        {"tool_calls": [read("b.txt"), read("here.txt")]},
        {"tool_calls": [read("c.txt")]},
        {"content": "found it in here.txt"}
    ]);
    let (code, events, stderr) = run_script(dir.path(), turns, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(of_type(&events, "tool.result").len(), 5, "the tools stayed");
    let end = events.last().unwrap();
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["content"], "found it in here.txt");
    assert!(of_type(&events, "warning").is_empty(), "{events:?}");
}

#[test]
fn a_monitor_verdict_has_its_own_stop_reason_code_and_message() {
    let dir = tempfile::tempdir().unwrap();
    // Eight failed calls, over eight turns: the error rule's verdict.
    let mut turns: Vec<Value> = (0..8)
        .map(|i| json!({"tool_calls": [read(&format!("missing-{i}.txt"))]}))
        .collect();
    turns.push(json!({"content": ""}));
    let (code, events, stderr) = run_script(dir.path(), Value::Array(turns), &["--max-steps", "20"]);
    assert_eq!(code, Some(1), "{stderr}");
    let verdict = of_type(&events, "warning");
    assert_eq!(verdict.len(), 1, "{verdict:?}");
    assert_eq!(verdict[0]["code"], "MONITOR_STOP");
    assert!(
        verdict[0]["message"]
            .as_str()
            .unwrap()
            .contains("8 of the last 8 tool calls failed, over 8 turns"),
        "{}",
        verdict[0]["message"]
    );
    let last_call = of_type(&events, "llm.start").pop().unwrap();
    assert_eq!(last_call["finalAnswer"], "error_threshold");
    assert_eq!(last_call["toolsOffered"], false);
    let error = of_type(&events, "error").pop().unwrap();
    assert_eq!(error["code"], "MONITOR_STOPPED");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("after 8 of 20 steps"), "{message}");
    assert!(!message.contains("step limit"), "{message}");
    assert_eq!(events.last().unwrap()["status"], "ERROR");

    // A verdict that would come with the step limit gives way to it: one
    // reason, not two that contradict each other.
    let dir = tempfile::tempdir().unwrap();
    let (code, events, _) = run_script(dir.path(), failing_reads(8), &["--max-steps", "8"]);
    assert_eq!(code, Some(0));
    assert_eq!(of_type(&events, "llm.start").pop().unwrap()["finalAnswer"], "max_steps");
    assert!(of_type(&events, "warning").is_empty());

    // With an answer, the verdict's final call ends the run well.
    let dir = tempfile::tempdir().unwrap();
    let mut turns: Vec<Value> = (0..8)
        .map(|i| json!({"tool_calls": [read(&format!("missing-{i}.txt"))]}))
        .collect();
    turns.push(json!({"content": "none of the files exist"}));
    let (code, events, _) = run_script(dir.path(), Value::Array(turns), &["--max-steps", "20"]);
    assert_eq!(code, Some(0));
    assert_eq!(events.last().unwrap()["content"], "none of the files exist");
}

fn failing_reads(n: usize) -> Value {
    let mut turns: Vec<Value> = (0..n)
        .map(|i| json!({"tool_calls": [read(&format!("missing-{i}.txt"))]}))
        .collect();
    turns.push(json!({"content": "nothing found"}));
    Value::Array(turns)
}

#[test]
fn the_monitor_and_guidance_have_their_own_switches() {
    let turns = failing_reads(12);

    // The monitor off: twelve failures in a row, and the run goes on.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.toml"), "[feedback]\nmonitor = false\n").unwrap();
    let (code, events, stderr) = run_script(dir.path(), turns, &["--max-steps", "20"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(of_type(&events, "warning").is_empty());
    assert_eq!(of_type(&events, "tool.result").len(), 12);
    assert!(
        !of_type(&events, "guidance.injected").is_empty(),
        "feedback is still on"
    );

    // Guidance off: no guidance at all, but the monitor still stops the tools.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.toml"), "[feedback]\nenabled = false\n").unwrap();
    let (code, events, stderr) = run_script(dir.path(), failing_reads(8), &["--max-steps", "20"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(of_type(&events, "warning")[0]["code"], "MONITOR_STOP");
    let given: Vec<&str> = of_type(&events, "guidance.injected")
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    // Only the final-answer call's instruction, which is not feedback.
    assert_eq!(given, vec!["error_threshold"]);
}

#[test]
fn monitor_thresholds_are_validated() {
    for (setting, words) in [
        (
            "error_threshold = 1.5",
            "error_threshold must be more than 0 and at most 1 (got 1.5)",
        ),
        (
            "error_threshold = 0",
            "error_threshold must be more than 0 and at most 1 (got 0)",
        ),
        ("loop_window = -1", "loop_window must not be negative (got -1)"),
        ("error_window = -3", "error_window must not be negative (got -3)"),
        (
            "duplicate_threshold = -2",
            "duplicate_threshold must not be negative (got -2)",
        ),
        ("warning_ratio = 2.0", "warning_ratio must be more than 0 and at most 1"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("loom.toml"), format!("[feedback]\n{setting}\n")).unwrap();
        let (code, _, stderr) = run_script(dir.path(), json!([{"content": "hi"}]), &[]);
        assert_eq!(code, Some(2), "{setting}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{setting}: one line: {stderr}");
        assert!(stderr.contains(&format!("[feedback] {words}")), "{setting}: {stderr}");
    }
}

/// The near misses of a small model behind llama.cpp (bench/realmodel), as
/// its server sends them: a function of the task called as a tool (refused
/// with how to reach it), a call repeated with its arguments copied in
/// escaped form (read back as meant), a result written as the file (refused,
/// the good file left as it was) — and the send-back after an empty answer
/// repeats the task.
#[test]
fn a_small_models_near_misses_are_answered_at_their_cause_and_the_task_is_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let task = "write hello to out.txt, then fix slugify";
    let replies = vec![
        Reply::Sse(openai_tool_calls(&[("c1", "slugify", r#"{"text": "Hello"}"#)])),
        Reply::Sse(openai_tool_calls(&[(
            "c2",
            "write_file",
            r#"{"path": "out.txt", "content": "hello\n"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "c3",
            "write_file",
            r#"{"path": "out.txt\"}}", "content": "hello\\n\",\"path\":\"out.txt\"}}"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "c4",
            "write_file",
            // A result the file does not hold (it has 6 bytes): an error.
            r#"{"path": "out.txt", "content": "Created 'out.txt': 12 bytes, 1 lines."}"#,
        )])),
        Reply::Sse(openai_text("", 1)),
        Reply::Sse(openai_text("Done.", 2)),
    ];
    let server = FakeServer::start(replies);
    let output = succeeded(
        loom_in(dir.path())
            .args(["run", "--json", "--yes", "--model", "openai:local", "--base-url"])
            .arg(server.url())
            .arg(task),
    );
    let events = json_lines(&output.stdout);
    let results: Vec<(String, String)> = of_type(&events, "tool.result")
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap().to_string(),
                r["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(results.len(), 4, "{results:?}");
    let (status, code_name) = &results[0];
    assert_eq!(status, "error");
    assert!(code_name.contains("no tool named 'slugify'"), "{code_name}");
    assert!(
        code_name.contains("find its file with grep (pattern 'slugify')"),
        "{code_name}"
    );
    assert_eq!(results[1].0, "success", "{:?}", results[1]);
    // The escaped copy is read back into the call the model meant, and the
    // history keeps that call, not the copy.
    let (status, copied) = &results[2];
    assert_eq!(status, "success", "{copied}");
    assert!(copied.starts_with("Replaced 'out.txt': 6 bytes"), "{copied}");
    let calls = of_type(&events, "tool_calls.start");
    assert_eq!(
        calls[2]["calls"][0]["args"],
        json!({"path": "out.txt", "content": "hello\n"})
    );
    let (status, echoed) = &results[3];
    assert_eq!(status, "error");
    assert!(
        echoed.contains("nothing written") && echoed.contains("'out.txt' is unchanged"),
        "{echoed}"
    );
    // Judged from the workspace: the good file, and no file named from a tail.
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap(), "hello\n");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|name| !name.contains('"')), "{names:?}");
    // The retry after the empty answer carries the task in its one reminder.
    let requests = server.requests();
    assert_eq!(requests.len(), 6);
    assert_eq!(reminders(&requests[5].body), 1);
    let retry = requests[5].body.to_string();
    assert!(retry.contains(&format!("The task you were given: {task}")), "{retry}");
    assert_eq!(events.last().unwrap()["status"], "DONE");
}

/// The result of a write, written over the file that write made: nothing
/// is written, and since the file holds what the result says, the model
/// hears it as a success (its work is done) — so the empty answer after it
/// ends the run.
#[test]
fn writing_the_result_of_a_write_the_file_still_holds_is_a_confirmation() {
    let dir = tempfile::tempdir().unwrap();
    let replies = vec![
        Reply::Sse(openai_tool_calls(&[(
            "c1",
            "write_file",
            r#"{"path": "stats.txt", "content": "count=8\n"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "c2",
            "write_file",
            r#"{"path": "stats.txt", "content": "Created 'stats.txt': 8 bytes, 1 lines."}"#,
        )])),
        Reply::Sse(openai_text("", 1)),
    ];
    let server = FakeServer::start(replies);
    let output = succeeded(
        loom_in(dir.path())
            .args(["run", "--json", "--yes", "--model", "openai:local", "--base-url"])
            .arg(server.url())
            .arg("save count=8 to stats.txt"),
    );
    let events = json_lines(&output.stdout);
    let confirmed = of_type(&events, "tool.result").pop().unwrap();
    assert_eq!(confirmed["status"], "success", "{confirmed}");
    let text = confirmed["content"].as_str().unwrap();
    assert!(
        text.contains("nothing written") && text.contains("already holds those 8 bytes"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("stats.txt")).unwrap(),
        "count=8\n"
    );
    assert_eq!(server.requests().len(), 3, "the empty answer after it ends the run");
    assert_eq!(events.last().unwrap()["status"], "DONE");
}
