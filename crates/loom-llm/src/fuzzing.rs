//! Entry points for the fuzz targets (bench/fuzz): a provider's stream
//! parser fed through the SSE decoder as its transport feeds it, without
//! HTTP or a runtime (every piece is there at once). Not a stable API.

use std::convert::Infallible;

use eventsource_stream::Eventsource;
use futures_util::stream::{self, StreamExt};
use futures_util::FutureExt;
use loom_core::{FinishReason, LlmChunk, LlmError, LlmStream};

use crate::anthropic::AnthropicParser;
use crate::openai::OpenAiParser;
use crate::text_tools::TextToolCalls;
use crate::transport::StreamParser;

/// Whose stream.
#[derive(Debug, Clone, Copy)]
pub enum Provider {
    /// Chat completions.
    OpenAi,
    /// The Messages API.
    Anthropic,
}

/// Feeds `pieces` — a response body as the network split it — through the
/// SSE decoder and `provider`'s parser: every chunk, then the first error
/// if there was one (it ends the stream, as in a run).
pub fn parse_stream(provider: Provider, pieces: Vec<Vec<u8>>) -> Vec<Result<LlmChunk, LlmError>> {
    match provider {
        Provider::OpenAi => drive(OpenAiParser::default(), pieces),
        Provider::Anthropic => drive(AnthropicParser::default(), pieces),
    }
}

fn drive<P: StreamParser>(mut parser: P, pieces: Vec<Vec<u8>>) -> Vec<Result<LlmChunk, LlmError>> {
    // The transport's closing blank line, as in `Transport::open`.
    let bytes = stream::iter(pieces.into_iter().chain([b"\n\n".to_vec()]).map(Ok::<_, Infallible>));
    let mut events = bytes.eventsource();
    let mut out = Vec::new();
    loop {
        // Every piece is ready: the decoder never waits.
        let Some(next) = events.next().now_or_never() else {
            out.push(Err(LlmError::Protocol("the decoder waited on a ready stream".into())));
            return out;
        };
        let step = match next {
            Some(Ok(event)) => parser.event(&event.event, &event.data),
            Some(Err(err)) => Err(LlmError::Protocol(err.to_string())),
            None => {
                push(&mut out, parser.end());
                return out;
            }
        };
        if !push(&mut out, step) {
            return out;
        }
    }
}

/// Adds a step's chunks, or its error; false after an error.
fn push(out: &mut Vec<Result<LlmChunk, LlmError>>, step: Result<Vec<LlmChunk>, LlmError>) -> bool {
    match step {
        Ok(chunks) => {
            out.extend(chunks.into_iter().map(Ok));
            true
        }
        Err(err) => {
            out.push(Err(err));
            false
        }
    }
}

/// Text as a text-only model streams it, in `pieces`, read for
/// `<tool_call>` blocks ([`TextToolCalls`]), then its end.
pub fn text_tool_calls(pieces: Vec<String>) -> Vec<Result<LlmChunk, LlmError>> {
    let chunks = pieces
        .into_iter()
        .map(|text| Ok(LlmChunk::Text(text)))
        .chain([Ok(LlmChunk::Finish(FinishReason::Stop))]);
    let inner: LlmStream = stream::iter(chunks).boxed();
    let mut calls = TextToolCalls::wrap(inner);
    let mut out = Vec::new();
    while let Some(Some(item)) = calls.next().now_or_never() {
        out.push(item);
    }
    out
}
