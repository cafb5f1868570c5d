//! Model providers behind Loom's [`loom_core::Llm`] trait.
//!
//! - [`openai`]: OpenAI-compatible chat completions (OpenAI, vLLM, Ollama,
//!   llama.cpp's server, LM Studio, DeepSeek…), streamed or not, with an
//!   opt-in mode that reads `<tool_call>` blocks from text.
//! - [`anthropic`]: the Anthropic Messages API.
//! - [`scripted`]: the scripted model (docs/library.md) for tests and demos, and
//!   [`recorder`], which writes any model's answers in that format.
//!
//! Every HTTP provider retries rate limits, server errors and broken
//! connections with backoff (honouring `Retry-After`) while nothing of the
//! answer has been streamed, times out connects, first bytes and silences,
//! stops calling a failing provider for a while (circuit breaker), and can
//! limit requests per minute. [`model_from_spec`] turns `provider:model`
//! into a model.

#![warn(missing_docs)]

pub mod anthropic;
#[doc(hidden)]
pub mod fuzzing;
pub mod openai;
pub mod recorder;
pub mod resilience;
pub mod scripted;
mod spec;
pub mod text_tools;
mod transport;
mod wire;

pub use anthropic::{AnthropicConfig, AnthropicModel};
pub use openai::{OpenAiConfig, OpenAiModel};
pub use recorder::Recorder;
pub use resilience::{Admission, BreakerSettings, BreakerState, CircuitBreaker, RateLimiter, RetryPolicy};
pub use scripted::{ScriptError, ScriptToolCall, ScriptTurn, ScriptUsage, ScriptedModel};
pub use spec::{model_from_spec, model_from_spec_with, ModelSpecError, ProviderOptions};
pub use transport::HttpSettings;
