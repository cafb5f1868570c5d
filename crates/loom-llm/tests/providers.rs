//! The OpenAI-compatible and Anthropic providers against a fake server on
//! 127.0.0.1 that speaks their exact wire formats: recorded streams replayed
//! byte for byte, request bodies checked, and every failure a real service
//! produces — rate limits, server errors, resets, cut streams, bad tool JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use loom_core::{
    validate_history, Agent, EventKind, FinishReason, Llm, LlmChunk, LlmError, LlmRequest, Message, Pricing, RunStatus,
    StopReason, Tool, ToolContext, ToolError, ToolOutput, ToolSpec,
};
use loom_llm::{
    AnthropicConfig, AnthropicModel, HttpSettings, OpenAiConfig, OpenAiModel, Recorder, RetryPolicy, ScriptedModel,
};
use loom_testkit::{anthropic_text, anthropic_tool_use, fixture, openai_text, openai_tool_calls, FakeServer, Reply};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

fn fast_retries() -> HttpSettings {
    HttpSettings {
        retry: RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(5),
        },
        ..HttpSettings::default()
    }
}

fn openai(server: &FakeServer) -> OpenAiModel {
    let mut config = OpenAiConfig::new("gpt-4o-mini");
    config.base_url = format!("{}/v1", server.url());
    config.api_key = Some("sk-test".into());
    config.http = fast_retries();
    OpenAiModel::new(config).unwrap()
}

fn anthropic(server: &FakeServer) -> AnthropicModel {
    let mut config = AnthropicConfig::new("claude-sonnet-4-20250514");
    config.base_url = server.url();
    config.api_key = Some("ant-test".into());
    config.http = fast_retries();
    AnthropicModel::new(config).unwrap()
}

async fn chunks(model: &dyn Llm) -> Result<Vec<LlmChunk>, LlmError> {
    let messages = [Message::system("s"), Message::user("q")];
    let mut stream = model.stream(LlmRequest::new(&messages, &[])).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.push(chunk?);
    }
    Ok(out)
}

fn text_of(chunks: &[LlmChunk]) -> String {
    chunks
        .iter()
        .filter_map(|c| match c {
            LlmChunk::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// Tool calls assembled the way the engine does: by index.
fn calls_of(chunks: &[LlmChunk]) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for chunk in chunks {
        if let LlmChunk::ToolCallDelta {
            index,
            id,
            name,
            arguments,
        } = chunk
        {
            if calls.len() <= *index {
                calls.resize(index + 1, Default::default());
            }
            if let Some(id) = id {
                calls[*index].0 = id.clone();
            }
            if let Some(name) = name {
                calls[*index].1.push_str(name);
            }
            calls[*index].2.push_str(arguments);
        }
    }
    calls
}

fn finish_of(chunks: &[LlmChunk]) -> Option<FinishReason> {
    chunks.iter().rev().find_map(|c| match c {
        LlmChunk::Finish(reason) => Some(reason.clone()),
        _ => None,
    })
}

// ---- recorded streams, byte for byte ----

/// The model plain_text.sse was answered by.
const PLAIN_MODEL: &str = "gpt-4o-2024-08-06";

#[tokio::test]
async fn openai_recorded_streams_parse() {
    let server = FakeServer::start(
        [
            "plain_text.sse",
            "two_parallel_tool_calls.sse",
            "max_tokens_reached.sse",
            "three_choices.sse",
            "refusal.sse",
            "one_tool_call.sse",
        ]
        .iter()
        .map(|name| Reply::Sse(fixture(&format!("openai-chat-stream/{name}"))))
        .collect(),
    );
    let model = openai(&server);

    let plain = chunks(&model).await.unwrap();
    assert!(text_of(&plain).len() > 20, "{}", text_of(&plain));
    assert_eq!(finish_of(&plain), Some(FinishReason::Stop));
    assert!(plain
        .iter()
        .any(|c| matches!(c, LlmChunk::Usage(u) if u.input_tokens == 14 && u.output_tokens == 30)));
    // The answering model, told once though every chunk repeats it.
    let told: Vec<&LlmChunk> = plain.iter().filter(|c| matches!(c, LlmChunk::Model(_))).collect();
    assert_eq!(told, [&LlmChunk::Model(PLAIN_MODEL.into())]);

    let parallel = chunks(&model).await.unwrap();
    let calls = calls_of(&parallel);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].1, "GetWeatherArgs");
    for (id, name, arguments) in &calls {
        assert!(id.starts_with("call_"));
        assert!(!name.is_empty());
        let args: Value = serde_json::from_str(arguments).unwrap();
        assert!(args.is_object(), "{args}");
    }
    assert_ne!(calls[0].2, calls[1].2);
    assert_eq!(finish_of(&parallel), Some(FinishReason::ToolCalls));

    assert_eq!(finish_of(&chunks(&model).await.unwrap()), Some(FinishReason::Length));
    let three = chunks(&model).await.unwrap();
    assert!(!text_of(&three).is_empty(), "only the first choice is read");
    assert!(!text_of(&chunks(&model).await.unwrap()).is_empty(), "a refusal is text");
    assert_eq!(calls_of(&chunks(&model).await.unwrap()).len(), 1);
}

