//! `loom run` makes its runs durable: the workspace's database in Loom's
//! state directory by default, `--db`,
//! `store = "none"`, `--session`, and a bad database is a clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::loom_in;

use loom::stores::SqliteStore;
use loom::{RunIndex, RunLog, RunStatus};

const SCRIPT: &str =
    r#"[{"tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"x"}}]},{"content":"written"}]"#;

#[tokio::test]
async fn runs_are_recorded_in_the_workspace_database() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), SCRIPT).unwrap();
    let output = loom_in(dir.path())
        .args([
            "run",
            "--allow",
            "write_file",
            "--session",
            "s-42",
            "--model",
            "scripted:s.json",
            "write",
        ])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let store = SqliteStore::open(common::database_of(dir.path())).unwrap();
    let runs = store.list_runs(10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Done);
    assert_eq!(runs[0].session_id, "s-42");
    assert_eq!(runs[0].content.as_deref(), Some("written"));
    let snapshot = store.load_run(&runs[0].run_id).await.unwrap();
    assert_eq!(snapshot.journal.len(), 1, "the write was journaled");
    assert_eq!(snapshot.messages.last().unwrap().content(), "written");
    assert!(!store.events(&runs[0].run_id, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn db_flag_and_store_none() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    let output = loom_in(dir.path())
        .args(["run", "--db", "elsewhere/runs.db", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(dir.path().join("elsewhere/runs.db").exists());
    assert!(!dir.path().join(".loom").exists());

    std::fs::write(dir.path().join("loom.toml"), "store = \"none\"\n").unwrap();
    let output = loom_in(dir.path())
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(!dir.path().join(".loom").exists(), "no store, no file");
}

#[test]
fn a_corrupt_or_newer_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    std::fs::write(dir.path().join("bad.db"), vec![7u8; 4096]).unwrap();
    let output = loom_in(dir.path())
        .args(["run", "--db", "bad.db", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.db is not usable"), "{stderr}");
    assert_eq!(
        std::fs::read(dir.path().join("bad.db")).unwrap(),
        vec![7u8; 4096],
        "nothing overwritten"
    );
}

#[test]
fn runs_list_show_and_events_read_the_database() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), SCRIPT).unwrap();
    let output = loom_in(dir.path())
        .args([
            "run",
            "--json",
            "--allow",
            "write_file",
            "--model",
            "scripted:s.json",
            "write the file",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let live: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let run_id = live[0]["runId"].as_str().unwrap().to_string();

    let list = loom_in(dir.path()).args(["runs", "list"]).output().unwrap();
    let table = String::from_utf8_lossy(&list.stdout);
    assert!(table.starts_with("RUN"), "{table}");
    assert!(
        table.contains(&run_id) && table.contains("DONE") && table.contains("write the file"),
        "{table}"
    );

    let json = loom_in(dir.path()).args(["runs", "list", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(runs[0]["runId"], run_id.as_str());

    let show = loom_in(dir.path()).args(["runs", "show", &run_id]).output().unwrap();
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("status    DONE"), "{text}");
    assert!(text.contains("tool      write_file: 1 calls, 100% ok"), "{text}");
    assert!(text.trim_end().ends_with("written"), "{text}");

    let events = loom_in(dir.path()).args(["runs", "events", &run_id]).output().unwrap();
    let stored: Vec<serde_json::Value> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stored, live, "the recorded events are the events the run streamed");
    let after = loom_in(dir.path())
        .args(["runs", "events", &run_id, "--after", "5"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&after.stdout).lines().count(), live.len() - 5);

    let unknown = loom_in(dir.path())
        .args(["runs", "show", "no-such-run"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no run with id 'no-such-run'"));
    let elsewhere = tempfile::tempdir().unwrap();
    let none = loom_in(elsewhere.path()).args(["runs", "list"]).output().unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no run database"));
}

#[tokio::test]
async fn run_with_a_session_continues_its_conversation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.json"),
        r#"[{"content":"Noted: the code word is heron."},{"content":"The code word is heron."}]"#,
    )
    .unwrap();
    let run = |prompt: &str| {
        let out = loom_in(dir.path())
            .args(["run", "--session", "talk", "--model", "scripted:s.json", prompt])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run("The code word is heron.").contains("Noted"));
    assert!(run("What is the code word?").contains("The code word is heron."));

    let store = SqliteStore::open(common::database_of(dir.path())).unwrap();
    let runs = store.session_runs("talk").await.unwrap();
    assert_eq!(runs.len(), 2);
    let second = store.load_run(&runs[1].run_id).await.unwrap();
    let texts: Vec<&str> = second.messages.iter().skip(1).map(|m| m.content()).collect();
    assert_eq!(
        texts,
        [
            "The code word is heron.",
            "Noted: the code word is heron.",
            "What is the code word?",
            "The code word is heron."
        ],
        "the second run carries the first one's conversation"
    );
}
