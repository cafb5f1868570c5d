//! `loom eval` end to end with the scripted model (docs/eval.md): a suite
//! is read, every attempt runs in a fresh copy of its workspace, checks
//! judge what the run left, and the table, the exit code, `--json`,
//! `--junit` and `--baseline` say so; a suite with a mistake runs nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;

use common::loom_in;
use serde_json::Value;

/// `evals/`: a case the script solves (it fixes calc.py) and one it
/// answers wrong, with the workspace both start from.
fn suite(root: &Path) {
    let evals = root.join("evals");
    std::fs::create_dir_all(evals.join("calc")).unwrap();
    std::fs::write(evals.join("calc/calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    let fix = r#"{"tool_calls":[{"name":"write_file","arguments":{"path":"calc.py","content":"def add(a, b):\n    return a + b\n"}}]}"#;
    std::fs::write(
        evals.join("fix.json"),
        format!("[{fix},{{\"content\":\"Fixed add.\"}}]"),
    )
    .unwrap();
    std::fs::write(evals.join("wrong.json"), r#"[{"content":"13"}]"#).unwrap();
    std::fs::write(
        evals.join("suite.toml"),
        r#"
[defaults]
max_steps = 4
tools = ["read_file", "write_file"]

[[case]]
name = "fix"
prompt = "Fix add in calc.py."
workspace = "calc"
model = "scripted:fix.json"
  [[case.check]]
  file_contains = { path = "calc.py", text = "a + b" }
  [[case.check]]
  tool_called = "write_file"

[[case]]
name = "question"
prompt = "How many pages? The number only."
workspace = "calc"
model = "scripted:wrong.json"
  [[case.check]]
  answer_matches = '^\s*12\s*$'
"#,
    )
    .unwrap();
}

#[test]
fn a_suite_runs_each_attempt_in_a_fresh_workspace_and_reports_what_passed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    suite(root);
    let eval = |extra: &[&str]| {
        loom_in(root)
            .args(["eval", "evals/suite.toml", "--repeat", "2", "--db", "eval.db"])
            .args(extra)
            .output()
            .unwrap()
    };
    let output = eval(&["--json", "first.json", "--junit", "first.xml"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A case below its minimum pass rate: exit code 1.
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("2 of 4 attempts passed"), "{stdout}");
    assert!(stderr.contains("question #1: FAIL"), "{stderr}");

    // The suite's own folder is untouched: attempts ran in copies.
    assert_eq!(
        std::fs::read_to_string(root.join("evals/calc/calc.py")).unwrap(),
        "def add(a, b):\n    return a - b\n"
    );

    let report: Value = serde_json::from_str(&std::fs::read_to_string(root.join("first.json")).unwrap()).unwrap();
    assert_eq!(report["runtime"], "loom");
    let attempts = report["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4);
    for attempt in attempts {
        let passed = attempt["case"] == "fix";
        assert_eq!(attempt["passed"], passed, "{attempt}");
        assert_eq!(attempt["status"], "DONE", "{attempt}");
    }
    let wrong = attempts.iter().find(|a| a["case"] == "question").unwrap();
    assert_eq!(wrong["answer"], "13");
    assert_eq!(wrong["checks"][0]["kind"], "answer_matches");
    assert_eq!(wrong["checks"][0]["passed"], false);
    let fixed = attempts.iter().find(|a| a["case"] == "fix").unwrap();
    assert_eq!(fixed["tools_called"], serde_json::json!(["write_file"]));
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases[0]["case"], "fix");
    assert_eq!(cases[0]["ok"], true);
    assert_eq!(cases[1]["ok"], false);

    let junit = std::fs::read_to_string(root.join("first.xml")).unwrap();
    assert!(junit.contains("<testsuite"), "{junit}");
    assert_eq!(junit.matches("<failure").count(), 2, "{junit}");

    // Each attempt is a recorded run: what the model did can be read back.
    let run_id = fixed["run_id"].as_str().unwrap();
    let shown = loom_in(root)
        .args(["runs", "events", run_id, "--db", "eval.db"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("write_file"),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );

    // Against the first run as a baseline: one case, compared.
    let again = eval(&["--case", "fix", "--baseline", "first.json"]);
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("fix"), "{stdout}");
}

#[test]
fn a_suite_with_a_mistake_runs_nothing_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    suite(root);
    let path = root.join("evals/suite.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("answer_matches = '^\\s*12\\s*$'", "answer_matches = '(12'"),
    )
    .unwrap();
    let output = loom_in(root)
        .args(["eval", "evals/suite.toml", "--db", "eval.db"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("question") && stderr.contains("regex"), "{stderr}");
    assert!(!root.join("eval.db").exists(), "nothing ran");
}
