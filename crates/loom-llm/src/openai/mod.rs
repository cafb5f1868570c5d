//! OpenAI-compatible chat completions: OpenAI, vLLM, Ollama, llama.cpp's
//! server, LM Studio, DeepSeek, and anything else that speaks
//! `POST {base}/chat/completions`.

mod body;

use std::borrow::Cow;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{self, StreamExt};
use loom_core::{FinishReason, GuidancePlacement, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, Usage};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::text_tools::{self, TextToolCalls};
use crate::transport::{HttpSettings, StreamParser, Transport};

/// The default API address.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Settings of an OpenAI-compatible provider.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The model name as the server knows it.
    pub model: String,
    /// The API base, e.g. `http://localhost:11434/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …` when present.
    pub api_key: Option<String>,
    /// Stream the answer (`false` for servers that cannot).
    pub stream: bool,
    /// `max_tokens` of each answer, when set.
    pub max_tokens: Option<u32>,
    /// Describe tools in the prompt and read `<tool_call>{…}</tool_call>`
    /// from the text, for models without native tool calling.
    pub text_tool_calls: bool,
    /// Where a request's guidance goes; `None` chooses by the server: a
    /// system message at the official API, an inline reminder anywhere else.
    /// `System` is refused for any other server: local chat templates raise
    /// on, drop, or put first a system message that is not the first one.
    pub guidance: Option<GuidancePlacement>,
    /// Timeouts, retries, limits, headers.
    pub http: HttpSettings,
}

impl OpenAiConfig {
    /// Defaults for `model` at the OpenAI API.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            base_url: OPENAI_BASE_URL.to_string(),
            api_key: None,
            stream: true,
            max_tokens: None,
            text_tool_calls: false,
            guidance: None,
            http: HttpSettings::default(),
        }
    }

    /// Where guidance goes at this server (see [`OpenAiConfig::guidance`]).
    pub fn guidance_placement(&self) -> GuidancePlacement {
        self.guidance.unwrap_or(if self.is_official_api() {
            GuidancePlacement::System
        } else {
            GuidancePlacement::Inline
        })
    }

    /// Whether the server is the official OpenAI API (others are local or
    /// third-party servers, stricter in what they accept).
    pub fn is_official_api(&self) -> bool {
        self.base_url.trim_end_matches('/') == OPENAI_BASE_URL
    }
}

/// Why `guidance = "system"` is refused at `base_url`.
pub(crate) fn system_guidance_refused(base_url: &str) -> String {
    format!(
        "guidance = \"system\" is only for the official OpenAI API ({OPENAI_BASE_URL}), not {base_url}: \
         the chat templates of local servers (llama.cpp, vLLM, LM Studio, Ollama) raise on a system message \
         after the first, drop it, or put it in place of the system prompt; leave guidance unset or write \
         guidance = \"inline\""
    )
}

/// A model behind an OpenAI-compatible chat completions API.
#[derive(Debug)]
pub struct OpenAiModel {
    name: String,
    config: OpenAiConfig,
    transport: Transport,
}

