//! `loom run` from the outside: the real binary, its stdout, stderr and exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::loom;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A copy of the quickstart workspace in a temporary directory.
fn quickstart_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = repo_root().join("examples/quickstart/workspace");
    for entry in ["README.md", "pages.txt", "docs/usage.md"] {
        let to = dir.path().join(entry);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(entry), to).unwrap();
    }
    dir
}

fn script(dir: &Path, body: &str) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, body).unwrap();
    format!("scripted:{}", path.display())
}

fn parse_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

fn assert_event_contract(events: &[Value]) {
    assert!(!events.is_empty());
    let mut last_seq = 0;
    for event in events {
        for key in ["type", "runId", "turnId", "parentTurnId", "depth", "seq", "ts"] {
            assert!(event.get(key).is_some(), "{key} missing in {event}");
        }
        let seq = event["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seq not increasing at {event}");
        last_seq = seq;
    }
    assert_eq!(events[0]["type"], "lifecycle.start");
    assert_eq!(events.last().unwrap()["type"], "lifecycle.end");
}

#[test]
fn quickstart_json_events_and_files_written() {
    let workspace = quickstart_copy();
    let script = repo_root().join("examples/quickstart/script.json");
    let output = loom()
        .args(["run", "--json", "--allow", "write_file", "--model"])
        .arg(format!("scripted:{}", script.display()))
        .arg("--workspace")
        .arg(workspace.path())
        .arg("Summarize this workspace into SUMMARY.md")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = parse_lines(&output.stdout);
    assert_event_contract(&events);
    let summary = std::fs::read_to_string(workspace.path().join("SUMMARY.md")).unwrap();
    assert!(summary.contains("Lighthouse"));
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for expected in [
        "iteration.start",
        "phase.start",
        "llm.start",
        "llm.delta",
        "llm.finish",
        "tool_calls.start",
        "tool.result",
        "tool_calls.complete",
        "step.completed",
        "recursion",
        "agent.finish",
    ] {
        assert!(types.contains(&expected), "no {expected} event");
    }
    let end = events.last().unwrap();
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["metrics"]["toolCalls"], 4);
    assert_eq!(end["metrics"]["inputTokens"], 412 + 508 + 640 + 702 + 830);
    let results: Vec<&Value> = events.iter().filter(|e| e["type"] == "tool.result").collect();
    assert!(results.iter().all(|r| r["status"] == "success"));
    assert!(results
        .iter()
        .all(|r| r["durationMs"].is_u64() && r["stages"].is_object()));
    let finish = events.iter().find(|e| e["type"] == "agent.finish").unwrap();
    assert_eq!(finish["turns"], 5);
}

#[test]
fn human_output_streams_the_answer_to_stdout_and_tools_to_stderr() {
    let workspace = quickstart_copy();
    let script = repo_root().join("examples/quickstart/script.json");
    let output = loom()
        .args(["run", "--yes"])
        .arg("--model")
        .arg(format!("scripted:{}", script.display()))
        .arg("--workspace")
        .arg(workspace.path())
        .arg("Summarize")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("I wrote SUMMARY.md"), "{stdout}");
    assert!(!stdout.contains("read_file("), "tool lines belong on stderr");
    let tool_lines: Vec<&str> = stderr.lines().filter(|l| l.contains(" ms")).collect();
    assert_eq!(tool_lines.len(), 4, "{stderr}");
    assert!(tool_lines[1].contains("✓ read_file(path=README.md)"), "{stderr}");
    assert!(stderr.contains("? write_file(content=# Summary"), "{stderr}");
    assert!(stderr.contains("allowed by --yes"), "{stderr}");
    assert!(workspace.path().join("SUMMARY.md").exists());
}

#[test]
fn tool_errors_are_shown_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        r#"[{"tool_calls":[{"name":"read_file","arguments":{"path":"/etc/passwd"}}]},{"content":"I cannot read outside the workspace."}]"#,
    );
    let output = loom()
        .args(["run", "--model", &model, "--workspace"])
        .arg(dir.path())
        .arg("read passwd")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("✗ read_file(path=/etc/passwd)"), "{stderr}");
    assert!(stderr.contains("outside the workspace"), "{stderr}");
}

fn exit_of(args: &[&str], cwd: &Path) -> (Option<i32>, String) {
    let output = loom().args(args).current_dir(cwd).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let malformed = script(dir.path(), "[{\"content\": }]");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", "--no-such-flag", "x"], "unexpected argument"),
        (
            vec!["run", "--model", "scripted:missing.json", "x"],
            "cannot read script missing.json",
        ),
        (vec!["run", "--model", &malformed, "x"], "invalid script"),
        (
            vec!["run", "--model", "bogus:thing", "x"],
            "unknown model provider 'bogus'",
        ),
        (vec!["run", "--model", "noprovider", "x"], "has no provider"),
        (vec!["run", "x"], "no model given"),
        (
            vec!["run", "--model", "scripted:x.json", "--max-steps", "0", "x"],
            "--max-steps",
        ),
        (
            vec!["run", "--model", "scripted:x.json", "--config", "nope.toml", "x"],
            "does not exist",
        ),
    ];
    for (args, expected) in cases {
        let (code, stderr) = exit_of(&args, dir.path());
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        if !args.contains(&"--no-such-flag") && !args.contains(&"--max-steps") {
            assert_eq!(
                stderr.trim_end().lines().count(),
                1,
                "{args:?}: one line expected: {stderr}"
            );
        }
    }
}

