//! Guidance (feedback, the monitor's warnings, the final-answer
//! instruction): written for the next model request only, never stored in
//! the history, so a long run does not pile up reminders and a provider
//! that takes one system message only never sees a second one. All parts
//! for one request travel as one block ([`crate::llm::LlmRequest::guidance`]);
//! the driver announces each with `guidance.injected` when the request is made.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::feedback::{analyze, DefaultGuidance, GuidanceReason, TaskHandler};
use crate::tool_result::ToolResult;

/// Added to the final-answer instruction: what the model must do now.
pub(crate) const FINAL_ANSWER_SUFFIX: &str =
    "Do not call any more tools. Using only the information you already have, \
give your best final answer now, and say briefly what remains unfinished, if anything.";

/// Guidance of a retry after an empty answer.
pub(crate) const EMPTY_ANSWER_NUDGE: &str = "Your last reply was empty. Reply now: answer the user's request in text, \
or call a tool if you need one.";

/// Guidance of a request that continues an answer cut off by the output limit.
pub(crate) const CONTINUE_ANSWER: &str = "Your previous reply was cut off because it reached the output token limit. \
Continue exactly where it stopped, without repeating anything; do not start over.";

/// One piece of guidance and why it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GuidancePart {
    /// Why it was written.
    pub reason: GuidanceReason,
    /// The text.
    pub content: String,
}

impl GuidancePart {
    pub(crate) fn new(reason: GuidanceReason, content: impl Into<String>) -> Self {
        Self {
            reason,
            content: content.into(),
        }
    }
}

/// The feedback on a turn's results, from the first task handler that
/// knows the task, or the default (which speaks only when a call failed).
/// `depth` is the number of the turn that follows.
pub(crate) fn feedback(
    handlers: &[Arc<dyn TaskHandler>],
    task: &str,
    results: &[ToolResult],
    depth: u32,
) -> Option<GuidancePart> {
    let analysis = analyze(results);
    match handlers.iter().find(|handler| handler.can_handle(task)) {
        Some(handler) => handler
            .generate_guidance(task, &analysis, depth)
            .map(|content| GuidancePart::new(GuidanceReason::TaskHandler, content)),
        None => {
            let reason = DefaultGuidance::reason(&analysis)?;
            DefaultGuidance
                .generate_guidance(task, &analysis, depth)
                .map(|content| GuidancePart::new(reason, content))
        }
    }
}

/// One block of guidance for a request: the parts joined by blank lines.
pub(crate) fn block(parts: &[GuidancePart]) -> Option<String> {
    if parts.is_empty() {
        return None;
    }
    let mut block = String::new();
    for part in parts {
        if !block.is_empty() {
            block.push_str("\n\n");
        }
        block.push_str(&part.content);
    }
    Some(block)
}
