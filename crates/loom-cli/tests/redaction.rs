//! Secrets in tool output never reach the model or the events: the whole
//! redaction corpus (`loom_testkit::redaction`), plus a value of this
//! process's environment whose name looks secret, read by `read_file` in a
//! real run — checked in the `tool.result` event and in the request body
//! the fake server received. Look-alikes reach both untouched.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in, succeeded};

use loom_testkit::redaction::CORPUS;
use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

const VAULT: &str = "vault-7x9k2m4p8q-s3cr3t";

#[test]
fn the_corpus_reaches_neither_the_events_nor_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let mut text: Vec<&str> = CORPUS.iter().map(|case| case.text).collect();
    let vault_line = format!("vault in use: {VAULT}");
    text.push(&vault_line);
    std::fs::write(dir.path().join("leaks.txt"), text.join("\n\n")).unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[("c1", "read_file", r#"{"path": "leaks.txt"}"#)])),
        Reply::Sse(openai_text("read", 4)),
    ]);
    let output = succeeded(
        loom_in(dir.path())
            .env("LOOM_TEST_VAULT_TOKEN", VAULT)
            .args(["run", "--json", "--model", "openai:m", "--base-url"])
            .arg(server.url())
            .arg("read leaks.txt"),
    );
    let events = json_lines(&output.stdout);
    let result = events.iter().find(|e| e["type"] == "tool.result").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    let sent = server.requests()[1].body["messages"][3]["content"]
        .as_str()
        .unwrap()
        .to_string();
    for (place, seen) in [("event", &result), ("request", &sent)] {
        let mut failures = Vec::new();
        for case in CORPUS {
            let ok = match case.secret {
                Some(secret) => !seen.contains(secret) && seen.contains(case.kept),
                // read_file numbers lines: each line must be there whole.
                None => case.text.lines().all(|line| seen.contains(line)),
            };
            if !ok {
                failures.push(case.name);
            }
        }
        assert!(failures.is_empty(), "{place}: {failures:?}\n{seen}");
        assert!(!seen.contains(VAULT), "{place}: the environment's secret leaked");
        assert!(seen.contains("vault in use: [REDACTED]"), "{place}");
    }
    // Nothing of the file leaks through any other event either.
    let all = String::from_utf8_lossy(&output.stdout);
    for case in CORPUS {
        if let Some(secret) = case.secret {
            assert!(!all.contains(secret), "{} in the events", case.name);
        }
    }
}
