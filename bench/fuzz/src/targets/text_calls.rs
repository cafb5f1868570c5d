//! A text-only model's answer read for `<tool_call>` blocks: every byte of
//! text outside the blocks comes out as text, in order; each block becomes
//! one call with a name (or an error the model reads), and the stream ends
//! with exactly one finish.

use loom_core::{FinishReason, LlmChunk};
use loom_llm::fuzzing::text_tool_calls;

use crate::pieces::cut_text;

pub fn run(data: &[u8]) {
    let pieces = cut_text(data);
    let whole: String = pieces.concat();
    let out = text_tool_calls(pieces);
    let mut text = String::new();
    let mut finishes = 0;
    let mut calls = 0;
    for item in &out {
        match item {
            Ok(LlmChunk::Text(piece)) => text.push_str(piece),
            Ok(LlmChunk::ToolCallDelta { name, .. }) => {
                calls += 1;
                assert!(name.is_some(), "a call without a name: {out:?}");
            }
            Ok(LlmChunk::Finish(reason)) => {
                finishes += 1;
                if calls > 0 {
                    assert_eq!(*reason, FinishReason::ToolCalls, "{out:?}");
                }
            }
            Ok(LlmChunk::Usage(_) | LlmChunk::Model(_)) | Err(_) => {}
        }
    }
    assert_eq!(finishes, 1, "{out:?}");
    // Text is never invented: what comes out as text was in the answer.
    assert!(text.len() <= whole.len(), "{text:?} from {whole:?}");
    if !whole.contains("<tool_call>") {
        assert_eq!(text, whole, "text without a block must pass unchanged");
    }
}
