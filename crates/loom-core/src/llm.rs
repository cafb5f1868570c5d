//! The `Llm` trait: how the engine talks to a model, whatever the provider.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures_core::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::codes::ErrorCode;
use crate::message::Message;

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// One model call: the conversation so far and the tools on offer.
/// Borrowed so a long history is never copied to make a request.
#[derive(Debug, Clone, Copy)]
pub struct LlmRequest<'a> {
    /// The messages, system prompt first.
    pub messages: &'a [Message],
    /// Tools the model may call; empty to demand a plain answer.
    pub tools: &'a [ToolSpec],
    /// Guidance for this request only (feedback, warnings, the final-answer
    /// instruction): never part of the history, at most one block. Each
    /// provider places it as its [`GuidancePlacement`] says.
    pub guidance: Option<&'a str>,
    /// The answer must call a tool (`tool_choice: "required"`, Anthropic's
    /// `{"type": "any"}`): asked when an answer was sent back for work the
    /// model did not do (docs/context.md), so that a model that ignores the
    /// guidance's words is held to it by its server. Only with tools.
    pub require_tool_call: bool,
    /// Ask for the whole answer at once, not streamed: the request after a
    /// streamed answer broke off mid-way (llama.cpp's streaming tool-call
    /// parser fails on answers its one-shot parser reads). A provider that
    /// always streams, or never does, may ignore it.
    pub unstreamed: bool,
}

impl<'a> LlmRequest<'a> {
    /// A request without guidance.
    pub fn new(messages: &'a [Message], tools: &'a [ToolSpec]) -> Self {
        Self {
            messages,
            tools,
            guidance: None,
            require_tool_call: false,
            unstreamed: false,
        }
    }

    /// The same request, asking for its answer at once when `unstreamed`.
    pub fn with_unstreamed(self, unstreamed: bool) -> Self {
        Self { unstreamed, ..self }
    }

    /// The same request carrying `guidance`.
    pub fn with_guidance(self, guidance: Option<&'a str>) -> Self {
        Self { guidance, ..self }
    }

    /// The same request, its answer required to call a tool (when it offers any).
    pub fn with_tool_call_required(self, required: bool) -> Self {
        Self {
            require_tool_call: required && !self.tools.is_empty(),
            ..self
        }
    }

    /// Where an inline reminder goes: the index of the last message when it
    /// is a tool result or a user message, `None` when a new user message
    /// must carry it (the conversation ends with an assistant message).
    pub fn reminder_target(&self) -> Option<usize> {
        match self.messages.last() {
            Some(Message::Tool { .. } | Message::User { .. }) => Some(self.messages.len() - 1),
            _ => None,
        }
    }
}

/// Where a request's guidance goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuidancePlacement {
    /// A system message after the conversation: for providers that accept a
    /// system message anywhere (the official OpenAI API).
    System,
    /// A marked reminder ([`reminder`]) at the end of the last tool or user
    /// message: for providers and chat templates that take one system
    /// message only, at the start (Anthropic; vLLM, llama.cpp and Ollama
    /// serving Mistral, Gemma and others).
    Inline,
}

impl std::str::FromStr for GuidancePlacement {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "system" => Ok(Self::System),
            "inline" => Ok(Self::Inline),
            other => Err(format!(
                "'{other}' is not a guidance placement: use \"system\" or \"inline\""
            )),
        }
    }
}

/// Guidance as an inline reminder: marked, so the model tells it apart from
/// the tool's output or the person's words, and so can anyone reading a
/// request body.
pub fn reminder(guidance: &str) -> String {
    format!("{REMINDER_OPEN}\n{guidance}\n{REMINDER_CLOSE}")
}

