//! Anthropic Messages API (`POST {base}/v1/messages`), streamed.

mod body;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use loom_core::{FinishReason, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, Usage};
use serde_json::Value;

use crate::transport::{HttpSettings, StreamParser, Transport};

/// The default API address.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The API version Loom speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Settings of the Anthropic provider.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// The model, e.g. `claude-sonnet-4-20250514`.
    pub model: String,
    /// The API base.
    pub base_url: String,
    /// Sent as `x-api-key`.
    pub api_key: Option<String>,
    /// `max_tokens` of each answer (the API requires one).
    pub max_tokens: u32,
    /// Timeouts, retries, limits, headers.
    pub http: HttpSettings,
}

impl AnthropicConfig {
    /// Defaults for `model`.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            base_url: ANTHROPIC_BASE_URL.to_string(),
            api_key: None,
            max_tokens: 4096,
            http: HttpSettings::default(),
        }
    }
}

/// A Claude model behind the Messages API.
#[derive(Debug)]
pub struct AnthropicModel {
    name: String,
    config: AnthropicConfig,
    transport: Transport,
}

impl AnthropicModel {
    /// A provider with `config`.
    pub fn new(config: AnthropicConfig) -> Result<Self, LlmError> {
        let name = format!("anthropic:{}", config.model);
        Ok(Self {
            transport: Transport::new(&name, config.http.clone())?,
            name,
            config,
        })
    }

    /// The JSON body of a request, as the API expects it (see [`body`]):
    /// serialized from the borrowed history, the guidance a reminder at the
    /// end of the last user turn.
    pub fn request_body(&self, request: &LlmRequest<'_>) -> Result<bytes::Bytes, LlmError> {
        crate::wire::to_bytes(&body::MessagesRequest::new(
            &self.config.model,
            self.config.max_tokens,
            request,
        ))
    }

    fn post(&self, body: &bytes::Bytes) -> reqwest::RequestBuilder {
        let url = format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'));
        let mut request = self
            .transport
            .client()
            .post(url)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(key) = &self.config.api_key {
            request = request.header("x-api-key", key);
        }
        request
    }
}

#[async_trait]
impl Llm for AnthropicModel {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: LlmRequest<'_>) -> Result<LlmStream, LlmError> {
        let body = self.request_body(&request)?;
        self.transport
            .stream(|| self.post(&body), AnthropicParser::default, map_error)
            .await
    }
}

/// Parses the Messages API's named events.
#[derive(Debug, Default)]
pub(crate) struct AnthropicParser {
    input_tokens: u64,
    /// Prompt-cache reads and writes, told in `message_start`.
    cache_read_input_tokens: u64,
    cache_creation_input_tokens: u64,
    /// Content block index → tool call index.
    tool_blocks: HashMap<u64, usize>,
    stopped: bool,
}

