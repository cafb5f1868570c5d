//! Answers that are not answers, from both providers, as a real server
//! sends them: an empty answer is retried once and then an error (right
//! after changes that succeeded it is the end of the run), an answer
//! cut off by the output limit is continued, a filtered one is an error.
//! And tool-call ids a provider got wrong are made unique before anything
//! pairs results with calls.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in, message_texts, of_type, reminders};

use loom_testkit::{
    anthropic_text, anthropic_text_ending, openai_no_choices, openai_sse, openai_text, openai_text_ending, FakeServer,
    Reply,
};
use serde_json::{json, Value};

struct Ran {
    code: Option<i32>,
    events: Vec<Value>,
    stderr: String,
    requests: Vec<loom_testkit::Request>,
    dir: tempfile::TempDir,
}

fn run(provider: &str, replies: Vec<Reply>, config: &str) -> Ran {
    run_asking(provider, replies, config, "answer me")
}

/// `loom run --json` asked `prompt` in a workspace holding `a.txt`, with
/// `config` as its loom.toml, against a fake server giving `replies`.
fn run_asking(provider: &str, replies: Vec<Reply>, config: &str, prompt: &str) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(dir.path().join("loom.toml"), config).unwrap();
    let server = FakeServer::start(replies);
    let output = loom_in(dir.path())
        .env("ANTHROPIC_API_KEY", "test-key")
        .args(["run", "--json", "--model", &format!("{provider}:test"), "--base-url"])
        .arg(server.url())
        .arg(prompt)
        .output()
        .unwrap();
    Ran {
        code: output.status.code(),
        events: json_lines(&output.stdout),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        requests: server.requests(),
        dir,
    }
}

fn stored_messages(ran: &Ran) -> Vec<Value> {
    let run_id = ran.events[0]["runId"].as_str().unwrap();
    let out = loom_in(ran.dir.path())
        .args(["runs", "show", run_id, "--json"])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["messages"].as_array().unwrap().clone()
}