/// Opens an inline reminder.
pub const REMINDER_OPEN: &str = "<system-reminder>";
/// Closes an inline reminder.
pub const REMINDER_CLOSE: &str = "</system-reminder>";

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache, when it said
    /// (OpenAI counts them in `input_tokens` too; Anthropic does not).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_input_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache, when it said.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_creation_input_tokens: u64,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// Why the model stopped producing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of the answer.
    Stop,
    /// The model wants tools run.
    ToolCalls,
    /// The output token limit was hit.
    Length,
    /// The provider filtered the content.
    ContentFilter,
    /// Anything else the provider said.
    Other(String),
}

impl FinishReason {
    /// The reason as a plain string.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::Length => "length",
            Self::ContentFilter => "content_filter",
            Self::Other(other) => other,
        }
    }
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmChunk {
    /// New text of the answer.
    Text(String),
    /// A piece of tool call number `index`. The id and name usually come with
    /// the first piece; argument text is concatenated across pieces.
    ToolCallDelta {
        /// Position of the call in the model's list.
        index: usize,
        /// The call id, when this piece carries it.
        id: Option<String>,
        /// The tool name, when this piece carries it.
        name: Option<String>,
        /// More argument JSON text.
        arguments: String,
    },
    /// Token counts.
    Usage(Usage),
    /// The model that answered, as the provider named it (it may name a
    /// dated version of the model asked for).
    Model(String),
    /// The model stopped.
    Finish(FinishReason),
}

/// A stream of answer pieces. Dropping it aborts the call.
pub type LlmStream = Pin<Box<dyn Stream<Item = Result<LlmChunk, LlmError>> + Send>>;

/// Everything that can go wrong with a model call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The provider is rate limiting us.
    #[error("rate limited: {message}")]
    RateLimited {
        /// The provider's words.
        message: String,
        /// When to try again, if the provider said.
        retry_after: Option<Duration>,
    },
    /// The request does not fit the model's context window.
    #[error("context length exceeded: {0}")]
    ContextLengthExceeded(String),
    /// The API key is missing, wrong or lacks access.
    #[error("authentication failed: {0}")]
    Authentication(String),
    /// The provider refused the request as malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The provider failed.
    #[error("server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// The provider's words.
        message: String,
    },
    /// No answer in time.
    #[error("model call timed out: {0}")]
    Timeout(String),
    /// The connection failed or broke.
    #[error("connection failed: {0}")]
    Connection(String),
    /// The stream did not follow the provider's protocol (or ended early).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A scripted model has played every turn of its script.
    #[error(
        "the scripted model has no turn left: all {played} turns of {script} were played; add a turn to the script"
    )]
    ScriptExhausted {
        /// Turns played.
        played: usize,
        /// Where the script came from.
        script: String,
    },
    /// The request broke a rule the provider enforces (e.g. message order).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl LlmError {
    /// The code used in `error` events.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::RateLimited { .. } => ErrorCode::LlmRateLimited,
            Self::ContextLengthExceeded(_) => ErrorCode::LlmContextLength,
            Self::Authentication(_) => ErrorCode::LlmAuth,
            Self::BadRequest(_) => ErrorCode::LlmBadRequest,
            Self::Server { .. } => ErrorCode::LlmServer,
            Self::Timeout(_) => ErrorCode::LlmTimeout,
            Self::Connection(_) => ErrorCode::LlmConnection,
            Self::Protocol(_) => ErrorCode::LlmProtocol,
            Self::ScriptExhausted { .. } => ErrorCode::ScriptExhausted,
            Self::InvalidRequest(_) => ErrorCode::LlmInvalidRequest,
        }
    }
}

/// A model behind a provider. Implementations turn a request into a stream
/// of chunks; the engine assembles them, emits events and handles cancel.
#[async_trait]
pub trait Llm: Send + Sync {
    /// The model as `provider:name` (shown in events).
    fn model_name(&self) -> &str;

    /// Starts one call. The returned stream must not borrow the request.
    async fn stream(&self, request: LlmRequest<'_>) -> Result<LlmStream, LlmError>;
}
