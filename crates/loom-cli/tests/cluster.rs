//! The `loom` binary on Redis (docs/cluster.md): `loom run --redis URL`
//! (or `LOOM_REDIS_URL`, or `[cluster] redis`) records its runs there,
//! `loom runs … --redis` reads them back from any directory, and `loom
//! serve` on Redis refuses to start unless told to execute runs itself.
//! Against a real `redis-server`, started per test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in};
use loom_testkit::redis_server::RedisServer;
use serde_json::Value;

const SCRIPT: &str =
    r#"[{"tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"x"}}]},{"content":"written"}]"#;

/// A server keeping its files in `dir`/redis.
fn redis(dir: &std::path::Path) -> RedisServer {
    let files = dir.join("redis");
    std::fs::create_dir_all(&files).unwrap();
    RedisServer::start(&files).unwrap_or_else(|err| panic!("{err}"))
}

fn stdout_of(output: &std::process::Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_run_recorded_in_redis_is_read_back_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let server = redis(dir.path());
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("s.json"), SCRIPT).unwrap();
    let ran = loom_in(&workspace)
        .args(["run", "--json", "--allow", "write_file", "--redis", &server.url(0)])
        .args(["--model", "scripted:s.json", "write"])
        .output()
        .unwrap();
    let seen = json_lines(stdout_of(&ran).as_bytes());
    let run_id = seen[0]["runId"].as_str().unwrap().to_string();
    assert_eq!(seen.last().unwrap()["type"], "lifecycle.end");
    // Nothing was written beside the workspace: no SQLite database.
    assert!(!common::database_of(&workspace).exists());

    // Another directory, the URL from the environment.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let listed = loom_in(&elsewhere)
        .env("LOOM_REDIS_URL", server.url(0))
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "DONE");
    assert_eq!(runs[0]["content"], "written");

    // The stored log is what the run printed, event for event.
    let events = loom_in(&elsewhere)
        .args(["runs", "events", &run_id, "--redis", &server.url(0)])
        .output()
        .unwrap();
    assert_eq!(json_lines(stdout_of(&events).as_bytes()), seen);

    let shown = loom_in(&elsewhere)
        .args(["runs", "show", &run_id, "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_str(&stdout_of(&shown)).unwrap();
    assert_eq!(shown["journal"].as_array().unwrap().len(), 1, "the write was journaled");
    assert_eq!(
        shown["messages"].as_array().unwrap().last().unwrap()["content"],
        "written"
    );
}

#[test]
fn cluster_redis_in_loom_toml_and_its_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let server = redis(dir.path());
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    std::fs::write(
        workspace.join("loom.toml"),
        format!("[cluster]\nredis = \"{}\"\n", server.url(0)),
    )
    .unwrap();
    let ran = loom_in(&workspace)
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&ran).trim(), "hi");
    let listed = loom_in(&workspace)
        .args(["runs", "list", "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1);

    // `--db` wins over a Redis URL from the environment (or the flag):
    // the run is in the database, not in Redis.
    let both = loom_in(&workspace)
        .env("LOOM_REDIS_URL", server.url(0))
        .args(["run", "--db", "x.db", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&both).trim(), "hi");
    assert!(workspace.join("x.db").is_file());
    let listed = loom_in(&workspace)
        .args(["runs", "list", "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "still only the first run");
    // `--redis` wins over `store` in loom.toml; `[cluster] redis` beside
    // `store` in one file is refused.
    std::fs::write(workspace.join("loom.toml"), "store = \"none\"\n").unwrap();
    let flag = loom_in(&workspace)
        .args(["run", "--redis", &server.url(0), "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&flag).trim(), "hi");
    std::fs::write(
        workspace.join("loom.toml"),
        format!("store = \"none\"\n[cluster]\nredis = \"{}\"\n", server.url(0)),
    )
    .unwrap();
    let contradiction = loom_in(&workspace)
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(contradiction.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&contradiction.stderr).contains("keep one"));
    std::fs::remove_file(workspace.join("loom.toml")).unwrap();
    // The URL's value never shows in help, even from the environment.
    let help = loom_in(&workspace)
        .env("LOOM_REDIS_URL", "redis://:hunter2-secret@127.0.0.1:6379/0")
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("hunter2"));

    // A Redis nobody answers at: a clear error, not a hang.
    let gone = loom_in(&workspace)
        .args([
            "run",
            "--redis",
            "redis://127.0.0.1:1/0",
            "--model",
            "scripted:s.json",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(
        stderr.contains("cannot use the Redis at redis://127.0.0.1:1/0"),
        "{stderr}"
    );
}

#[test]
fn a_gateway_on_redis_must_be_told_to_execute() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("loom.toml");
    std::fs::write(&config, "[cluster]\nredis = \"redis://127.0.0.1:1/0\"\n").unwrap();
    let refused = loom_in(dir.path())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--model",
            "scripted:s.json",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("[cluster] execute = true"), "{stderr}");
}
