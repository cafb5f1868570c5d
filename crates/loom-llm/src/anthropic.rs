//! Anthropic Messages API (`POST {base}/v1/messages`), streamed.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use loom_core::{FinishReason, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, Message, ToolSpec, Usage};
use serde_json::{json, Value};

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

    /// The JSON body of a request, as the API expects it.
    pub fn request_body(&self, request: &LlmRequest<'_>) -> Value {
        let (system, messages) = convert_messages(request.messages);
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": self.config.max_tokens,
            "messages": messages,
            "stream": true,
        });
        if !system.is_empty() {
            body["system"] = json!(system);
        }
        if !request.tools.is_empty() {
            body["tools"] = Value::Array(request.tools.iter().map(tool_json).collect());
        }
        body
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let url = format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'));
        let mut request = self
            .transport
            .client()
            .post(url)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(body);
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
        let body = self.request_body(&request);
        self.transport
            .stream(|| self.post(&body), AnthropicParser::default, map_error)
            .await
    }
}

/// Loom's messages as the Messages API wants them: the leading system
/// messages become `system`; the rest alternate user/assistant, with tool
/// calls as `tool_use` blocks, results as `tool_result` blocks in the next
/// user turn, and later system messages (guidance) as text in a user turn.
fn convert_messages(messages: &[Message]) -> (String, Vec<Value>) {
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut leading = true;
    for message in messages {
        let (role, blocks) = match message {
            Message::System { content } if leading => {
                system.push(content.clone());
                continue;
            }
            Message::System { content } => ("user", vec![json!({"type": "text", "text": content})]),
            Message::User { content } => ("user", vec![json!({"type": "text", "text": content})]),
            Message::Assistant { content, tool_calls } => {
                let mut blocks = Vec::new();
                if !content.is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                for call in tool_calls {
                    let input = if call.arguments.is_object() {
                        call.arguments.clone()
                    } else {
                        json!({})
                    };
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                if blocks.is_empty() {
                    continue;
                }
                ("assistant", blocks)
            }
            Message::Tool {
                tool_call_id, content, ..
            } => (
                "user",
                vec![json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content})],
            ),
        };
        leading = false;
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    (system.join("\n\n"), messages)
}

fn tool_json(tool: &ToolSpec) -> Value {
    json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters})
}

/// Parses the Messages API's named events.
#[derive(Debug, Default)]
pub(crate) struct AnthropicParser {
    input_tokens: u64,
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
                self.input_tokens = event["message"]["usage"]["input_tokens"].as_u64().unwrap_or(0);
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
    use loom_core::ToolCall;

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
            Message::system("guidance"),
            Message::assistant("It is sunny."),
        ];
        let (system, out) = convert_messages(&messages);
        assert_eq!(system, "be brief");
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, vec!["user", "assistant", "user", "assistant"]);
        assert_eq!(out[1]["content"][1]["type"], "tool_use");
        assert_eq!(out[1]["content"][2]["input"], json!({}));
        assert_eq!(out[2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(out[2]["content"][1]["tool_use_id"], "t2");
        assert_eq!(out[2]["content"][2]["text"], "guidance");
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