#[test]
fn an_empty_answer_is_asked_again_once_then_is_an_error() {
    for (provider, empty) in [
        ("openai", openai_no_choices()),
        ("openai", openai_text("", 4)),
        ("anthropic", anthropic_text_ending("", "end_turn")),
    ] {
        let ran = run(provider, vec![Reply::Sse(empty.clone()), Reply::Sse(empty)], "");
        assert_eq!(ran.code, Some(1), "{provider}: {}", ran.stderr);
        assert_eq!(ran.requests.len(), 2, "{provider}: one retry");
        assert_eq!(reminders(&ran.requests[0].body), 0);
        assert_eq!(
            reminders(&ran.requests[1].body),
            1,
            "{provider}: the retry carries a nudge"
        );
        assert!(ran.requests[1].body.to_string().contains("Your last reply was empty"));
        let error = of_type(&ran.events, "error").pop().unwrap();
        assert_eq!(error["code"], "EMPTY_ANSWER", "{provider}");
        assert_eq!(ran.events.last().unwrap()["status"], "ERROR");
        assert_eq!(of_type(&ran.events, "warning")[0]["code"], "EMPTY_ANSWER");

        // A nudged model that answers ends the run well.
        let answer = if provider == "openai" {
            openai_text("Here it is.", 4)
        } else {
            anthropic_text("Here it is.")
        };
        let empty = if provider == "openai" {
            openai_no_choices()
        } else {
            anthropic_text_ending("", "end_turn")
        };
        let ran = run(provider, vec![Reply::Sse(empty), Reply::Sse(answer)], "");
        assert_eq!(ran.code, Some(0), "{provider}: {}", ran.stderr);
        assert_eq!(ran.events.last().unwrap()["content"], "Here it is.");
        // The empty answer left nothing in the history.
        let roles: Vec<String> = stored_messages(&ran)
            .iter()
            .map(|m| m["role"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant"], "{provider}");
    }
}

#[test]
fn an_empty_answer_right_after_changes_that_succeeded_ends_the_run_as_done() {
    let write = ("call_1", "write_file", r#"{"path": "out.txt", "content": "beta\n"}"#);
    let failed_edit = (
        "call_1",
        "edit_file",
        r#"{"path": "a.txt", "old_string": "gamma", "new_string": "delta"}"#,
    );
    for (call, done) in [(write, true), (failed_edit, false)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
        let server = FakeServer::start(vec![
            Reply::Sse(loom_testkit::openai_tool_calls(&[call])),
            Reply::Sse(openai_text("", 4)),
            Reply::Sse(openai_text("", 4)),
        ]);
        let output = loom_in(dir.path())
            .args(["run", "--json", "--allow", "write_file", "--allow", "edit_file"])
            .args(["--model", "openai:test", "--base-url"])
            .arg(server.url())
            .arg("change the files")
            .output()
            .unwrap();
        let events = json_lines(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let warning = of_type(&events, "warning").pop().unwrap();
        assert_eq!(warning["code"], "EMPTY_ANSWER", "{stderr}");
        let requests = server.requests();
        if done {
            // The write succeeded: the empty answer is the end, not asked again.
            assert_eq!(output.status.code(), Some(0), "{stderr}");
            assert_eq!(requests.len(), 2);
            let end = events.last().unwrap();
            assert_eq!((&end["status"], &end["content"]), (&json!("DONE"), &json!("")));
            assert!(warning["message"].as_str().unwrap().contains("taken as the end"));
            assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap(), "beta\n");
        } else {
            // A failed change is no end: the model is asked again, once.
            assert_eq!(output.status.code(), Some(1), "{stderr}");
            assert_eq!(requests.len(), 3);
            assert!(requests[2].body.to_string().contains("Your last reply was empty"));
            assert_eq!(events.last().unwrap()["status"], "ERROR");
        }
    }
}

#[test]
fn an_answer_cut_off_by_the_output_limit_is_continued() {
    for provider in ["openai", "anthropic"] {
        let piece = |text: &str, end: bool| match (provider, end) {
            ("openai", false) => openai_text_ending(text, 4, "length"),
            ("openai", true) => openai_text(text, 4),
            (_, false) => anthropic_text_ending(text, "max_tokens"),
            (_, true) => anthropic_text(text),
        };
        let ran = run(
            provider,
            vec![
                Reply::Sse(piece("The answer is forty", false)),
                Reply::Sse(piece("-two, as", false)),
                Reply::Sse(piece(" computed.", true)),
            ],
            "",
        );
        assert_eq!(ran.code, Some(0), "{provider}: {}", ran.stderr);
        let whole = "The answer is forty-two, as computed.";
        assert_eq!(ran.events.last().unwrap()["content"], whole, "{provider}");
        let warnings = of_type(&ran.events, "warning");
        assert_eq!(warnings.len(), 2, "{provider}: {warnings:?}");
        assert!(warnings.iter().all(|w| w["code"] == "OUTPUT_LIMIT"));
        // Each continuation sees what was written so far and is asked to go on.
        let texts = message_texts(&ran.requests[2].body);
        let all = texts.join("\n");
        assert!(
            all.contains("The answer is forty") && all.contains("-two, as"),
            "{provider}: {texts:?}"
        );
        assert!(texts.last().unwrap().contains("cut off"), "{provider}: {texts:?}");
        assert_eq!(reminders(&ran.requests[2].body), 1);
        // The history keeps one answer, whole.
        let stored = stored_messages(&ran);
        assert_eq!(stored.len(), 3, "{provider}: {stored:?}");
        assert_eq!(stored[2]["content"], whole);
    }

    // The number of continuations is configurable; past it, the cut answer
    // stands, with a warning that it may be incomplete.
    let ran = run(
        "openai",
        vec![
            Reply::Sse(openai_text_ending("Part one", 4, "length")),
            Reply::Sse(openai_text_ending(", part two", 4, "length")),
        ],
        "max_continuations = 1\n",
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.requests.len(), 2);
    assert_eq!(ran.events.last().unwrap()["content"], "Part one, part two");
    let last = of_type(&ran.events, "warning").pop().unwrap();
    assert!(
        last["message"].as_str().unwrap().contains("may be incomplete"),
        "{last}"
    );
}

#[test]
fn a_filtered_answer_is_an_error() {
    for (provider, filtered) in [
        ("openai", openai_text_ending("I can", 4, "content_filter")),
        ("anthropic", anthropic_text_ending("I can", "refusal")),
    ] {
        let ran = run(provider, vec![Reply::Sse(filtered)], "");
        assert_eq!(ran.code, Some(1), "{provider}: {}", ran.stderr);
        let error = of_type(&ran.events, "error").pop().unwrap();
        assert_eq!(error["code"], "CONTENT_FILTERED", "{provider}");
        assert_eq!(ran.events.last().unwrap()["status"], "ERROR");
        assert_eq!(ran.requests.len(), 1, "not retried");
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// A stream calling `read_file` once per path, with the given ids (`None`:
/// no id field at all).
fn calls_with_ids(calls: &[(Option<&str>, &str)]) -> Vec<u8> {
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": null}), None)];
    for (index, (id, path)) in calls.iter().enumerate() {
        let mut call = json!({"index": index, "type": "function",
            "function": {"name": "read_file", "arguments": format!(r#"{{"path": "{path}"}}"#)}});
        if let Some(id) = id {
            call["id"] = json!(id);
        }
        chunks.push(chunk(json!({"tool_calls": [call]}), None));
    }
    chunks.push(chunk(json!({}), Some("tool_calls")));
    openai_sse(&chunks)
}

#[test]
fn tool_call_ids_from_the_provider_are_made_unique() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    let server = FakeServer::start(vec![
        // Two calls with one id.
        Reply::Sse(calls_with_ids(&[(Some("same"), "a.txt"), (Some("same"), "b.txt")])),
        // A missing id, an empty one, and an id used in the turn before.
        Reply::Sse(calls_with_ids(&[
            (None, "a.txt"),
            (Some(""), "c.txt"),
            (Some("same"), "a.txt"),
        ])),
        Reply::Sse(openai_text("done", 4)),
    ]);
    let output = loom_in(dir.path())
        .args(["run", "--model", "openai:m", "--base-url"])
        .arg(server.url())
        .arg("read them")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // What the person sees pairs each call's arguments with its own result.
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("read_file(")).collect();
    assert_eq!(lines.len(), 5, "{stderr}");
    // Parallel calls finish in any order; each line must pair a call's
    // arguments with that call's own result.
    for line in &lines {
        if line.contains("read_file(path=a.txt)") {
            assert!(line.contains("✓"), "{line}");
        } else {
            let path = if line.contains("path=b.txt") { "b.txt" } else { "c.txt" };
            assert!(
                line.contains("✗") && line.contains(&format!("cannot read '{path}'")),
                "{line}"
            );
        }
    }
    assert_eq!(lines.iter().filter(|l| l.contains("path=a.txt")).count(), 3);

    // What the provider gets back: unique ids, each result after its call.
    let requests = server.requests();
    let last = &requests[2].body["messages"];
    let mut seen = std::collections::HashSet::new();
    for turn in [2, 5] {
        let calls = last[turn]["tool_calls"].as_array().unwrap();
        for (index, call) in calls.iter().enumerate() {
            let id = call["id"].as_str().unwrap();
            assert!(!id.is_empty() && seen.insert(id.to_string()), "id {id} reused");
            // An id Loom gives is nine letters and digits, as Mistral's chat
            // templates demand; the provider's own first id is kept.
            if id != "same" {
                assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
            }
            let result = &last[turn + 1 + index];
            assert_eq!(result["role"], "tool");
            assert_eq!(result["tool_call_id"], id);
            let path = serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap()["path"]
                .as_str()
                .unwrap()
                .to_string();
            let content = result["content"].as_str().unwrap();
            if path == "a.txt" {
                assert!(content.contains("alpha"), "{content}");
            } else {
                assert!(content.contains(&path), "{path}: {content}");
            }
        }
    }
    assert_eq!(seen.len(), 5);
    assert!(seen.contains("same"), "a good id is kept");
}

/// `loom run` in a workspace holding `a.txt`, asked about it.
fn ask_about_a_file(provider: &str, replies: Vec<Reply>) -> Ran {
    run_asking(provider, replies, "", "Which word does a.txt hold?")
}

#[test]
fn an_answer_that_never_looked_at_the_named_file_is_sent_back_with_a_tool_call_required() {
    let read = ("call_1", "read_file", r#"{"path": "a.txt"}"#);
    for (provider, made_up, reading, answer, required) in [
        (
            "openai",
            openai_text("beta", 4),
            loom_testkit::openai_tool_calls(&[read]),
            openai_text("alpha", 4),
            json!("required"),
        ),
        (
            "anthropic",
            anthropic_text("beta"),
            loom_testkit::anthropic_tool_use("", &[read]),
            anthropic_text("alpha"),
            json!({"type": "any"}),
        ),
    ] {
        let ran = ask_about_a_file(
            provider,
            vec![Reply::Sse(made_up), Reply::Sse(reading), Reply::Sse(answer)],
        );
        assert_eq!(ran.code, Some(0), "{provider}: {}", ran.stderr);
        assert_eq!(ran.requests.len(), 3, "{provider}");
        let end = of_type(&ran.events, "lifecycle.end").pop().unwrap();
        assert_eq!(end["content"], "alpha", "{provider}");
        let warning = of_type(&ran.events, "warning").pop().unwrap();
        assert_eq!(warning["code"], "UNTOUCHED_FILES", "{provider}");
        // Only the retry is held to a call, and it says which file.
        assert!(ran.requests[0].body.get("tool_choice").is_none(), "{provider}");
        assert_eq!(ran.requests[1].body["tool_choice"], required, "{provider}");
        assert!(ran.requests[1].body.to_string().contains("`a.txt`"), "{provider}");
        assert!(ran.requests[2].body.get("tool_choice").is_none(), "{provider}");
        // The made-up answer is not stored.
        let stored = stored_messages(&ran);
        assert!(!stored.iter().any(|m| m["content"] == "beta"), "{provider}: {stored:?}");
    }
}

#[test]
fn a_server_that_refuses_tool_choice_is_asked_again_without_it() {
    let refused = Reply::status(
        400,
        json!({"error": {"message": "tool_choice 'required' is not supported", "type": "invalid_request_error"}}),
    );
    let ran = ask_about_a_file(
        "openai",
        vec![
            Reply::Sse(openai_text("beta", 4)),
            refused,
            Reply::Sse(openai_text("alpha", 4)),
        ],
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.requests.len(), 3);
    assert_eq!(ran.requests[1].body["tool_choice"], "required");
    assert!(ran.requests[2].body.get("tool_choice").is_none());
    assert!(
        ran.requests[2].body.to_string().contains("`a.txt`"),
        "the guidance still goes"
    );
    let end = of_type(&ran.events, "lifecycle.end").pop().unwrap();
    assert_eq!(end["content"], "alpha");
    let told = of_type(&ran.events, "error").pop().unwrap();
    assert_eq!(told["code"], "LLM_BAD_REQUEST");
    assert_eq!(told["recoverable"], true);

    // A request refused for another reason is refused again: the run ends.
    let other = || Reply::status(400, json!({"error": {"message": "messages are malformed"}}));
    let ran = ask_about_a_file("openai", vec![Reply::Sse(openai_text("beta", 4)), other(), other()]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(ran.requests.len(), 3);
    let end = of_type(&ran.events, "lifecycle.end").pop().unwrap();
    assert_eq!(end["status"], "ERROR");
}