impl StreamParser for AnthropicParser {
    fn event(&mut self, name: &str, data: &str) -> Result<Vec<LlmChunk>, LlmError> {
        if data.trim().is_empty() {
            return Ok(Vec::new());
        }
        let event: Value = serde_json::from_str(data)
            .map_err(|err| LlmError::Protocol(format!("an event is not JSON ({err}): {data}")))?;
        let kind = event["type"].as_str().unwrap_or(name);
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                let usage = &event["message"]["usage"];
                self.input_tokens = usage["input_tokens"].as_u64().unwrap_or(0);
                self.cache_read_input_tokens = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
                self.cache_creation_input_tokens = usage["cache_creation_input_tokens"].as_u64().unwrap_or(0);
                if let Some(model) = event["message"]["model"].as_str().filter(|model| !model.is_empty()) {
                    out.push(LlmChunk::Model(model.to_string()));
                }
            }
            "content_block_start" => {
                let block = &event["content_block"];
                let index = event["index"].as_u64().unwrap_or(0);
                match block["type"].as_str() {
                    Some("text") => {
                        if let Some(text) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(LlmChunk::Text(text.to_string()));
                        }
                    }
                    Some("tool_use") => {
                        let call = self.tool_blocks.len();
                        self.tool_blocks.insert(index, call);
                        out.push(LlmChunk::ToolCallDelta {
                            index: call,
                            id: block["id"].as_str().map(str::to_string),
                            name: block["name"].as_str().map(str::to_string),
                            arguments: String::new(),
                        });
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        if let Some(text) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(LlmChunk::Text(text.to_string()));
                        }
                    }
                    Some("input_json_delta") => {
                        let index = event["index"].as_u64().unwrap_or(0);
                        let call = *self.tool_blocks.get(&index).ok_or_else(|| {
                            LlmError::Protocol(format!("input_json_delta for block {index}, which is not a tool_use"))
                        })?;
                        out.push(LlmChunk::ToolCallDelta {
                            index: call,
                            id: None,
                            name: None,
                            arguments: delta["partial_json"].as_str().unwrap_or_default().to_string(),
                        });
                    }
                    // Thinking and signatures are not part of the answer.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = event["delta"]["stop_reason"].as_str() {
                    out.push(LlmChunk::Finish(stop_reason(reason)));
                }
                let output = event["usage"]["output_tokens"].as_u64();
                if output.is_some() || self.input_tokens > 0 {
                    out.push(LlmChunk::Usage(Usage {
                        input_tokens: event["usage"]["input_tokens"].as_u64().unwrap_or(self.input_tokens),
                        output_tokens: output.unwrap_or(0),
                        // The final counts, when the delta repeats them.
                        cache_read_input_tokens: event["usage"]["cache_read_input_tokens"]
                            .as_u64()
                            .unwrap_or(self.cache_read_input_tokens),
                        cache_creation_input_tokens: event["usage"]["cache_creation_input_tokens"]
                            .as_u64()
                            .unwrap_or(self.cache_creation_input_tokens),
                    }));
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let error = &event["error"];
                return Err(error_from(
                    error["type"].as_str().unwrap_or_default(),
                    error["message"].as_str().unwrap_or("stream error"),
                    None,
                    500,
                ));
            }
            // ping, content_block_stop and event types added later.
            _ => {}
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<LlmChunk>, LlmError> {
        if self.stopped {
            Ok(Vec::new())
        } else {
            Err(LlmError::Protocol(
                "the stream ended before message_stop: the answer was cut short".into(),
            ))
        }
    }
}

fn stop_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" => FinishReason::Length,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

/// An HTTP error answer as a typed error.
pub(crate) fn map_error(status: u16, retry_after: Option<Duration>, body: &str) -> LlmError {
    let parsed: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let kind = parsed["error"]["type"].as_str().unwrap_or_default();
    let message = parsed["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            if body.trim().is_empty() {
                format!("HTTP {status}")
            } else {
                body.chars().take(300).collect()
            }
        });
    error_from(kind, &message, retry_after, status)
}

