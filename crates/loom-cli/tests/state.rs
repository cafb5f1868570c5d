//! Loom's own state is off-limits to tools: the run database wherever it
//! lives (by default outside the workspace), and what older versions kept
//! in the workspace's `.loom/`, which otherwise holds project files tools
//! may read but not change. A model that writes to the database gets a
//! clear error (and the run goes on and is recorded), and listing or
//! searching never shows it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in, script_at, succeeded, tool_results};

use serde_json::{json, Value};

fn call(name: &str, arguments: Value) -> Value {
    json!({"tool_calls": [{"name": name, "arguments": arguments}]})
}

#[test]
fn tools_cannot_touch_the_run_database_in_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "CREATE TABLE is a phrase in my notes\n").unwrap();
    std::fs::create_dir(dir.path().join(".loom")).unwrap();
    std::fs::write(dir.path().join(".loom/project.md"), "a project file\n").unwrap();
    let model = script_at(
        scripts.path(),
        "script.json",
        &json!([
            call("write_file", json!({"path": ".loom/loom.db", "content": "oops"})),
            call("read_file", json!({"path": ".loom/loom.db"})),
            call("edit_file", json!({"path": "./.loom/../.loom/loom.db-wal", "old_string": "a", "new_string": "b"})),
            call("list_dir", json!({"path": "."})),
            call("list_dir", json!({"path": ".loom"})),
            call("grep", json!({"pattern": "CREATE TABLE"})),
            call("read_file", json!({"path": ".loom/project.md"})),
            call("write_file", json!({"path": ".loom/project.md", "content": "changed"})),
            {"content": "done"}
        ]),
    );
    let output = succeeded(loom_in(dir.path()).args([
        "run",
        "--json",
        "--yes",
        "--max-steps",
        "10",
        "--model",
        &model,
        "poke around",
    ]));
    let results = tool_results(&json_lines(&output.stdout));
    for (status, content) in &results[..3] {
        assert_eq!(status, "error", "{content}");
        assert!(content.contains("Loom's own state"), "{content}");
    }
    assert!(
        !results[3].1.contains("loom.db"),
        "list_dir . shows it: {}",
        results[3].1
    );
    assert!(
        results[4].1.contains("project.md"),
        "project files are listed: {}",
        results[4].1
    );
    assert!(
        results[5].1.contains("notes.txt:1:") && results[5].1.contains("1 matching line"),
        "{}",
        results[5].1
    );

    assert!(results[6].1.contains("a project file"), "{}", results[6].1);
    assert_eq!(results[7].0, "error", "project files are read-only: {}", results[7].1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".loom/project.md")).unwrap(),
        "a project file\n"
    );
    // The database is not in the workspace, and it is owner-only.
    assert!(!dir.path().join(".loom/loom.db").exists());
    let db = common::database_of(dir.path());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(db.parent().unwrap()).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // The database is intact: the run was recorded to its end.
    let listed = loom_in(dir.path()).args(["runs", "list", "--json"]).output().unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(runs[0]["status"], "DONE");
}

#[test]
fn a_database_configured_elsewhere_in_the_workspace_is_protected_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/other.txt"), "other\n").unwrap();
    let model = script_at(
        dir.path(),
        "script.json",
        &json!([
            call("read_file", json!({"path": "data/runs.db"})),
            call("list_dir", json!({"path": "data"})),
            call("glob", json!({"pattern": "**/*"})),
            {"content": "done"}
        ]),
    );
    let output =
        succeeded(loom_in(dir.path()).args(["run", "--json", "--db", "data/runs.db", "--model", &model, "look"]));
    let results = tool_results(&json_lines(&output.stdout));
    assert!(results[0].1.contains("Loom's own state"), "{}", results[0].1);
    assert!(
        results[1].1.contains("other.txt") && !results[1].1.contains("runs.db"),
        "{}",
        results[1].1
    );
    assert!(
        results[2].1.contains("data/other.txt") && !results[2].1.contains("runs.db"),
        "{}",
        results[2].1
    );
}