#[tokio::test]
async fn anthropic_recorded_streams_parse() {
    let server = FakeServer::start(
        [
            "basic_response.txt",
            "tool_use_response.txt",
            "tool_use_invalid_json_response.txt",
            "unknown_events_response.txt",
            "message_delta_omitted_usage_response.txt",
            "refusal_response.txt",
            "incomplete_partial_json_response.txt",
        ]
        .iter()
        .map(|name| Reply::Sse(fixture(&format!("anthropic-messages-stream/{name}"))))
        .collect(),
    );
    let model = anthropic(&server);

    let basic = chunks(&model).await.unwrap();
    assert!(!text_of(&basic).is_empty());
    assert_eq!(finish_of(&basic), Some(FinishReason::Stop));

    let tool = chunks(&model).await.unwrap();
    assert_eq!(text_of(&tool), "I'll check the current weather in Paris for you.");
    assert!(tool.contains(&LlmChunk::Model("claude-sonnet-4-20250514".into())));
    let calls = calls_of(&tool);
    assert_eq!(
        calls,
        vec![(
            "toolu_01NRLabsLyVHZPKxbKvkfSMn".into(),
            "get_weather".into(),
            "{\"location\": \"Paris\"}".into()
        )]
    );
    assert_eq!(finish_of(&tool), Some(FinishReason::ToolCalls));
    assert!(tool
        .iter()
        .any(|c| matches!(c, LlmChunk::Usage(u) if u.input_tokens == 377 && u.output_tokens == 65)));

    let invalid = chunks(&model).await.unwrap();
    let arguments = &calls_of(&invalid)[0].2;
    assert!(
        serde_json::from_str::<Value>(arguments).is_err(),
        "kept as the model wrote it: {arguments}"
    );

    let unknown = chunks(&model).await.unwrap();
    assert_eq!(
        finish_of(&unknown),
        Some(FinishReason::Stop),
        "unknown events are skipped"
    );
    // The prompt cache's reads and writes, told in `message_start` only.
    let cached = chunks(&model).await.unwrap();
    assert!(!text_of(&cached).is_empty());
    assert!(
        cached.iter().any(|c| matches!(c, LlmChunk::Usage(u)
            if (u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)
                == (25, 8, 5, 10))),
        "{cached:?}"
    );
    assert_eq!(
        finish_of(&chunks(&model).await.unwrap()),
        Some(FinishReason::ContentFilter)
    );
    assert_eq!(finish_of(&chunks(&model).await.unwrap()), Some(FinishReason::Length));
}

// ---- request bodies, through a whole run ----

#[derive(Deserialize, JsonSchema)]
struct LookupArgs {
    /// What to look up.
    key: String,
}

#[derive(Clone, Default)]
struct Lookup {
    calls: Arc<AtomicUsize>,
}

impl Tool for Lookup {
    type Args = LookupArgs;
    fn name(&self) -> &str {
        "lookup"
    }
    fn description(&self) -> &str {
        "Looks a key up."
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        true
    }
    async fn call(&self, args: LookupArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(format!("value of {}", args.key).into())
    }
}

fn agent(model: impl Llm + 'static, tool: &Lookup) -> Agent {
    Agent::builder()
        .model(model)
        .tool(tool.clone())
        .workspace(std::env::temp_dir())
        .build()
        .unwrap()
}