#[test]
fn exit_codes_for_no_answer_timeout_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let no_answer = script(
        dir.path(),
        r#"[{"tool_calls":[{"name":"list_dir","arguments":{}}]},{"content":""}]"#,
    );
    let (code, _) = exit_of(&["run", "--model", &no_answer, "--max-steps", "1", "x"], dir.path());
    assert_eq!(code, Some(3));

    std::fs::write(dir.path().join("slow.json"), r#"[{"content":"late","delay_ms":20000}]"#).unwrap();
    let (code, stderr) = exit_of(
        &["run", "--model", "scripted:slow.json", "--timeout", "1", "x"],
        dir.path(),
    );
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("RUN_TIMEOUT"), "{stderr}");

    std::fs::write(
        dir.path().join("short.json"),
        r#"[{"tool_calls":[{"name":"list_dir","arguments":{}}]}]"#,
    )
    .unwrap();
    let (code, stderr) = exit_of(&["run", "--model", "scripted:short.json", "x"], dir.path());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("SCRIPT_EXHAUSTED"), "{stderr}");
}

#[test]
fn config_file_supplies_model_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/script.yaml"),
        "- tool_calls:\n    - name: list_dir\n- content: ''\n- content: done\n",
    )
    .unwrap();
    // The script path is relative to the config file; max_steps = 1 makes the
    // empty second answer a "no answer" exit. With more steps the empty
    // answer is asked again, and the third turn answers.
    std::fs::write(
        dir.path().join("conf/loom.toml"),
        "model = \"scripted:script.yaml\"\nmax_steps = 1\n",
    )
    .unwrap();
    let (code, stderr) = exit_of(&["run", "--config", "conf/loom.toml", "x"], dir.path());
    assert_eq!(code, Some(3), "{stderr}");

    // ./loom.toml is found without --config; flags win over it.
    std::fs::write(
        dir.path().join("loom.toml"),
        "model = \"scripted:conf/script.yaml\"\nmax_steps = 1\n",
    )
    .unwrap();
    let (code, _) = exit_of(&["run", "x"], dir.path());
    assert_eq!(code, Some(3));
    let (code, stderr) = exit_of(&["run", "--max-steps", "5", "x"], dir.path());
    assert_eq!(code, Some(0), "{stderr}");

    std::fs::write(dir.path().join("loom.toml"), "modle = \"x\"\n").unwrap();
    let (code, stderr) = exit_of(&["run", "x"], dir.path());
    assert_eq!(code, Some(2));
    assert!(stderr.contains("unknown field `modle`"), "{stderr}");

    std::fs::write(
        dir.path().join("loom.toml"),
        "model = \"scripted:conf/script.yaml\"\n[permissions]\nwrite_file = \"perhaps\"\n",
    )
    .unwrap();
    let (code, stderr) = exit_of(&["run", "x"], dir.path());
    assert_eq!(code, Some(2));
    assert!(stderr.contains("'perhaps' is not a permission"), "{stderr}");

    std::fs::write(
        dir.path().join("loom.toml"),
        "model = \"scripted:conf/script.yaml\"\n[scheduler]\nmax_concurrency = 0\n",
    )
    .unwrap();
    let (code, stderr) = exit_of(&["run", "x"], dir.path());
    assert_eq!(code, Some(2));
    assert!(stderr.contains("max_concurrency"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_cleanly_and_exits_130() {
    use std::io::{BufRead, BufReader};

    let dir = tempfile::tempdir().unwrap();
    let model = script(dir.path(), r#"[{"content":"never","delay_ms":30000}]"#);
    let mut child = loom()
        .args(["run", "--json", "--model", &model, "--workspace"])
        .arg(dir.path())
        .arg("wait")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // Wait until the model call is in flight, then interrupt.
    for line in lines.by_ref() {
        if line.unwrap().contains("\"llm.start\"") {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let code = wait_with_deadline(&mut child, Duration::from_secs(20));
    assert_eq!(code, Some(130));
    let last: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(last["type"], "lifecycle.end");
    assert_eq!(last["status"], "CANCELED");
    assert!(rest
        .iter()
        .any(|l| l.contains("execution.cancelled") && l.contains("Ctrl-C")));
}

fn wait_with_deadline(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("loom did not exit after Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_stops_at_its_token_budget_from_the_flag_or_loom_toml() {
    let dir = tempfile::tempdir().unwrap();
    // Tool turns of 200 tokens each (different directories: the monitor
    // would stop a repeated call).
    let turns: Vec<Value> = ["a", "b", "c", "d"]
        .iter()
        .map(|sub| {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            serde_json::json!({
                "tool_calls": [{"name": "list_dir", "arguments": {"path": sub}}],
                "usage": {"input_tokens": 150, "output_tokens": 50}
            })
        })
        .collect();
    let model = common::script_at(dir.path(), "budget.json", &Value::Array(turns));
    let output = common::loom_in(dir.path())
        .args(["run", "--model", &model, "--max-tokens", "500", "--json", "x"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = common::json_lines(&output.stdout);
    let notable: Vec<String> = events
        .iter()
        .filter(|e| ["warning", "error"].contains(&e["type"].as_str().unwrap_or_default()))
        .map(|e| format!("{} {}", e["type"].as_str().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(notable, ["warning BUDGET_LOW", "error BUDGET_EXHAUSTED"]);
    let end = events.last().unwrap();
    assert_eq!(end["type"], "lifecycle.end");
    assert_eq!(end["status"], "ERROR");
    assert_eq!(end["metrics"]["inputTokens"], 450);

    // From loom.toml; the flag wins over it.
    std::fs::write(
        dir.path().join("loom.toml"),
        format!("model = \"{model}\"\nmax_tokens = 300\n"),
    )
    .unwrap();
    let (code, stderr) = exit_of(&["run", "x"], dir.path());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("BUDGET_EXHAUSTED"), "{stderr}");
    assert!(stderr.contains("400 of 300 tokens"), "{stderr}");
    let (_, stderr) = exit_of(&["run", "--max-tokens", "100000", "x"], dir.path());
    assert!(
        stderr.contains("SCRIPT_EXHAUSTED"),
        "ran until the script ended: {stderr}"
    );

    // Bad budgets are usage errors; a cost budget needs the model's prices.
    let (code, stderr) = exit_of(&["run", "--max-cost", "0", "x"], dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("above zero"), "{stderr}");
    let (code, stderr) = exit_of(&["run", "--max-cost", "0.5", "x"], dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("prices"), "{stderr}");
}

#[test]
fn a_sub_agent_reports_on_stderr_and_appears_in_the_run_tree() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::script_at(
        dir.path(),
        "delegate.json",
        &serde_json::json!([
            {"tool_calls": [{"name": "task", "arguments": {
                "description": "look", "prompt": "List the workspace.", "tools": ["list_dir"]}}]},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}]},
            {"content": "The child's own words."},
            {"content": "The parent's answer."}
        ]),
    );
    // `--tools` with `task` offers sub-agents where loom.toml does not.
    let output = common::loom_in(dir.path())
        .args(["run", "--model", &model, "--tools", "task,list_dir", "go"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // Only the parent's answer is the answer; the child shows on stderr.
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "The parent's answer.");
    assert!(stderr.contains("↳ sub-agent"), "{stderr}");
    assert!(
        stderr.contains("    ✓ list_dir()"),
        "the child's call, indented: {stderr}"
    );

    let runs = common::loom_in(dir.path())
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    let child = runs.iter().find(|run| run.get("parent").is_some()).unwrap();
    let parent = runs.iter().find(|run| run.get("parent").is_none()).unwrap();
    assert_eq!(child["parent"]["runId"], parent["runId"]);
    let parent_id = parent["runId"].as_str().unwrap();
    let show = common::loom_in(dir.path())
        .args(["runs", "show", parent_id])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(shown.contains("sub-agents\n  └─ "), "{shown}");
    assert!(shown.contains(child["runId"].as_str().unwrap()), "{shown}");
    // The child's events are its own log.
    let events = common::loom_in(dir.path())
        .args(["runs", "events", child["runId"].as_str().unwrap()])
        .output()
        .unwrap();
    let events = common::json_lines(&events.stdout);
    assert_eq!(events[0]["type"], "lifecycle.start");
    assert!(events
        .iter()
        .all(|e| e["depth"] == 1 && e["parentRunId"] == parent["runId"]));

    // --tree: the turns with their calls, the child's turns under its call.
    let tree = common::loom_in(dir.path())
        .args(["runs", "show", parent_id, "--tree"])
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&tree.stdout);
    let turns = tree.split("\nturns\n").nth(1).unwrap_or_default();
    let lines: Vec<&str> = turns.lines().collect();
    assert!(lines[0].starts_with("turn 1  model "), "{turns}");
    assert!(
        lines[1].starts_with("  ├─ task ") && lines[1].contains("  success  "),
        "{turns}"
    );
    assert!(
        lines[2].contains(&format!("└─ sub-agent {}", child["runId"].as_str().unwrap())),
        "{turns}"
    );
    assert!(
        lines[3].starts_with("      turn 1  model "),
        "the child's turn, indented: {turns}"
    );
    assert!(lines[4].starts_with("        ├─ list_dir {}  success"), "{turns}");
    assert!(turns.contains("      end: DONE"), "{turns}");
    assert!(lines.last().unwrap().starts_with("end: DONE  2 turns"), "{turns}");
}
