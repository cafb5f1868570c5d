//! Guidance (seed 003's feedback, the monitor's warnings, the final-answer
//! instruction): written for the next model request only, never stored in
//! the history, so a long run does not pile up reminders and a provider
//! that takes one system message only never sees a second one. All parts
//! for one request travel as one block ([`crate::llm::LlmRequest::guidance`]);
//! each part is announced with `guidance.injected` when the request is made.

use crate::event::{EventKind, TurnIds};
use crate::feedback::{analyze, DefaultGuidance, TaskHandler};
use crate::tool_result::ToolResult;
use crate::turn_state::TurnState;

use super::Run;

/// One piece of guidance and why it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuidancePart {
    /// As reported in `guidance.injected` (`error`, `iteration_warning`, `max_steps`, …).
    pub reason: String,
    /// The text.
    pub content: String,
}

impl GuidancePart {
    pub(crate) fn new(reason: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            content: content.into(),
        }
    }
}

impl Run {
    /// The feedback on a turn's results, from the first task handler that
    /// knows the task, or the default (which speaks only when a call failed).
    pub(crate) fn feedback(&self, results: &[ToolResult], state: &TurnState) -> Option<GuidancePart> {
        let analysis = analyze(results);
        let depth = state.turn_counter() + 1;
        let handler = self
            .engine
            .context
            .task_handlers
            .iter()
            .find(|handler| handler.can_handle(&self.task));
        match handler {
            Some(handler) => handler
                .generate_guidance(&self.task, &analysis, depth)
                .map(|content| GuidancePart::new("task_handler", content)),
            None => {
                let reason = DefaultGuidance::reason(&analysis)?;
                DefaultGuidance
                    .generate_guidance(&self.task, &analysis, depth)
                    .map(|content| GuidancePart::new(reason, content))
            }
        }
    }

    /// The guidance block of the next request: what the last turn left
    /// (feedback, warnings) and `extra` (this call's own instruction), each
    /// announced. `None` when there is nothing to say.
    pub(crate) fn take_guidance(&mut self, turn: &TurnIds, extra: Option<GuidancePart>) -> Option<String> {
        let mut parts = std::mem::take(&mut self.guidance);
        parts.extend(extra);
        if parts.is_empty() {
            return None;
        }
        let mut block = String::new();
        for part in parts {
            if !block.is_empty() {
                block.push_str("\n\n");
            }
            block.push_str(&part.content);
            self.events.emit(
                turn,
                EventKind::GuidanceInjected {
                    reason: part.reason,
                    content: part.content,
                },
            );
        }
        Some(block)
    }
}
