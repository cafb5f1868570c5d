//! Compression as one call: plan the cut, ask a model for the summary, and
//! fall back without a model when that fails or does not fit.

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::llm::{Llm, LlmChunk, LlmRequest, Usage};
use crate::message::Message;
use crate::tokens::TokenCounter;

use super::compress::{fallback, format_summary, plan, splice, summarizer_request};
use super::MemoryConfig;

/// Share of the window the summarizer's own request may use.
const SUMMARIZER_INPUT_SHARE: f64 = 0.6;

crate::wire::wire_enum! {
    /// How a history was compressed, as named in `compression.applied`.
    pub enum CompressionMethod {
        /// A model wrote the eight-section summary of the older part.
        Summary = "summary",
        /// No model: old tool outputs and turns were dropped.
        Fallback = "fallback",
    }
}

/// How compression went.
#[derive(Debug, Clone, PartialEq)]
pub struct Compressed {
    /// The new history.
    pub messages: Vec<Message>,
    /// Summary or fallback.
    pub method: CompressionMethod,
    /// Tokens the summarizer used, when it answered.
    pub usage: Option<Usage>,
    /// Why the summary was not used (an error code), when it was not.
    pub failure: Option<String>,
    /// Whether the summarizer was called.
    pub summarizer_called: bool,
}

/// Compresses `messages` to fit `budget` tokens: the eight-section summary
/// of the older part by `summarizer`, or the model-free fallback.
pub async fn compress_history(
    messages: &[Message],
    summarizer: &dyn Llm,
    counter: &dyn TokenCounter,
    config: &MemoryConfig,
    budget: usize,
    cancel: &CancellationToken,
) -> Compressed {
    let without_model = |failure: Option<String>, summarizer_called: bool| Compressed {
        messages: fallback(messages, counter, budget),
        method: CompressionMethod::Fallback,
        usage: None,
        failure,
        summarizer_called,
    };
    let Some(plan) = plan(messages, config.keep_recent_messages) else {
        return without_model(None, false);
    };
    let input_budget = (config.context_window as f64 * SUMMARIZER_INPUT_SHARE) as usize;
    let request = summarizer_request(messages, &plan, counter, input_budget);
    let (answer, usage) = match summarize(summarizer, &request, cancel).await {
        Ok(answer) => answer,
        Err(code) => return without_model(Some(code), true),
    };
    if answer.trim().is_empty() {
        return without_model(Some("SUMMARY_EMPTY".to_string()), true);
    }
    let spliced = splice(messages, &plan, format_summary(&answer));
    if counter.count_messages(&spliced) <= budget {
        return Compressed {
            messages: spliced,
            method: CompressionMethod::Summary,
            usage,
            failure: None,
            summarizer_called: true,
        };
    }
    // Still too large: cut further without a model.
    Compressed {
        messages: fallback(&spliced, counter, budget),
        method: CompressionMethod::Fallback,
        usage,
        failure: None,
        summarizer_called: true,
    }
}

/// The summarizer's text (never streamed to the user) and its usage.
async fn summarize(
    llm: &dyn Llm,
    request: &[Message],
    cancel: &CancellationToken,
) -> Result<(String, Option<Usage>), String> {
    let mut stream = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err("CANCELLED".to_string()),
        stream = llm.stream(LlmRequest::new(request, &[])) => stream.map_err(|e| e.code().to_string())?,
    };
    let mut text = String::new();
    let mut usage = None;
    loop {
        let chunk = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err("CANCELLED".to_string()),
            chunk = stream.next() => chunk,
        };
        match chunk {
            None => return Ok((text, usage)),
            Some(Err(err)) => return Err(err.code().to_string()),
            Some(Ok(LlmChunk::Text(piece))) => text.push_str(&piece),
            Some(Ok(LlmChunk::Usage(reported))) => usage = Some(reported),
            Some(Ok(_)) => {}
        }
    }
}