#[tokio::test]
async fn openai_multi_step_run_sends_what_the_api_accepts() {
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("call_a", "lookup", r#"{"key": "alpha"}"#),
            ("call_b", "lookup", r#"{"key": "beta"}"#),
        ])),
        Reply::Sse(openai_text("Alpha and beta are known.", 4)),
    ]);
    let lookup = Lookup::default();
    let (events, outcome) = agent(openai(&server), &lookup)
        .run("look up alpha and beta")
        .collect()
        .await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("Alpha and beta are known."));
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 2);
    let deltas = events.iter().filter(|e| e.kind.name() == "llm.delta").count();
    assert!(deltas >= 6, "text streams as it arrives: {deltas} deltas");
    assert_eq!(outcome.metrics.input_tokens, 50 + 20);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(first.headers["authorization"], "Bearer sk-test");
    assert_eq!(first.body["model"], "gpt-4o-mini");
    assert_eq!(first.body["stream"], true);
    assert_eq!(first.body["stream_options"]["include_usage"], true);
    let tool = &first.body["tools"][0];
    assert_eq!(tool["type"], "function");
    assert_eq!(tool["function"]["name"], "lookup");
    assert_eq!(tool["function"]["parameters"]["type"], "object");
    assert_eq!(tool["function"]["parameters"]["required"], json!(["key"]));

    let messages = requests[1].body["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    // Both calls succeeded: no guidance, and never a second system message.
    assert_eq!(roles, vec!["system", "user", "assistant", "tool", "tool"]);
    let assistant = &messages[2];
    assert!(assistant["content"].is_null());
    assert_eq!(assistant["tool_calls"][0]["id"], "call_a");
    assert_eq!(assistant["tool_calls"][0]["type"], "function");
    let arguments: Value =
        serde_json::from_str(assistant["tool_calls"][1]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"key": "beta"}));
    assert_eq!(messages[3]["tool_call_id"], "call_a");
    assert_eq!(messages[3]["content"], "value of alpha");
    assert_eq!(messages[4]["tool_call_id"], "call_b");
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn anthropic_multi_step_run_sends_what_the_api_accepts() {
    let server = FakeServer::start(vec![
        Reply::Sse(anthropic_tool_use(
            "Let me look.",
            &[
                ("toolu_1", "lookup", r#"{"key": "alpha"}"#),
                ("toolu_2", "lookup", r#"{"key": "beta"}"#),
            ],
        )),
        Reply::Sse(anthropic_text("Both are known.")),
    ]);
    let lookup = Lookup::default();
    let (_, outcome) = agent(anthropic(&server), &lookup).run("look up").collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("Both are known."));
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 2);
    assert_eq!(outcome.metrics.input_tokens, 84);

    let requests = server.requests();
    let first = &requests[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.headers["x-api-key"], "ant-test");
    assert_eq!(first.headers["anthropic-version"], "2023-06-01");
    assert_eq!(first.body["max_tokens"], 4096);
    assert!(first.body["system"].as_str().unwrap().contains("You are Loom"));
    assert_eq!(first.body["tools"][0]["input_schema"]["type"], "object");
    let messages = requests[1].body["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, vec!["user", "assistant", "user"]);
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "text", "text": "Let me look."})
    );
    assert_eq!(
        messages[1]["content"][1],
        json!({"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "alpha"}})
    );
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(messages[2]["content"][1]["tool_use_id"], "toolu_2");
}

// ---- robustness ----

#[tokio::test]
async fn rate_limited_then_success_waits_for_retry_after() {
    let server = FakeServer::start(vec![Reply::rate_limited(1), Reply::Sse(openai_text("ok", 2))]);
    let started = Instant::now();
    let out = chunks(&openai(&server)).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "Retry-After: 1 was honoured"
    );
    assert_eq!(text_of(&out), "ok");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn server_error_then_success() {
    let server = FakeServer::start(vec![
        Reply::status(500, json!({"error": {"message": "boom", "type": "server_error"}})),
        Reply::Sse(anthropic_text("fine")),
    ]);
    let out = chunks(&anthropic(&server)).await.unwrap();
    assert_eq!(text_of(&out), "fine");
}

#[tokio::test]
async fn retries_exhausted_is_a_clear_error() {
    let server = FakeServer::start(
        (0..4)
            .map(|_| Reply::status(503, json!({"error": {"message": "overloaded", "type": "server_error"}})))
            .collect(),
    );
    let err = chunks(&openai(&server)).await.unwrap_err();
    assert!(matches!(err, LlmError::Server { status: 503, .. }), "{err:?}");
    assert!(err.to_string().contains("gave up after 4 attempts"), "{err}");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn client_errors_are_not_retried_and_are_typed() {
    let server = FakeServer::start(vec![
        Reply::status(
            401,
            json!({"error": {"message": "Incorrect API key", "type": "invalid_request_error"}}),
        ),
        Reply::status(
            400,
            json!({"error": {"message": "This model's maximum context length is 128000 tokens", "code": "context_length_exceeded"}}),
        ),
    ]);
    let model = openai(&server);
    assert!(matches!(chunks(&model).await, Err(LlmError::Authentication(_))));
    assert!(matches!(chunks(&model).await, Err(LlmError::ContextLengthExceeded(_))));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_reset_before_any_answer_is_retried_by_the_transport_and_after_it_once_by_the_run() {
    let server = FakeServer::start(vec![Reply::Reset(Vec::new()), Reply::Sse(openai_text("second try", 3))]);
    assert_eq!(text_of(&chunks(&openai(&server)).await.unwrap()), "second try");

    // Cut after the answer began: the provider does not retry (part of it
    // has streamed), the run asks once more, from the start, not streamed
    // (llama.cpp's streaming parser fails where its one-shot one does not),
    // and says so.
    let full = openai_text("this answer will be cut off midway", 3);
    let cut = full[..full.len() / 2].to_vec();
    let whole = Reply::Json(json!({
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "whole"}}],
    }));
    let server = FakeServer::start(vec![Reply::Reset(cut.clone()), whole]);
    let lookup = Lookup::default();
    let (events, outcome) = agent(openai(&server), &lookup).run("q").collect().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("whole"));
    let names: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    let broke = names.iter().position(|name| *name == "error").unwrap();
    assert!(
        names[..broke].contains(&"llm.delta"),
        "part of the answer had streamed: {names:?}"
    );
    assert_eq!(
        names[broke + 1..].iter().filter(|name| **name == "llm.start").count(),
        1,
        "{names:?}"
    );
    match &events[broke].kind {
        EventKind::Error { code, recoverable, .. } => {
            assert_eq!(code.as_str(), "LLM_CONNECTION");
            assert!(recoverable);
        }
        other => panic!("{other:?}"),
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["stream"], true);
    assert_eq!(requests[1].body["stream"], false, "asked again at once");
    assert!(requests[1].body.get("stream_options").is_none());

    // Once only: an answer asked again that fails too ends the run.
    let refused = Reply::status(400, json!({"error": {"message": "messages are malformed"}}));
    let server = FakeServer::start(vec![Reply::Reset(cut.clone()), refused]);
    let (events, outcome) = agent(openai(&server), &lookup).run("q").collect().await;
    assert_eq!(outcome.status, RunStatus::Error);
    let told = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    assert!(told.contains("mid-stream") && told.contains("(not streamed)"), "{told}");
    match outcome.stop_reason {
        Some(StopReason::Error { code, .. }) => assert_eq!(code.as_str(), "LLM_BAD_REQUEST"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests().len(), 2, "asked again once");
}

