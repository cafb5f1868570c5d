//! Runs as OpenTelemetry traces (docs/telemetry.md), through the binary:
//! `loom run` with `[telemetry] otlp_endpoint` sends its spans to a real
//! OTLP/HTTP receiver (loom-testkit's, decoding the protobuf), and the
//! trace is read there: one tree in one trace, the GenAI attributes, the
//! usage the events told, a sub-agent beneath its `task` call, and no
//! message text in any span.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom_in};
use loom_testkit::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use serde_json::{json, Value};

fn config(dir: &std::path::Path, endpoint: &str) -> std::path::PathBuf {
    config_with(dir, endpoint, "service_name = \"loom-under-test\"\n")
}

/// A loom.toml whose `[telemetry]` names `endpoint`, with `settings` besides.
fn config_with(dir: &std::path::Path, endpoint: &str, settings: &str) -> std::path::PathBuf {
    let path = dir.join("telemetry.toml");
    std::fs::write(
        &path,
        format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n{settings}"),
    )
    .unwrap();
    path
}

/// `loom run --yes` of `prompt` on the scripted `model` with `config`.
fn run_with(dir: &std::path::Path, model: &str, config: &std::path::Path, prompt: &str) -> std::process::Output {
    loom_in(dir)
        .args(["run", "--yes", "--model", model, "--config"])
        .arg(config)
        .arg(prompt)
        .output()
        .unwrap()
}

/// A client's trace context, as an instrumented caller sends it.
const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const GIVEN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const GIVEN_PARENT: &str = "00f067aa0ba902b7";

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|span| span.name == name).collect()
}

#[test]
fn a_run_with_two_tool_calls_and_a_sub_agent_is_one_trace_in_the_genai_conventions() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = common::script_at(
        dir.path(),
        "script.json",
        &json!([
            {"tool_calls": [
                {"name": "list_dir", "arguments": {}},
                {"name": "read_file", "arguments": {"path": "missing.txt"}}
            ], "usage": {"input_tokens": 120, "output_tokens": 9, "cache_read_input_tokens": 100,
                         "cache_creation_input_tokens": 20}},
            {"tool_calls": [{"name": "task", "arguments": {
                "description": "look", "prompt": "List the workspace, privately.", "tools": ["list_dir"]}}],
             "usage": {"input_tokens": 150, "output_tokens": 12}},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}], "usage": {"input_tokens": 30, "output_tokens": 4}},
            {"content": "The child's own words.", "usage": {"input_tokens": 40, "output_tokens": 5}},
            {"content": "The parent's answer.", "usage": {"input_tokens": 170, "output_tokens": 6}}
        ]),
    );
    let config = config_with(
        dir.path(),
        &receiver.url(),
        "service_name = \"loom-under-test\"\n[tools]\ntask = true\n",
    );
    let out = loom_in(dir.path())
        .args(["run", "--json", "--yes", "--model", &model, "--config"])
        .arg(&config)
        .arg("a secret task description")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events = json_lines(&out.stdout);
    // The command waited for its spans before it ended.
    let spans = receiver.spans();
    assert!(!spans.is_empty(), "spans are sent before the command ends");

    let roots = named(&spans, "invoke_agent loom");
    assert_eq!(roots.len(), 2, "the run and its sub-agent: {spans:#?}");
    let root = roots.iter().find(|span| span.parent.is_none()).unwrap();
    let run_id = events[0]["runId"].as_str().unwrap();
    assert_eq!(root.attributes["gen_ai.agent.id"], run_id);
    assert_eq!(root.attributes["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(root.attributes["gen_ai.conversation.id"], events[0]["runId"]);
    assert_eq!(root.attributes["loom.run.status"], "DONE");
    assert_eq!(root.service.as_deref(), Some("loom-under-test"));
    assert!(spans.iter().all(|span| span.trace_id == root.trace_id), "one trace");

    // Each model call of the run (not the child's) beneath the run, with
    // the usage and finish reason its llm.finish told.
    let finishes: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "llm.finish" && e["runId"] == run_id)
        .collect();
    let mut chats: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.name.starts_with("chat ") && span.parent.as_deref() == Some(root.span_id.as_str()))
        .collect();
    chats.sort_by_key(|span| span.start_ns);
    assert_eq!(chats.len(), finishes.len(), "{spans:#?}");
    for (chat, finish) in chats.iter().zip(&finishes) {
        assert_eq!(chat.kind, 3, "a client span");
        assert_eq!(chat.attributes["gen_ai.operation.name"], "chat");
        assert_eq!(chat.attributes["gen_ai.provider.name"], "scripted");
        assert_eq!(
            chat.attributes["gen_ai.usage.input_tokens"],
            finish["usage"]["inputTokens"]
        );
        assert_eq!(
            chat.attributes["gen_ai.usage.output_tokens"],
            finish["usage"]["outputTokens"]
        );
        assert_eq!(
            chat.attributes["gen_ai.response.finish_reasons"],
            json!([finish["finishReason"]])
        );
    }
    // The prompt cache, where the provider counted it.
    assert_eq!(chats[0].attributes["gen_ai.usage.cache_read.input_tokens"], 100);
    assert_eq!(chats[0].attributes["gen_ai.usage.cache_creation.input_tokens"], 20);
    assert!(!chats[1].attributes.contains_key("gen_ai.usage.cache_read.input_tokens"));

    // The two calls and the task, beneath the run; the failed one says so.
    let tools: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.name.starts_with("execute_tool ") && span.parent.as_deref() == Some(root.span_id.as_str()))
        .collect();
    assert_eq!(tools.len(), 3, "{spans:#?}");
    let read = tools.iter().find(|span| span.name == "execute_tool read_file").unwrap();
    assert_eq!(read.status, 2, "a failed call is an error span");
    assert_eq!(read.attributes["error.type"], "error");
    assert_eq!(read.attributes["gen_ai.tool.type"], "function");
    let task = tools.iter().find(|span| span.name == "execute_tool task").unwrap();
    let child = roots.iter().find(|span| span.parent.is_some()).unwrap();
    assert_eq!(
        child.parent.as_deref(),
        Some(task.span_id.as_str()),
        "the sub-agent beneath its task call"
    );
    assert!(child.start_ns >= task.start_ns && child.end_ns <= task.end_ns);
    assert!(
        spans
            .iter()
            .any(|span| span.name == "execute_tool list_dir" && span.parent.as_deref() == Some(child.span_id.as_str())),
        "the child's own call beneath it"
    );

    // capture_content is off: no text of the conversation in any span.
    let everything = format!("{spans:?}");
    for text in ["secret task description", "privately", "own words", "parent's answer"] {
        assert!(!everything.contains(text), "{text} leaked into a span");
    }
}

