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
pub(crate) const EMPTY_ANSWER_NUDGE: &str = "Your last reply was empty. Reply now: go on with the task with a tool \
call, or answer in text if it is done.";

/// How much of the task a send-back repeats.
const RESTATED_TASK_CHARS: usize = 600;

/// A send-back's guidance followed by the task itself: a small model sent
/// back after a turn or two often forgets what it was asked ("Please
/// provide your request"), and the task, far up the history, is the first
/// thing it loses. A long task is cut (the whole stays in the history).
pub(crate) fn with_task(nudge: &str, task: &str) -> String {
    let task = task.trim();
    if task.is_empty() {
        return nudge.to_string();
    }
    let mut restated: String = task.chars().take(RESTATED_TASK_CHARS).collect();
    if restated.len() < task.len() {
        restated.push('…');
    }
    format!("{nudge}\n\nThe task you were given: {restated}")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_back_repeats_the_task_cut_when_long() {
        let short = with_task(EMPTY_ANSWER_NUDGE, "  fix calc.py \n");
        assert_eq!(
            short,
            format!("{EMPTY_ANSWER_NUDGE}\n\nThe task you were given: fix calc.py")
        );
        assert_eq!(with_task("nudge", " "), "nudge");
        let long = "é".repeat(RESTATED_TASK_CHARS + 5);
        let cut = with_task("nudge", &long);
        assert!(cut.ends_with('…'), "{cut}");
        assert_eq!(cut.chars().filter(|c| *c == 'é').count(), RESTATED_TASK_CHARS);
    }
}