/// A stream that told only which model answers (Anthropic's
/// `message_start`, OpenAI's role-only first chunk) has not begun its
/// answer: a failure then is retried like one before any byte.
#[tokio::test]
async fn a_failure_after_the_model_was_named_and_before_the_answer_is_retried() {
    let full = String::from_utf8(anthropic_text("second try")).unwrap();
    let opened = full.split("event: content_block_start").next().unwrap().to_string();
    assert!(opened.contains("message_start"), "{opened}");
    let overloaded = format!(
        "{opened}event: error\ndata: {}\n\n",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    let server = FakeServer::start(vec![
        Reply::Sse(overloaded.into_bytes()),
        Reply::Sse(full.clone().into_bytes()),
    ]);
    assert_eq!(text_of(&chunks(&anthropic(&server)).await.unwrap()), "second try");
    assert_eq!(server.requests().len(), 2, "retried");

    let openai_full = openai_text("second try", 3);
    let first_chunk = String::from_utf8(openai_full.clone()).unwrap();
    let first_chunk = first_chunk.split("\n\n").next().unwrap().to_string() + "\n\n";
    assert!(first_chunk.contains("\"model\""), "{first_chunk}");
    let server = FakeServer::start(vec![Reply::Reset(first_chunk.into_bytes()), Reply::Sse(openai_full)]);
    assert_eq!(text_of(&chunks(&openai(&server)).await.unwrap()), "second try");
    assert_eq!(server.requests().len(), 2, "retried");
}

#[tokio::test]
async fn a_stream_cut_before_its_end_is_an_error_not_a_short_answer() {
    let full = String::from_utf8(openai_text("a complete sentence here", 4)).unwrap();
    // Everything before the chunk that carries finish_reason "stop".
    let finish = full.find("\"finish_reason\":\"stop\"").unwrap();
    let cut = full[..full[..finish].rfind("data: ").unwrap()].to_string();
    let anthropic_full = String::from_utf8(anthropic_text("cut here please")).unwrap();
    let anthropic_cut = anthropic_full.split("event: message_delta").next().unwrap().to_string();
    let server = FakeServer::start(vec![Reply::Sse(cut.into_bytes())]);
    let err = chunks(&openai(&server)).await.unwrap_err();
    assert!(matches!(err, LlmError::Protocol(_)), "{err:?}");
    let server = FakeServer::start(vec![Reply::Sse(anthropic_cut.into_bytes())]);
    let err = chunks(&anthropic(&server)).await.unwrap_err();
    assert!(err.to_string().contains("before message_stop"), "{err}");
}

#[tokio::test]
async fn invalid_tool_json_is_reported_and_the_corrected_call_runs() {
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("call_1", "lookup", r#"{"key": "alpha""#),
            ("call_2", "lookup", r#"{"key": "a", "key": "b"}"#),
        ])),
        Reply::Sse(openai_tool_calls(&[("call_3", "lookup", r#"{"key": "alpha"}"#)])),
        Reply::Sse(openai_text("done", 10)),
    ]);
    let lookup = Lookup::default();
    let (events, outcome) = agent(openai(&server), &lookup).run("q").collect().await;
    assert_eq!(outcome.status, RunStatus::Done);
    let results: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { status, content, .. } => Some((status.as_str().to_string(), content.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results[0].0, "error");
    assert!(results[0].1.contains("not valid JSON"), "{}", results[0].1);
    assert_eq!(results[1].0, "error");
    assert!(results[1].1.contains("duplicate key \"key\""), "{}", results[1].1);
    assert_eq!(results[2].0, "success");
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 1);
    // A server other than the official API may parse a call's arguments
    // (vLLM's and llama.cpp's chat templates do): the bad ones went back as
    // `{}`; the model read what was wrong in the results. (The official API
    // gets them as the model wrote them: a unit test in openai/mod.rs.)
    let second = &server.requests()[1].body["messages"][2]["tool_calls"];
    assert_eq!(second[0]["function"]["arguments"], "{}");
    assert_eq!(second[1]["function"]["arguments"], "{}");
}

#[tokio::test]
async fn a_slow_stream_is_cancelled_promptly() {
    let server = FakeServer::start(vec![Reply::SlowSse {
        body: openai_text("one two three four five six seven eight", 4),
        delay: Duration::from_millis(400),
    }]);
    let lookup = Lookup::default();
    let mut handle = agent(openai(&server), &lookup).run("q");
    while let Some(event) = handle.next_event().await {
        if event.kind.name() == "llm.delta" {
            break;
        }
    }
    let started = Instant::now();
    handle.cancel("stop");
    let outcome = handle.outcome().await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(outcome.status, RunStatus::Canceled);
}

/// A server that answers every call with a 500, and a model of it with
/// `attempts` per call, `wait` between them, and a circuit that opens after
/// `failures` failed calls, for `open_for`.
fn always_down(attempts: u32, wait: Duration, failures: u32, open_for: Duration) -> (FakeServer, OpenAiModel) {
    let server = FakeServer::start(
        (0..10)
            .map(|_| Reply::status(500, json!({"error": {"message": "down"}})))
            .collect(),
    );
    let mut config = OpenAiConfig::new("m");
    config.base_url = server.url();
    config.http = HttpSettings {
        retry: RetryPolicy {
            max_attempts: attempts,
            base_delay: wait,
            max_delay: wait,
        },
        breaker: loom_llm::BreakerSettings {
            failure_threshold: failures,
            open_for,
        },
        ..HttpSettings::default()
    };
    let model = OpenAiModel::new(config).unwrap();
    (server, model)
}

#[tokio::test]
async fn the_circuit_opens_after_repeated_failed_calls_and_one_trial_decides() {
    let (server, model) = always_down(3, Duration::from_millis(5), 2, Duration::from_millis(300));
    assert!(chunks(&model).await.is_err());
    assert_eq!(
        server.requests().len(),
        3,
        "a call's own retries do not open the circuit"
    );
    assert!(chunks(&model).await.is_err());
    assert_eq!(server.requests().len(), 6, "the second failed call opened it");
    let err = chunks(&model).await.unwrap_err();
    assert!(err.to_string().contains("circuit breaker"), "{err}");
    assert_eq!(server.requests().len(), 6, "an open circuit sends nothing");

    tokio::time::sleep(Duration::from_millis(400)).await;
    let err = chunks(&model).await.unwrap_err();
    assert!(
        !err.to_string().contains("circuit breaker"),
        "the trial went out: {err}"
    );
    assert_eq!(server.requests().len(), 7, "a trial is not retried");
    let err = chunks(&model).await.unwrap_err();
    assert!(
        err.to_string().contains("circuit breaker"),
        "the failed trial reopened it: {err}"
    );
    assert_eq!(server.requests().len(), 7);
}

#[tokio::test]
async fn a_call_dropped_while_it_retries_counts_as_failed() {
    // A run cancelled, or out of step time, while its call waits between
    // retries: the provider was failing, so the circuit hears of it.
    let (server, model) = always_down(8, Duration::from_secs(5), 1, Duration::from_secs(60));
    let dropped = tokio::time::timeout(Duration::from_millis(500), chunks(&model)).await;
    assert!(dropped.is_err(), "the call was still waiting to retry");
    assert_eq!(server.requests().len(), 1);
    let err = chunks(&model).await.unwrap_err();
    assert!(err.to_string().contains("circuit breaker"), "{err}");
    assert_eq!(server.requests().len(), 1, "an open circuit sends nothing");
}

#[tokio::test]
async fn the_default_retries_outlast_a_model_server_that_is_loading() {
    // llama.cpp answers `503 Loading model` while it reads its weights; a
    // call made then is waited through (the default number of attempts,
    // the waits shortened here), not given up on.
    let loading = || {
        Reply::status(
            503,
            json!({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}),
        )
    };
    let mut replies: Vec<Reply> = (0..7).map(|_| loading()).collect();
    replies.push(Reply::Sse(openai_text("ready", 3)));
    let server = FakeServer::start(replies);
    let mut config = OpenAiConfig::new("m");
    config.base_url = server.url();
    config.http = HttpSettings {
        retry: RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            ..RetryPolicy::default()
        },
        ..HttpSettings::default()
    };
    let model = OpenAiModel::new(config).unwrap();
    assert_eq!(text_of(&chunks(&model).await.unwrap()), "ready");
    assert_eq!(server.requests().len(), 8);
}

#[tokio::test]
async fn non_streaming_servers_and_text_tool_calls() {
    let server = FakeServer::start(vec![
        Reply::Json(json!({
            "id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"key\":\"k\"}"}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        })),
        Reply::Json(json!({
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "found it"}}],
        })),
    ]);
    let mut config = OpenAiConfig::new("local");
    config.base_url = server.url();
    config.stream = false;
    let lookup = Lookup::default();
    let (_, outcome) = agent(OpenAiModel::new(config).unwrap(), &lookup)
        .run("q")
        .collect()
        .await;
    assert_eq!(outcome.content.as_deref(), Some("found it"));
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests()[0].body["stream"], false);
    assert!(
        !server.requests()[0].headers.contains_key("authorization"),
        "no key, no header"
    );

    let server = FakeServer::start(vec![
        Reply::Sse(openai_text(
            "I will look. <tool_call>{\"name\": \"lookup\", \"arguments\": {\"key\": \"z\"}}</tool_call>",
            7,
        )),
        Reply::Sse(openai_text("z is known", 5)),
    ]);
    let mut config = OpenAiConfig::new("local");
    config.base_url = server.url();
    config.text_tool_calls = true;
    let lookup = Lookup::default();
    let (_, outcome) = agent(OpenAiModel::new(config).unwrap(), &lookup)
        .run("q")
        .collect()
        .await;
    assert_eq!(outcome.content.as_deref(), Some("z is known"));
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 1);
    let requests = server.requests();
    assert!(requests[0].body.get("tools").is_none());
    assert!(requests[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));
    let roles: Vec<&str> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        vec!["system", "user", "assistant", "user"],
        "calls and results written as text"
    );
}

