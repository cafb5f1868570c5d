//! Permission modes through the binary (`--mode`): what each lets run
//! without asking, that a rule that matches still decides, and plan mode's
//! read-only tools, its plan, and the approval that carries it out.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;
use std::process::Output;

use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

/// `loom run` in `dir` against `server`, with `extra` flags, no terminal on stdin.
fn run(dir: &Path, server: &FakeServer, extra: &[&str], prompt: &str) -> Output {
    common::run_against(dir, &server.url(), "openai:m")
        .args(extra)
        .arg(prompt)
        .output()
        .unwrap()
}

fn offered(body: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn accept_edits_writes_files_without_asking_but_a_deny_rule_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "write_file", r#"{"path": "notes.txt", "content": "written"}"#),
            ("c2", "write_file", r#"{"path": "secret/key.txt", "content": "x"}"#),
            ("c3", "bash", r#"{"command": "touch ran"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let out = run(
        dir.path(),
        &server,
        &["--mode", "accept-edits", "--deny", "write_file(path=secret/**)"],
        "write",
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "written"
    );
    assert!(!dir.path().join("secret/key.txt").exists(), "the deny rule holds");
    assert!(
        !dir.path().join("ran").exists(),
        "bash still asks, and nobody can answer"
    );
    let results = common::message_texts(&server.requests()[1].body).join("\n");
    assert!(
        results.contains("the rule 'write_file(path=secret/**)' forbids"),
        "{results}"
    );
    assert!(results.contains("'bash' needs approval"), "{results}");
}

#[test]
fn bypass_runs_every_tool_without_asking_says_so_and_keeps_deny_rules() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "bash", r#"{"command": "echo hi > ran.txt"}"#),
            ("c2", "write_file", r#"{"path": "b.txt", "content": "b"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let out = run(dir.path(), &server, &["--mode", "bypass", "--deny", "write_file"], "go");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("--mode bypass: every tool call runs without asking"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("ran.txt")).unwrap(), "hi\n");
    assert!(!dir.path().join("b.txt").exists(), "--deny holds in bypass");
}

#[test]
fn an_unknown_mode_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::loom_in(dir.path())
        .args(["run", "--mode", "yolo", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode 'yolo'"));
}

/// Plan mode offers only tools that read and asks for a plan; `--yes`
/// approves it and the session's next run, in the default mode, carries it
/// out with the plan in its history.
#[test]
fn plan_mode_plans_with_read_only_tools_then_the_approved_plan_is_carried_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.rs"), "fn main() {}\n").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[("c1", "read_file", r#"{"path": "main.rs"}"#)])),
        Reply::Sse(openai_text("PLAN: add a greeting to main.rs.", 8)),
        Reply::Sse(openai_tool_calls(&[(
            "c2",
            "write_file",
            r#"{"path": "main.rs", "content": "fn main() { println!(\"hi\"); }\n"}"#,
        )])),
        Reply::Sse(openai_text("Done as planned.", 8)),
    ]);
    let out = run(dir.path(), &server, &["--mode", "plan", "--yes"], "add a greeting");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("PLAN: add a greeting") && stdout.contains("Done as planned."),
        "{stdout}"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    // Planning: only tools that read, and the instruction to plan.
    let planning = offered(&requests[0].body);
    assert_eq!(planning, ["glob", "grep", "list_dir", "read_file"], "{planning:?}");
    let system = &common::message_texts(&requests[0].body)[0];
    assert!(system.contains("# Plan mode"), "{system}");
    // Carrying out: every tool, no plan-mode instruction, the plan in the history.
    let carrying = offered(&requests[2].body);
    assert!(
        carrying.contains(&"write_file".to_string()) && carrying.contains(&"bash".to_string()),
        "{carrying:?}"
    );
    let texts = common::message_texts(&requests[2].body);
    assert!(!texts[0].contains("# Plan mode"), "{}", texts[0]);
    assert!(
        texts.iter().any(|text| text.contains("PLAN: add a greeting")),
        "{texts:?}"
    );
    assert_eq!(texts.last().unwrap(), "The plan is approved. Carry it out now.");
    assert!(std::fs::read_to_string(dir.path().join("main.rs"))
        .unwrap()
        .contains("println"));
}

#[test]
fn without_a_terminal_or_yes_the_plan_waits() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(vec![Reply::Sse(openai_text("PLAN: nothing to do.", 8))]);
    let out = run(dir.path(), &server, &["--mode", "plan"], "plan it");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("the plan waits for approval"), "{stderr}");
    assert!(stderr.contains("loom run --session "), "{stderr}");
    assert_eq!(server.requests().len(), 1, "nothing was carried out");
}
