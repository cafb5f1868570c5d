//! Phase 4 of a turn: guidance for the next turn from the tool results.

use crate::event::{EventKind, TurnIds};
use crate::feedback::{analyze, depth_hint, DefaultGuidance, TaskHandler};
use crate::message::Message;
use crate::tool_result::ToolResult;
use crate::turn_state::TurnState;

use super::Run;

impl Run {
    /// The guidance messages after a tool turn, each announced.
    pub(crate) fn guidance(&mut self, results: &[ToolResult], state: &TurnState, turn: &TurnIds) -> Vec<Message> {
        let engine = self.engine.clone();
        if !engine.context.feedback {
            return Vec::new();
        }
        let analysis = analyze(results);
        let depth = state.turn_counter() + 1;
        let mut out = Vec::new();
        let handler: Option<&dyn TaskHandler> = engine
            .context
            .task_handlers
            .iter()
            .map(|h| h.as_ref())
            .find(|h| h.can_handle(&self.task));
        let (reason, guidance) = match handler {
            Some(handler) => ("task_handler", handler.generate_guidance(&self.task, &analysis, depth)),
            None => (
                DefaultGuidance::reason(&analysis, depth),
                DefaultGuidance.generate_guidance(&self.task, &analysis, depth),
            ),
        };
        if let Some(content) = guidance {
            self.events.emit(
                turn,
                EventKind::GuidanceInjected {
                    reason: reason.to_string(),
                    content: content.clone(),
                },
            );
            out.push(Message::system(content));
        }
        if let Some(hint) = depth_hint(state.turn_counter(), state.max_iterations()) {
            self.events.emit(
                turn,
                EventKind::GuidanceInjected {
                    reason: "depth_hint".to_string(),
                    content: hint.clone(),
                },
            );
            out.push(Message::system(hint));
        }
        out
    }
}