#[tokio::test]
async fn usage_and_cost_reach_the_events() {
    let server = FakeServer::start(vec![Reply::Sse(openai_text("priced", 3))]);
    let agent = Agent::builder()
        .model(openai(&server))
        .pricing(Pricing {
            input_per_mtok: 1_000_000.0,
            output_per_mtok: 0.0,
        })
        .workspace(std::env::temp_dir())
        .build()
        .unwrap();
    let (events, outcome) = agent.run("q").collect().await;
    let finish = events.iter().find(|e| e.kind.name() == "llm.finish").unwrap();
    let json = serde_json::to_value(finish).unwrap();
    assert_eq!(json["usage"]["inputTokens"], 20);
    assert_eq!(json["costUsd"], 20.0);
    assert_eq!(outcome.metrics.cost_usd, Some(20.0));
}

#[tokio::test]
async fn a_recorded_run_replays_with_the_same_events() {
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[("call_x", "lookup", r#"{"key": "alpha"}"#)])),
        Reply::Sse(openai_text("alpha is known", 3)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recorded.json");
    let recorder = Recorder::new(Arc::new(openai(&server)), &path);
    let lookup = Lookup::default();
    let (live, _) = agent(recorder, &lookup).run("look up alpha").collect().await;
    let replay_model = ScriptedModel::from_path(&path).unwrap();
    let (replayed, outcome) = agent(replay_model, &lookup).run("look up alpha").collect().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(comparable(&live), comparable(&replayed));
}

/// Events as JSON, without what differs between two runs by nature.
fn comparable(events: &[loom_core::Event]) -> Vec<Value> {
    let json: Vec<Value> = events.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
    loom_testkit::comparable_events(&json)
}

#[tokio::test]
async fn tool_specs_go_out_unchanged() {
    let server = FakeServer::start(vec![Reply::Sse(anthropic_text("ok"))]);
    let model = anthropic(&server);
    let tools = [ToolSpec {
        name: "t".into(),
        description: "d".into(),
        parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
    }];
    let messages = [Message::user("q")];
    let mut stream = model.stream(LlmRequest::new(&messages, &tools)).await.unwrap();
    while stream.next().await.is_some() {}
    assert_eq!(
        server.requests()[0].body["tools"][0],
        json!({"name": "t", "description": "d", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}})
    );
}

#[tokio::test]
async fn context_length_exceeded_compresses_and_retries_once() {
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[("call_1", "lookup", r#"{"key": "alpha"}"#)])),
        Reply::Sse(openai_tool_calls(&[("call_2", "lookup", r#"{"key": "beta"}"#)])),
        Reply::status(
            400,
            json!({"error": {"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
        ),
        Reply::Sse(openai_text(
            "## 1. Background context\n- looked up alpha and beta\n## 5. Execution results\n- both known",
            20,
        )),
        Reply::Sse(openai_text("Alpha and beta are known.", 8)),
    ]);
    let lookup = Lookup::default();
    let agent = Agent::builder()
        .model(openai(&server))
        .tool(lookup.clone())
        .memory(loom_core::MemoryConfig {
            keep_recent_messages: 2,
            ..loom_core::MemoryConfig::default()
        })
        .workspace(std::env::temp_dir())
        .build()
        .unwrap();
    let (events, outcome) = agent.run("look up alpha, then beta").collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("Alpha and beta are known."));
    let recoverable = events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Error { code, recoverable: true, .. } if code.as_str() == "LLM_CONTEXT_LENGTH"));
    assert!(recoverable, "the overflow is reported as recoverable");
    assert!(events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::CompressionApplied { method, .. } if method.as_str() == "summary")));
    let requests = server.requests();
    assert_eq!(requests.len(), 5);
    let too_big = requests[2].body["messages"].as_array().unwrap().len();
    let retried = requests[4].body["messages"].as_array().unwrap();
    assert!(retried.len() < too_big, "{} vs {too_big}", retried.len());
    // A local server gets the summary joined to the one system message
    // (docs/context.md, "What each server is sent").
    assert!(retried[0]["content"]
        .as_str()
        .unwrap()
        .contains("\n\n[compressed history]"));
    assert_eq!(retried.iter().filter(|m| m["role"] == "system").count(), 1);
    assert_eq!(retried[1]["content"], "look up alpha, then beta", "the request is kept");
    // The summary request itself offered no tools.
    assert!(requests[3].body.get("tools").is_none());
}