fn error_from(kind: &str, message: &str, retry_after: Option<Duration>, status: u16) -> LlmError {
    let message = message.to_string();
    let lowered = message.to_lowercase();
    if lowered.contains("prompt is too long") || lowered.contains("context window") || kind == "request_too_large" {
        return LlmError::ContextLengthExceeded(message);
    }
    match (kind, status) {
        ("authentication_error" | "permission_error", _) | (_, 401 | 403) => LlmError::Authentication(message),
        ("rate_limit_error", _) | (_, 429) => LlmError::RateLimited { message, retry_after },
        ("overloaded_error", _) | (_, 529) => LlmError::Server { status: 529, message },
        ("api_error", _) => LlmError::Server { status, message },
        (_, 400..=499) => LlmError::BadRequest(format!("HTTP {status}: {message}")),
        _ => LlmError::Server { status, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::{Message, ToolCall};
    use serde_json::json;

    fn body(model: &AnthropicModel, messages: &[Message], guidance: Option<&str>) -> Value {
        let request = LlmRequest::new(messages, &[]).with_guidance(guidance);
        serde_json::from_slice(&model.request_body(&request).unwrap()).unwrap()
    }

    #[test]
    fn a_required_tool_call_is_tool_choice_any() {
        let model = AnthropicModel::new(AnthropicConfig::new("claude-x")).unwrap();
        let messages = vec![Message::user("go")];
        let tools = [loom_core::ToolSpec {
            name: "read_file".into(),
            description: "Read.".into(),
            parameters: json!({"type": "object"}),
        }];
        let request = LlmRequest::new(&messages, &tools).with_tool_call_required(true);
        let required: Value = serde_json::from_slice(&model.request_body(&request).unwrap()).unwrap();
        assert_eq!(required["tool_choice"], json!({"type": "any"}));
        assert!(body(&model, &messages, None).get("tool_choice").is_none());
    }

    #[test]
    fn messages_alternate_with_tool_blocks_and_system_apart() {
        let messages = vec![
            Message::system("be brief"),
            Message::user("weather?"),
            Message::Assistant {
                content: "Checking.".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "t1".into(),
                        name: "w".into(),
                        arguments: json!({"city": "Paris"}),
                    },
                    ToolCall {
                        id: "t2".into(),
                        name: "w".into(),
                        arguments: json!("{broken"),
                    },
                ],
            },
            Message::tool("t1", "w", "sunny"),
            Message::tool("t2", "w", "Error: not JSON"),
            Message::system("[compressed history]"),
            Message::assistant("It is sunny."),
        ];
        let model = AnthropicModel::new(AnthropicConfig::new("claude-x")).unwrap();
        let body = body(&model, &messages, None);
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["model"], "claude-x");
        assert_eq!(body["stream"], true);
        assert!(body.get("tools").is_none());
        let out = body["messages"].as_array().unwrap();
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, vec!["user", "assistant", "user", "assistant"]);
        assert_eq!(out[1]["content"][1]["type"], "tool_use");
        assert_eq!(out[1]["content"][2]["input"], json!({}));
        assert_eq!(out[2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(out[2]["content"][1]["tool_use_id"], "t2");
        assert_eq!(out[2]["content"][2]["text"], "[compressed history]");
    }

    #[test]
    fn guidance_is_a_reminder_at_the_end_of_the_last_user_turn() {
        let model = AnthropicModel::new(AnthropicConfig::new("claude-x")).unwrap();
        let call = ToolCall {
            id: "t1".into(),
            name: "w".into(),
            arguments: json!({}),
        };
        let messages = vec![
            Message::system("s"),
            Message::user("q"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call],
            },
            Message::tool("t1", "w", "sunny"),
        ];
        let out = body(&model, &messages, Some("finish now"));
        let last = &out["messages"][2];
        assert_eq!(last["role"], "user");
        assert_eq!(last["content"][0]["type"], "tool_result");
        assert_eq!(
            last["content"][1],
            json!({"type": "text", "text": "<system-reminder>\nfinish now\n</system-reminder>"})
        );
        assert_eq!(out["system"], "s", "never a second system text");
        // After the model's own words, the reminder is a user turn of its own.
        let mut continued = messages;
        continued.push(Message::assistant("It is"));
        let out = body(&model, &continued, Some("continue"));
        let turns = out["messages"].as_array().unwrap();
        assert_eq!(turns.len(), 5);
        assert_eq!(turns[4]["role"], "user");
        assert_eq!(turns[4]["content"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn maps_errors() {
        let too_long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert!(matches!(
            map_error(400, None, too_long),
            LlmError::ContextLengthExceeded(_)
        ));
        let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert!(matches!(
            map_error(529, None, overloaded),
            LlmError::Server { status: 529, .. }
        ));
        assert!(matches!(map_error(401, None, "{}"), LlmError::Authentication(_)));
    }
}