impl OpenAiModel {
    /// A provider with `config`.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        if config.guidance == Some(GuidancePlacement::System) && !config.is_official_api() {
            return Err(LlmError::InvalidRequest(system_guidance_refused(&config.base_url)));
        }
        let name = format!("openai:{}", config.model);
        Ok(Self {
            transport: Transport::new(&name, config.http.clone())?,
            name,
            config,
        })
    }

    /// Whether `request`'s answer is streamed: as configured, unless the
    /// request asks for it at once.
    fn streams(&self, request: &LlmRequest<'_>) -> bool {
        self.config.stream && !request.unstreamed
    }

    /// The JSON body of a request, as the API expects it: serialized from
    /// the borrowed history, with the request's guidance placed.
    pub fn request_body(&self, request: &LlmRequest<'_>) -> Result<bytes::Bytes, LlmError> {
        let text_mode = self.config.text_tool_calls;
        let instructions = (text_mode && !request.tools.is_empty()).then(|| text_tools::instructions(request.tools));
        let body = body::ChatRequest {
            model: &self.config.model,
            messages: body::Messages {
                request: *request,
                placement: self.config.guidance_placement(),
                // Other servers may parse a call's arguments (vLLM's and
                // llama.cpp's chat templates do) and refuse text that is not
                // JSON; the model was told what was wrong in the result.
                json_arguments_only: !self.config.is_official_api(),
                text_mode,
                instructions: instructions.as_deref(),
                template_safe: !self.config.is_official_api(),
            },
            stream: self.streams(request),
            stream_options: self
                .streams(request)
                .then_some(body::StreamOptions { include_usage: true }),
            tools: (!text_mode && !request.tools.is_empty()).then_some(body::Tools(request.tools)),
            // Text-written calls have no `tool_choice`: the guidance's words must do.
            tool_choice: (!text_mode && request.require_tool_call && !request.tools.is_empty()).then_some("required"),
            max_tokens: self.config.max_tokens,
        };
        crate::wire::to_bytes(&body)
    }

    fn post(&self, body: &bytes::Bytes) -> reqwest::RequestBuilder {
        let url = format!("{}/chat/completions", self.config.base_url.trim_end_matches('/'));
        let mut request = self
            .transport
            .client()
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        request
    }
}

#[async_trait]
impl Llm for OpenAiModel {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: LlmRequest<'_>) -> Result<LlmStream, LlmError> {
        let body = self.request_body(&request)?;
        let stream = if self.streams(&request) {
            self.transport
                .stream(|| self.post(&body), OpenAiParser::default, map_error)
                .await?
        } else {
            let answer = self.transport.json(|| self.post(&body), map_error).await?;
            stream::iter(parse_completion(&answer)?.into_iter().map(Ok)).boxed()
        };
        Ok(if self.config.text_tool_calls {
            TextToolCalls::wrap(stream)
        } else {
            stream
        })
    }
}

/// One chunk of a chat completions stream. Typed and borrowing, so a long
/// answer costs one small parse per chunk; unknown fields are ignored.
#[derive(Deserialize)]
struct StreamChunk<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Vec<StreamChoice<'a>>,
    #[serde(default)]
    usage: Option<UsageJson>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct StreamChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(borrow, default)]
    delta: Delta<'a>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCallPiece<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallPiece<'a> {
    #[serde(default)]
    index: usize,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<FunctionPiece<'a>>,
}