/// A collector that never answers does not hold a run back: the run ends
/// as without telemetry, and the command's end waits for its spans at most
/// a few seconds. (How much it costs is measured in bench/README.md,
/// "Telemetry", not asserted here.)
#[test]
fn a_collector_that_never_answers_does_not_keep_a_run_from_ending() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    receiver.hang();
    let model = common::script_at(dir.path(), "script.json", &json!([{"content": "Done."}]));
    let config = config(dir.path(), &receiver.url());
    let out = run_with(dir.path(), &model, &config, "hello");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Done.");
}

/// A run killed with SIGKILL and resumed by another process continues its
/// trace: the spans both processes sent share the trace, and the model
/// calls the first one made hang beneath the run's span that the second
/// one sent when the run ended.
#[test]
fn a_run_resumed_after_sigkill_continues_its_trace() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = common::script_at(
        dir.path(),
        "script.json",
        &json!([
            {"tool_calls": [{"name": "list_dir", "arguments": {}}]},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}], "delay_ms": 3000},
            {"content": "Finished after the crash."}
        ]),
    );
    let config = config(dir.path(), &receiver.url());
    // The first process runs inside a traced job; the one that resumes
    // does not: the run's place in that trace is stored with the run.
    let mut first = loom_in(dir.path())
        .args(["run", "--json", "--yes", "--model", &model, "--config"])
        .arg(&config)
        .arg("survive a crash")
        .env("TRACEPARENT", GIVEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = first.stdout.take().unwrap();
    let mut run_id = String::new();
    for line in BufReader::new(stdout).lines() {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        run_id = event["runId"].as_str().unwrap().to_string();
        // The first step is done; the second model call (3 s) is next.
        if event["type"] == "tool.result" {
            break;
        }
    }
    // The first call's spans go out within a second of their end.
    let before = receiver.wait_for(2, std::time::Duration::from_secs(10));
    let _ = first.kill(); // SIGKILL
    let _ = first.wait();
    assert!(
        before.iter().any(|span| span.name.starts_with("chat ")),
        "the first process sent its first model call: {before:#?}"
    );

    let resumed = loom_in(dir.path())
        .args(["runs", "resume", &run_id, "--yes", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let spans = receiver.spans();
    let run = spans
        .iter()
        .find(|span| span.name == "invoke_agent loom")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(run.attributes["gen_ai.agent.id"], run_id.as_str());
    assert!(
        spans.iter().all(|span| span.trace_id == GIVEN_TRACE),
        "one trace, the one the first process was given: {spans:#?}"
    );
    assert_eq!(run.parent.as_deref(), Some(GIVEN_PARENT), "beneath the job's span");
    let first_chat = before.iter().find(|span| span.name.starts_with("chat ")).unwrap();
    assert_eq!(
        first_chat.parent.as_deref(),
        Some(run.span_id.as_str()),
        "beneath the run's span"
    );
    assert!(spans.len() > before.len(), "the resumed process sent its own");
    let mut ids: Vec<&str> = spans.iter().map(|span| span.span_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        spans.len(),
        "no span id sent twice by the two processes: {spans:#?}"
    );
}

/// A project's loom.toml that names a collector (a model may have written
/// it) sends nothing until a person trusts that file.
#[test]
fn a_projects_telemetry_settings_wait_for_trust() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = common::script_at(dir.path(), "script.json", &json!([{"content": "Done."}]));
    std::fs::write(
        dir.path().join("loom.toml"),
        format!("[telemetry]\notlp_endpoint = \"{}\"\n", receiver.url()),
    )
    .unwrap();
    let out = loom_in(dir.path())
        .args(["run", "--yes", "--model", &model, "hello"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("[telemetry]") && said.contains("loom trust"), "{said}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(receiver.spans().is_empty());
}

/// The spans received once the run `run_id`'s own span has arrived, and
/// that span.
fn spans_of_ended_run(receiver: &OtlpReceiver, run_id: &str) -> (Vec<ReceivedSpan>, ReceivedSpan) {
    let started = std::time::Instant::now();
    loop {
        let spans = receiver.spans();
        let run = spans
            .iter()
            .find(|span| span.name == "invoke_agent loom" && span.attributes["gen_ai.agent.id"] == run_id)
            .cloned();
        if let Some(run) = run {
            return (spans, run);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no span of {run_id}: {spans:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `POST /v1/runs` with `body` and these `traceparent` headers; the run's id.
async fn start_traced(gateway: &common::gateway::Gateway, headers: &[&str], body: Value) -> String {
    let mut request = common::gateway::http(common::gateway::ALICE).post(gateway.url("/v1/runs"));
    for header in headers {
        request = request.header("traceparent", *header);
    }
    let accepted: Value = request.json(&body).send().await.unwrap().json().await.unwrap();
    accepted["runId"].as_str().unwrap().to_string()
}

/// A client's W3C `traceparent` on `POST /v1/runs` (the header, or the
/// body's field) makes the run's span its child, is stored with the run,
/// and the gateway's log lines about the run carry the trace's ids; one
/// that is not valid is refused in the body and ignored in the header, and
/// so are two headers. With `capture_content`, spans carry the
/// conversation, redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_traceparent_is_the_parent_of_the_run_and_its_log_lines_lead_to_it() {
    use common::gateway::{config as gateway_config, http, Gateway, ALICE};

    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = loom_testkit::PromptModel::start(loom_testkit::PromptModelOptions::default());
    gateway_config(
        dir.path(),
        &model.url(),
        &format!(
            "[telemetry]\notlp_endpoint = \"{}\"\ncapture_content = true\n",
            receiver.url()
        ),
    );
    let gateway = Gateway::start(dir.path(), &[]);
    let ended = |run_id: String| tokio::task::block_in_place(|| spans_of_ended_run(&receiver, &run_id));

    // The standard header, as an instrumented HTTP client sends it.
    let prompt = json!({"prompt": "hello with token ghp_abcdefghijklmnopqrstuvwxyz0123456789"});
    let run_id = start_traced(&gateway, &[GIVEN], prompt).await;
    let (spans, run) = ended(run_id.clone());
    assert_eq!(run.trace_id, GIVEN_TRACE);
    assert_eq!(run.parent.as_deref(), Some(GIVEN_PARENT));
    let chat = spans.iter().find(|span| span.name.starts_with("chat ")).unwrap();
    assert_eq!(
        (chat.trace_id.as_str(), chat.parent.as_deref()),
        (GIVEN_TRACE, Some(run.span_id.as_str()))
    );

    // capture_content: the prompt and the answer are there, the secret is not.
    let input: Value = serde_json::from_str(run.attributes["gen_ai.input.messages"].as_str().unwrap()).unwrap();
    let prompt = input[0]["parts"][0]["content"].as_str().unwrap();
    assert!(
        prompt.starts_with("hello with token") && !prompt.contains("ghp_"),
        "{prompt}"
    );
    assert!(chat.attributes.contains_key("gen_ai.output.messages"), "{chat:#?}");

    // Stored with the run: its lifecycle.start tells it.
    let events = http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{run_id}/events")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let first: Value = events
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .unwrap();
    assert_eq!(first["type"], "lifecycle.start");
    assert_eq!(first["traceParent"], GIVEN);

    // The gateway's log lines about the run lead to its trace and span.
    let log = gateway.log_text();
    let line = log
        .lines()
        .find(|line| line.contains(&run_id) && line.contains("run started"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(&format!("trace_id={GIVEN_TRACE}")), "{line}");
    assert!(line.contains(&format!("span_id={}", run.span_id)), "{line}");

    // The body's field, which wins over the header.
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let run_id = start_traced(
        &gateway,
        &[GIVEN],
        json!({"prompt": "hello again", "traceparent": other}),
    )
    .await;
    let (_, run) = ended(run_id);
    assert_eq!(run.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(run.parent.as_deref(), Some("b7ad6b7169203331"));

    // The run a fork starts, with the header.
    let looked = start_traced(&gateway, &[], json!({"prompt": "look around steps=1"})).await;
    ended(looked.clone());
    let forked: Value = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{looked}/fork")))
        .header("traceparent", other)
        .json(&json!({"step": 1, "prompt": "go on from there"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fork_run = forked["started"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{forked}"));
    let (_, run) = ended(fork_run.to_string());
    assert_eq!(run.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(run.parent.as_deref(), Some("b7ad6b7169203331"));

    // Two headers: which one the client meant cannot be known; ignored.
    let run_id = start_traced(&gateway, &[GIVEN, other], json!({"prompt": "hello twice"})).await;
    assert_eq!(ended(run_id).1.parent, None, "its own trace");

    // Not a traceparent: refused in the body, ignored in the header.
    let refused = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "hello", "traceparent": "00-zz-01"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let zeros = "00-00000000000000000000000000000000-b7ad6b7169203331-01";
    let run_id = start_traced(&gateway, &[zeros], json!({"prompt": "hello once more"})).await;
    let (_, run) = ended(run_id);
    assert_eq!(run.parent, None, "its own trace");
    assert_ne!(run.trace_id, "00000000000000000000000000000000");
}

/// A protocol this build cannot send over is said, and the run goes on
/// without traces. (OTLP/gRPC itself: loom-telemetry's `export_grpc` test,
/// with the `grpc` feature.)
#[test]
fn a_protocol_this_build_cannot_send_over_is_said_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = common::script_at(dir.path(), "script.json", &json!([{"content": "Done."}]));
    let mut cases = vec![("http/json", "http/json")];
    if !cfg!(feature = "grpc") {
        cases.push(("grpc", "built without gRPC"));
    }
    for (protocol, said) in cases {
        let config = config_with(dir.path(), &receiver.url(), &format!("protocol = \"{protocol}\"\n"));
        let out = run_with(dir.path(), &model, &config, "hello");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            stderr.contains("no traces are sent") && stderr.contains(said),
            "{stderr}"
        );
    }
    assert!(receiver.spans().is_empty());
}

/// `capture_content = true`: the prompt, the answers, a call's arguments
/// and its result are in the spans, and every secret in them is redacted —
/// an assignment on a line of a file's content among the arguments too.
#[test]
fn captured_contents_are_redacted_arguments_included() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start();
    let model = common::script_at(
        dir.path(),
        "script.json",
        &json!([
            {"tool_calls": [{"name": "write_file", "arguments": {
                "path": ".env", "content": "APP=demo\nDB_PASSWORD=hunter2-correct-horse\n"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": ".env"}}]},
            {"content": "Written; the key is sk-proj-abcdefghijklmnopqrstuvwxyz0123."}
        ]),
    );
    let config = config_with(dir.path(), &receiver.url(), "capture_content = true\n");
    let prompt = "write the env file; my token is ghp_abcdefghijklmnopqrstuvwxyz0123456789";
    let out = run_with(dir.path(), &model, &config, prompt);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spans = receiver.spans();
    let everything = format!("{spans:?}");
    for secret in ["hunter2", "ghp_", "sk-proj"] {
        assert!(!everything.contains(secret), "{secret} reached a span: {everything}");
    }
    let write = named(&spans, "execute_tool write_file")[0];
    let arguments: Value =
        serde_json::from_str(write.attributes["gen_ai.tool.call.arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments["path"], ".env");
    assert!(
        arguments["content"].as_str().unwrap().contains("APP=demo"),
        "{arguments}"
    );
    let read = named(&spans, "execute_tool read_file")[0];
    assert!(read.attributes["gen_ai.tool.call.result"]
        .as_str()
        .unwrap()
        .contains("APP=demo"));
    let run = named(&spans, "invoke_agent loom")[0];
    assert!(run.attributes["gen_ai.input.messages"]
        .as_str()
        .unwrap()
        .contains("write the env file"));
    assert!(run.attributes["gen_ai.output.messages"]
        .as_str()
        .unwrap()
        .contains("Written; the key is"));
}
