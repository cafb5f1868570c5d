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

/// An AWS secret access key with nothing secret-looking around it.
const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

#[test]
fn a_bare_aws_secret_key_in_json_reaches_neither_the_model_nor_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let sha = "3f786850e387550fdab836ed7e6dc881de23001b";
    std::fs::write(
        dir.path().join("creds.json"),
        format!("{{\"value\": \"{AWS_SECRET}\", \"commit\": \"{sha}\"}}\n"),
    )
    .unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[("c1", "read_file", r#"{"path": "creds.json"}"#)])),
        Reply::Sse(openai_text("read", 4)),
    ]);
    let output = succeeded(
        loom_in(dir.path())
            .args(["run", "--json", "--model", "openai:m", "--base-url"])
            .arg(server.url())
            .arg("read creds.json"),
    );
    let sent = server.requests()[1].body.to_string();
    assert!(!sent.contains(AWS_SECRET), "the model got it: {sent}");
    assert!(sent.contains("[REDACTED]"), "{sent}");
    // The git SHA beside it is not a secret.
    assert!(sent.contains(sha), "{sent}");
    let events = String::from_utf8_lossy(&output.stdout);
    assert!(!events.contains(AWS_SECRET), "the events have it: {events}");
    // Nor is it anywhere in what loom keeps (its database and logs).
    let mut kept = 0;
    let state = common::database_of(dir.path()).parent().unwrap().to_path_buf();
    for entry in walk(&state) {
        let bytes = std::fs::read(&entry).unwrap();
        kept += 1;
        assert!(
            !bytes.windows(AWS_SECRET.len()).any(|w| w == AWS_SECRET.as_bytes()),
            "{} holds it",
            entry.display()
        );
    }
    assert!(kept > 0, "nothing stored in {}", state.display());
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Values Loom was given to pass on, each of a shape no pattern knows (no
/// digits, no prefix, no secret-looking name): redacted by value.
const GIVEN: [(&str, &str); 4] = [
    ("[tools.bash] env", "wJalrXUtnFEMIKbPxRfiCYEXAMPLEKEYabcdefgh"),
    ("[mcp.servers] env", "mcpServerSecretValue4242abcd"),
    ("[provider] headers", "teamheadervaluequiteplainindeed"),
    ("[[server.tokens]] token", "gatewaytokenplainlettersonlyabc"),
];

#[test]
fn every_value_loom_was_given_as_a_secret_is_redacted_by_value() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let bare: Vec<String> = GIVEN
        .iter()
        .map(|(_, value)| format!("\"bare\": \"{value}\""))
        .collect();
    std::fs::write(ws.join("found.json"), bare.join("\n")).unwrap();
    let config = dir.path().join("operator.toml");
    std::fs::write(
        &config,
        format!(
            "[tools.bash]\nenv = {{ KEY = \"{}\", MODE = \"productionreadymode\" }}\n[mcp.servers.off]\ncommand = \"true\"\nenabled = false\nenv = {{ X = \"{}\" }}\n\
             [provider.headers]\nX-Team = \"{}\"\n[[server.tokens]]\nname = \"op\"\ntoken = \"{}\"\n",
            GIVEN[0].1, GIVEN[1].1, GIVEN[2].1, GIVEN[3].1
        ),
    )
    .unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "read_file", r#"{"path": "found.json"}"#),
            ("c2", "bash", r#"{"command": "echo $KEY; echo mode=$MODE"}"#),
        ])),
        Reply::Sse(openai_text("read", 4)),
    ]);
    let output = succeeded(
        loom_in(&ws)
            .args(["run", "--json", "--yes", "--model", "openai:m", "--config"])
            .arg(&config)
            .arg("--base-url")
            .arg(server.url())
            .arg("read found.json"),
    );
    let events = String::from_utf8_lossy(&output.stdout);
    let sent = server.requests()[1].body.to_string();
    assert!(events.contains("[REDACTED]"), "{events}");
    // A setting is no secret: an environment's plain value stays.
    assert!(events.contains("mode=productionreadymode"), "{events}");
    let state = common::database_of(&ws).parent().unwrap().to_path_buf();
    let stored: Vec<Vec<u8>> = walk(&state).iter().map(|file| std::fs::read(file).unwrap()).collect();
    assert!(!stored.is_empty(), "nothing stored in {}", state.display());
    for (from, value) in GIVEN {
        assert!(!events.contains(value), "{from}: the events have it: {events}");
        assert!(!sent.contains(value), "{from}: the model got it: {sent}");
        for bytes in &stored {
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "{from}: stored"
            );
        }
    }
}