#[derive(Deserialize)]
struct FunctionPiece<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct UsageJson {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

/// Of the prompt's tokens, those read from the prompt cache.
#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// Parses `data:` lines of a chat completions stream.
#[derive(Debug, Default)]
pub(crate) struct OpenAiParser {
    done: bool,
    finished: bool,
    /// The answering model was told (every chunk repeats it).
    model_told: bool,
}

impl StreamParser for OpenAiParser {
    fn event(&mut self, _name: &str, data: &str) -> Result<Vec<LlmChunk>, LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: StreamChunk<'_> = serde_json::from_str(data)
            .map_err(|err| LlmError::Protocol(format!("a stream chunk is not valid ({err}): {}", clip(data))))?;
        if let Some(error) = &chunk.error {
            return Err(error_from_body(500, None, error));
        }
        let mut out = Vec::new();
        if let Some(model) = chunk.model.filter(|model| !self.model_told && !model.is_empty()) {
            self.model_told = true;
            out.push(LlmChunk::Model(model.into_owned()));
        }
        if let Some(choice) = chunk.choices.into_iter().find(|c| c.index == 0) {
            let delta = choice.delta;
            for text in [delta.content, delta.refusal].into_iter().flatten() {
                if !text.is_empty() {
                    out.push(LlmChunk::Text(text.into_owned()));
                }
            }
            for call in delta.tool_calls.into_iter().flatten() {
                let (name, arguments) = match call.function {
                    Some(function) => (function.name, function.arguments),
                    None => (None, None),
                };
                out.push(LlmChunk::ToolCallDelta {
                    index: call.index,
                    id: call.id.map(Cow::into_owned),
                    name: name.map(Cow::into_owned),
                    arguments: arguments.map(Cow::into_owned).unwrap_or_default(),
                });
            }
            if let Some(reason) = choice.finish_reason {
                self.finished = true;
                out.push(LlmChunk::Finish(finish_reason(&reason)));
            }
        }
        if let Some(usage) = chunk.usage {
            out.push(LlmChunk::Usage(Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                cache_read_input_tokens: usage
                    .prompt_tokens_details
                    .and_then(|details| details.cached_tokens)
                    .unwrap_or(0),
                cache_creation_input_tokens: 0,
            }));
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<LlmChunk>, LlmError> {
        // `[DONE]` ends a stream; a server that omits it must at least have
        // said why the answer finished. Anything else is a cut stream.
        if self.done || self.finished {
            Ok(Vec::new())
        } else {
            Err(LlmError::Protocol(
                "the stream ended before the answer was complete (no finish_reason and no [DONE])".into(),
            ))
        }
    }
}

/// The chunks of a non-streamed answer.
pub(crate) fn parse_completion(answer: &Value) -> Result<Vec<LlmChunk>, LlmError> {
    if let Some(error) = answer.get("error") {
        return Err(error_from_body(500, None, error));
    }
    let mut out = Vec::new();
    if let Some(model) = answer["model"].as_str().filter(|model| !model.is_empty()) {
        out.push(LlmChunk::Model(model.to_string()));
    }
    // No choices is an empty answer (the engine retries it once, then
    // reports EMPTY_ANSWER), as it is when a stream brings none.
    let Some(choice) = answer["choices"].get(0) else {
        out.extend(usage(&answer["usage"]).map(LlmChunk::Usage));
        return Ok(out);
    };
    let message = &choice["message"];
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        out.push(LlmChunk::Text(text.to_string()));
    }
    for (index, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        out.push(LlmChunk::ToolCallDelta {
            index,
            id: call["id"].as_str().map(str::to_string),
            name: call["function"]["name"].as_str().map(str::to_string),
            arguments: match &call["function"]["arguments"] {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            },
        });
    }
    if let Some(usage) = usage(&answer["usage"]) {
        out.push(LlmChunk::Usage(usage));
    }
    out.push(LlmChunk::Finish(finish_reason(
        choice["finish_reason"].as_str().unwrap_or("stop"),
    )));
    Ok(out)
}

