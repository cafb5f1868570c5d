//! A provider's SSE body, cut anywhere, through the SSE decoder and its
//! parser. Whatever arrives, the parser answers chunks or one typed error:
//! it never panics, and never makes more chunks than the body has bytes
//! (each chunk needs at least one event, each event at least a line).

use loom_llm::fuzzing::{parse_stream, Provider};

use crate::pieces::cut;

/// OpenAI's chat completions.
pub fn openai(data: &[u8]) {
    check(Provider::OpenAi, data);
}

/// Anthropic's Messages API.
pub fn anthropic(data: &[u8]) {
    check(Provider::Anthropic, data);
}

fn check(provider: Provider, data: &[u8]) {
    let out = parse_stream(provider, cut(data));
    // A chunk per event at most a handful (text, a call, usage, finish),
    // an event per line at most.
    assert!(
        out.len() <= 4 * (data.len() + 2),
        "{} chunks from {} bytes",
        out.len(),
        data.len()
    );
    // One error ends the stream: nothing after it.
    if let Some(first_error) = out.iter().position(Result::is_err) {
        assert_eq!(first_error, out.len() - 1, "chunks after an error");
    }
}
