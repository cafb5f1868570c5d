//! Context in `loom run`: project instructions reach the model, loom.toml's
//! compression and retrieval keys work, and `--verbose` prints the summary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::loom_in;

use loom_testkit::{openai_text, FakeServer, Reply};
use serde_json::Value;

#[test]
fn project_and_user_instructions_reach_the_model() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("AGENTS.md"),
        "Run `make check` before you say you are done.",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("xdg/loom")).unwrap();
    std::fs::write(dir.path().join("xdg/loom/LOOM.md"), "Answer in British English.").unwrap();
    let server = FakeServer::start(vec![Reply::Sse(openai_text("Noted.", 3))]);
    let output = loom_in(dir.path())
        .args(["run", "--model", "openai:m", "--base-url"])
        .arg(server.url())
        .arg("hello")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let system = server.requests()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("Run `make check` before you say you are done."),
        "{system}"
    );
    assert!(system.contains("Answer in British English."), "{system}");
}

#[test]
fn compression_and_retrieval_from_loom_toml_and_the_verbose_summary() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(
        root.join("docs/release.md"),
        "# Releasing\n\nTag the commit, then push the tag to trigger the release build.",
    )
    .unwrap();
    std::fs::write(root.join("notes.txt"), "release checklist line\n".repeat(40)).unwrap();
    let read = r#"{"tool_calls":[{"name":"read_file","arguments":{"path":"notes.txt"}}]}"#;
    std::fs::write(
        root.join("script.json"),
        format!("[{read},{read},{read},{read},{read},{{\"content\":\"Tag the commit and push the tag.\"}}]"),
    )
    .unwrap();
    let summary = r###"{"content":"## 1. Background context\n- reading notes.txt about releases\n## 5. Execution results\n- notes read"}"###;
    std::fs::write(
        root.join("summaries.json"),
        format!("[{summary},{summary},{summary},{summary},{summary}]"),
    )
    .unwrap();
    // The window is sized for the file tools' definitions; the shell's
    // would take room the summary is measured against, so it is left out.
    std::fs::write(
        root.join("loom.toml"),
        "model = \"scripted:script.json\"\ncontext_window = 2400\nkeep_recent_messages = 3\ncompression_model = \"scripted:summaries.json\"\n\n[feedback]\nduplicate_threshold = 6\n\n[retrieval]\ndir = \"docs\"\nlimit = 2\n\n[tools.bash]\nenabled = false\n",
    )
    .unwrap();

    let output = loom_in(root)
        .args(["run", "--json", "how do I release?"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(types.contains(&"retrieval.start"));
    let retrieved = events.iter().find(|e| e["type"] == "retrieval.complete").unwrap();
    assert_eq!(retrieved["sources"][0], "release.md#1");
    let compressed: Vec<&Value> = events.iter().filter(|e| e["type"] == "compression.applied").collect();
    assert!(!compressed.is_empty(), "a 2400-token window forces compression");
    // The first compression is the model's summary; in a window this small a
    // later one may also have to drop old tool outputs (the fallback).
    assert_eq!(compressed[0]["method"], "summary");
    assert!(compressed[0]["tokensAfter"].as_u64() < compressed[0]["tokensBefore"].as_u64());
    let end = events.last().unwrap();
    assert_eq!(end["status"], "DONE");
    assert!(end["metrics"]["compressions"].as_u64().unwrap() >= 1);
    assert_eq!(end["metrics"]["tools"]["read_file"]["calls"], 5);

    let verbose = loom_in(root)
        .args(["run", "--verbose", "how do I release?"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&verbose.stderr);
    assert!(stderr.contains("loom: history compressed (summary)"), "{stderr}");
    assert!(stderr.contains("── run "), "{stderr}");
    assert!(stderr.contains("tool read_file: 5 calls, 100% ok"), "{stderr}");
    assert!(stderr.contains("compressions "), "{stderr}");
    // The fourth read of the same file with the same result is warned of.
    assert!(stderr.contains("guidance (repetition_warning)"), "{stderr}");
    assert!(stderr.contains("retrieved "), "{stderr}");
}

#[test]
fn a_missing_retrieval_folder_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"content":"x"}]"#).unwrap();
    std::fs::write(
        dir.path().join("loom.toml"),
        "model = \"scripted:s.json\"\n[retrieval]\ndir = \"nope\"\n",
    )
    .unwrap();
    let output = loom_in(dir.path()).args(["run", "x"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("[retrieval] retrieval failed: cannot open"));
}