fn usage(value: &Value) -> Option<Usage> {
    value.as_object()?;
    Some(Usage {
        input_tokens: value["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: value["completion_tokens"].as_u64().unwrap_or(0),
        cache_read_input_tokens: value["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        cache_creation_input_tokens: 0,
    })
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

/// An HTTP error answer as a typed error.
pub(crate) fn map_error(status: u16, retry_after: Option<Duration>, body: &str) -> LlmError {
    let parsed: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = parsed.get("error").cloned().unwrap_or(Value::Null);
    if error.is_object() {
        return error_from_body(status, retry_after, &error);
    }
    let message = if let Some(text) = error.as_str() {
        text.to_string()
    } else if body.trim().is_empty() {
        format!("HTTP {status}")
    } else {
        clip(body)
    };
    error_from_body(status, retry_after, &json!({ "message": message }))
}

fn error_from_body(status: u16, retry_after: Option<Duration>, error: &Value) -> LlmError {
    let message = error["message"].as_str().unwrap_or("no message").to_string();
    let code = error["code"]
        .as_str()
        .or_else(|| error["type"].as_str())
        .unwrap_or_default();
    let lowered = message.to_lowercase();
    if code == "context_length_exceeded"
        || code == "exceed_context_size_error"
        || lowered.contains("maximum context length")
        || lowered.contains("context length")
        || lowered.contains("context window")
        // llama.cpp: "the request exceeds the available context size".
        || lowered.contains("context size")
    {
        return LlmError::ContextLengthExceeded(message);
    }
    match status {
        401 | 403 => LlmError::Authentication(message),
        429 if code == "insufficient_quota" => LlmError::BadRequest(format!("quota exhausted: {message}")),
        429 => LlmError::RateLimited { message, retry_after },
        400..=499 => LlmError::BadRequest(format!("HTTP {status}: {message}")),
        _ => LlmError::Server { status, message },
    }
}

fn clip(text: &str) -> String {
    loom_core::text::clip(text, 300, "…")
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::{Message, ToolCall, ToolSpec};

    fn history() -> Vec<Message> {
        vec![
            Message::system("base"),
            Message::user("q"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a"}),
                }],
            },
            Message::tool("c1", "read_file", "hello"),
        ]
    }

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads.".into(),
            parameters: json!({"type": "object"}),
        }]
    }

    fn body(config: OpenAiConfig, messages: &[Message], tools: &[ToolSpec], guidance: Option<&str>) -> Value {
        let model = OpenAiModel::new(config).unwrap();
        let request = LlmRequest::new(messages, tools).with_guidance(guidance);
        serde_json::from_slice(&model.request_body(&request).unwrap()).unwrap()
    }

    fn local(model: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: "http://127.0.0.1:8080/v1".into(),
            ..OpenAiConfig::new(model)
        }
    }

    #[test]
    fn a_required_tool_call_is_asked_for_only_with_tools_and_native_calls() {
        let history = history();
        let tools = tools();
        let required = |config: OpenAiConfig, tools: &[ToolSpec]| -> Value {
            let model = OpenAiModel::new(config).unwrap();
            let request = LlmRequest::new(&history, tools).with_tool_call_required(true);
            serde_json::from_slice(&model.request_body(&request).unwrap()).unwrap()
        };
        assert_eq!(required(local("llama"), &tools)["tool_choice"], "required");
        assert!(
            required(local("llama"), &[]).get("tool_choice").is_none(),
            "no tools, nothing to require"
        );
        let text = OpenAiConfig {
            text_tool_calls: true,
            ..local("llama")
        };
        assert!(
            required(text, &tools).get("tool_choice").is_none(),
            "calls written as text"
        );
        let plain = body(local("llama"), &history, &tools, None);
        assert!(plain.get("tool_choice").is_none(), "the server's default otherwise");
    }

    #[test]
    fn the_body_has_the_api_shape() {
        let body = body(OpenAiConfig::new("gpt-x"), &history(), &tools(), None);
        assert_eq!(body["model"], "gpt-x");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["tools"][0]["type"], "function");
        assert_eq!(body["tools"][0]["function"]["name"], "read_file");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[2]["tool_calls"][0]["function"]["arguments"], r#"{"path":"a"}"#);
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "hello"})
        );
        assert!(body.get("max_tokens").is_none());
    }

    #[test]
    fn guidance_is_a_system_message_at_the_official_api_and_a_reminder_elsewhere() {
        let official = body(OpenAiConfig::new("gpt-x"), &history(), &tools(), Some("fix it"));
        let messages = official["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 5);
        assert_eq!(messages[4], json!({"role": "system", "content": "fix it"}));
        assert_eq!(messages[3]["content"], "hello");

        let at_home = body(local("llama"), &history(), &tools(), Some("fix it"));
        let messages = at_home["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4, "no message added");
        let systems = messages.iter().filter(|m| m["role"] == "system").count();
        assert_eq!(systems, 1, "one system message, first");
        assert_eq!(
            messages[3]["content"],
            "hello\n\n<system-reminder>\nfix it\n</system-reminder>"
        );

        // Inline can be chosen at the official API; a trailing system
        // message is refused anywhere else.
        let inline = OpenAiConfig {
            guidance: Some(GuidancePlacement::Inline),
            ..OpenAiConfig::new("gpt-x")
        };
        let out = body(inline, &history(), &tools(), Some("g"));
        assert_eq!(out["messages"].as_array().unwrap().len(), 4);
        let forced = OpenAiConfig {
            guidance: Some(GuidancePlacement::System),
            ..local("llama")
        };
        let refused = OpenAiModel::new(forced).unwrap_err().to_string();
        assert!(refused.contains("only for the official OpenAI API"), "{refused}");
        // After the model's own words, the reminder is a user message.
        let mut continued = history();
        continued.push(Message::assistant("It says"));
        let out = body(local("llama"), &continued, &tools(), Some("continue"));
        assert_eq!(
            out["messages"][5],
            json!({"role": "user", "content": "<system-reminder>\ncontinue\n</system-reminder>"})
        );
    }

    #[test]
    fn a_compression_summary_joins_the_system_prompt_except_at_the_official_api() {
        let mut compressed = history();
        compressed.insert(1, Message::system("[compressed history] the past"));
        let official = body(OpenAiConfig::new("gpt-x"), &compressed, &tools(), None);
        let roles: Vec<&str> = official["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);

        let at_home = body(local("llama"), &compressed, &tools(), Some("careful"));
        let messages = at_home["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(messages[0]["content"], "base\n\n[compressed history] the past");
        // The guidance still lands on the last tool result.
        assert!(messages[3]["content"]
            .as_str()
            .unwrap()
            .ends_with("careful\n</system-reminder>"));

        // Text mode: the tool instructions come last in the one system message.
        let text = OpenAiConfig {
            text_tool_calls: true,
            ..local("small")
        };
        let out = body(text, &compressed, &tools(), None);
        let system = out["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.starts_with("base\n\n[compressed history] the past\n\nYou can call tools."),
            "{system}"
        );
        assert_eq!(
            out["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "system")
                .count(),
            1
        );

        // A summary with no system prompt before it is the system message.
        let out = body(local("llama"), &compressed[1..], &tools(), None);
        assert_eq!(
            out["messages"][0],
            json!({"role": "system", "content": "[compressed history] the past"})
        );
    }

    #[test]
    fn user_and_assistant_alternate_at_other_servers() {
        // A steer after tool results, then a second user turn: the official
        // API gets them as they are; another server gets them folded so that
        // user and assistant alternate (calls and results aside).
        let mut steered = history();
        steered.push(Message::user("also check b"));
        steered.push(Message::user("and c"));
        let official = body(OpenAiConfig::new("gpt-x"), &steered, &tools(), None);
        assert_eq!(official["messages"].as_array().unwrap().len(), 6);

        let at_home = body(local("llama"), &steered, &tools(), Some("careful"));
        let messages = at_home["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(messages[3]["tool_call_id"], "c1");
        assert_eq!(
            messages[3]["content"],
            "hello\n\n<user-message>\nalso check b\n</user-message>\n\n<user-message>\nand c\n</user-message>\n\n<system-reminder>\ncareful\n</system-reminder>"
        );

        // Two user turns in a row (a session whose last run left no answer).
        let doubled = vec![Message::system("base"), Message::user("first"), Message::user("second")];
        let out = body(local("llama"), &doubled, &tools(), None);
        assert_eq!(
            out["messages"][1],
            json!({"role": "user", "content": "first\n\nsecond"})
        );
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);

        // Text mode: parallel results (user turns there) become one user turn.
        let mut parallel = history();
        if let Message::Assistant { tool_calls, .. } = &mut parallel[2] {
            tool_calls.push(ToolCall {
                id: "c2".into(),
                name: "read_file".into(),
                arguments: json!({"path": "b"}),
            });
        }
        parallel.push(Message::tool("c2", "read_file", "world"));
        parallel.push(Message::user("thanks"));
        let text = OpenAiConfig {
            text_tool_calls: true,
            ..local("small")
        };
        let out = body(text, &parallel, &tools(), None);
        let messages = out["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(
            messages[3]["content"],
            "<tool_result name=\"read_file\" id=\"c1\">\nhello\n</tool_result>\n\n<tool_result name=\"read_file\" id=\"c2\">\nworld\n</tool_result>\n\nthanks"
        );
    }

    #[test]
    fn history_is_written_as_text_for_models_without_tool_calling() {
        let config = OpenAiConfig {
            text_tool_calls: true,
            ..local("small")
        };
        let out = body(config.clone(), &history(), &tools(), Some("careful"));
        assert!(out.get("tools").is_none());
        let messages = out["messages"].as_array().unwrap();
        let system = messages[0]["content"].as_str().unwrap();
        assert!(system.starts_with("base\n\nYou can call tools."), "{system}");
        assert!(system.contains("\"name\": \"read_file\""), "{system}");
        assert_eq!(
            messages[2],
            json!({"role": "assistant", "content": "<tool_call>{\"name\":\"read_file\",\"arguments\":{\"path\":\"a\"}}</tool_call>"})
        );
        assert_eq!(messages[3]["role"], "user");
        assert_eq!(
            messages[3]["content"],
            "<tool_result name=\"read_file\" id=\"c1\">\nhello\n</tool_result>\n\n<system-reminder>\ncareful\n</system-reminder>"
        );
        // The final-answer call offers no tools: calls stay text, no instructions.
        let out = body(config, &history(), &[], None);
        assert_eq!(out["messages"][0]["content"], "base");
        assert!(out["messages"][2].get("tool_calls").is_none());
    }

    #[test]
    fn arguments_that_are_not_json_go_to_other_servers_as_an_empty_object() {
        let mut messages = history();
        if let Message::Assistant { tool_calls, .. } = &mut messages[2] {
            tool_calls[0].arguments = json!("{\"path\": \"a.");
        }
        let official = body(OpenAiConfig::new("gpt-x"), &messages, &tools(), None);
        assert_eq!(
            official["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"path\": \"a."
        );
        let local = body(local("llama"), &messages, &tools(), None);
        assert_eq!(local["messages"][2]["tool_calls"][0]["function"]["arguments"], "{}");
    }

    #[test]
    fn cached_prompt_tokens_are_read_from_a_stream_and_an_answer() {
        let mut parser = OpenAiParser::default();
        let chunks = parser
            .event(
                "",
                r#"{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920}}}"#,
            )
            .unwrap();
        assert!(chunks.contains(&LlmChunk::Usage(Usage {
            input_tokens: 2006,
            output_tokens: 300,
            cache_read_input_tokens: 1920,
            cache_creation_input_tokens: 0,
        })));
        let answer = parse_completion(
            &json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 2}}}),
        )
        .unwrap();
        assert!(matches!(&answer[0], LlmChunk::Usage(u) if u.cache_read_input_tokens == 2));
    }

    #[test]
    fn an_answer_without_choices_is_empty() {
        let chunks =
            parse_completion(&json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}})).unwrap();
        assert_eq!(
            chunks,
            vec![LlmChunk::Usage(Usage {
                input_tokens: 3,
                output_tokens: 0,
                ..Usage::default()
            })]
        );
    }

    #[test]
    fn maps_errors_by_status_and_code() {
        let body = r#"{"error":{"message":"This model's maximum context length is 128000 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert!(matches!(map_error(400, None, body), LlmError::ContextLengthExceeded(_)));
        assert!(matches!(
            map_error(401, None, r#"{"error":{"message":"bad key"}}"#),
            LlmError::Authentication(_)
        ));
        let limited = map_error(
            429,
            Some(Duration::from_secs(2)),
            r#"{"error":{"message":"slow down"}}"#,
        );
        assert_eq!(
            limited,
            LlmError::RateLimited {
                message: "slow down".into(),
                retry_after: Some(Duration::from_secs(2))
            }
        );
        assert!(matches!(
            map_error(503, None, "upstream down"),
            LlmError::Server { status: 503, .. }
        ));
        assert!(matches!(map_error(404, None, ""), LlmError::BadRequest(_)));
    }

    #[test]
    fn a_stream_without_an_end_is_an_error() {
        let mut parser = OpenAiParser::default();
        parser
            .event(
                "",
                r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            )
            .unwrap();
        assert!(matches!(parser.end(), Err(LlmError::Protocol(_))));
    }
}
