//! Permission questions on the terminal, for `loom run` and `loom chat`:
//! asked one at a time in the order they come, answered from stdin, and
//! dropped when the run settles them first — the ask's own timeout, a
//! cancel — so a late answer never lands on the next question.

use std::collections::VecDeque;

use loom::{Event, EventKind, PermissionDecision, RunController};

use crate::lines::Lines;
use crate::permissions::{ask, parse_answer};
use crate::render::summarize_args;

/// Wrong answers before a question counts as "no".
const ATTEMPTS: u32 = 3;

/// The questions of one run.
pub(crate) struct Questions {
    queue: VecDeque<Question>,
    /// `--yes`: allow every request at once.
    yes: bool,
}

struct Question {
    request_id: String,
    tool: String,
    shown: String,
    attempts: u32,
}

impl Questions {
    pub(crate) fn new(yes: bool) -> Self {
        Self {
            queue: VecDeque::new(),
            yes,
        }
    }

    /// Whether a question waits for a line.
    pub(crate) fn waiting(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Takes in a run's event: a permission request is asked (or allowed at
    /// once with `--yes`); a request the run settled ends its question.
    pub(crate) fn on_event(&mut self, controller: &RunController, event: &Event, lines: &mut Lines) {
        match &event.kind {
            EventKind::PermissionRequest {
                request_id, tool, args, ..
            } => {
                let mut shown = format!("{tool}({})", summarize_args(args));
                if event.depth > 0 {
                    // A sub-agent asks: the same person answers, told who asks.
                    shown = format!("{shown} for a sub-agent (depth {})", event.depth);
                }
                if self.yes {
                    say!("  ? {shown}: allowed by --yes");
                    let _ = controller.respond_permission(request_id, PermissionDecision::Allow);
                    return;
                }
                lines.start();
                self.queue.push_back(Question {
                    request_id: request_id.clone(),
                    tool: tool.clone(),
                    shown,
                    attempts: 0,
                });
                if self.queue.len() == 1 {
                    self.ask_next();
                }
            }
            EventKind::PermissionResolved {
                request_id,
                reason: Some(reason),
                ..
            } => {
                let Some(position) = self.queue.iter().position(|q| &q.request_id == request_id) else {
                    return;
                };
                if let Some(question) = self.queue.remove(position) {
                    if position == 0 {
                        // The question is on the screen: end its line.
                        say!("");
                    }
                    if *reason == loom::event::Unanswered::Timeout {
                        say!("loom: no answer in time: {} was denied", question.tool);
                    }
                }
                if position == 0 {
                    self.ask_next();
                }
            }
            _ => {}
        }
    }

    /// Takes a line typed as the answer to the current question; `None`
    /// (end of input) answers "no" to every waiting question.
    pub(crate) fn on_line(&mut self, controller: &RunController, line: Option<String>) {
        let Some(line) = line else {
            for question in self.queue.drain(..) {
                let _ = controller.respond_permission(&question.request_id, PermissionDecision::Deny);
            }
            return;
        };
        let Some(question) = self.queue.front_mut() else {
            return;
        };
        let decision = match parse_answer(&line) {
            Ok(decision) => decision,
            Err(other) => {
                question.attempts += 1;
                say!("loom: '{other}' is not an answer");
                if question.attempts < ATTEMPTS {
                    ask(&question.shown);
                    return;
                }
                PermissionDecision::Deny
            }
        };
        if let Some(question) = self.queue.pop_front() {
            // The run may have settled it meanwhile; then nobody waits.
            let _ = controller.respond_permission(&question.request_id, decision);
        }
        self.ask_next();
    }

    fn ask_next(&self) {
        if let Some(question) = self.queue.front() {
            ask(&question.shown);
        }
    }
}
