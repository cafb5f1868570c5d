//! Repairing a history a process left behind when it died.
//!
//! With a store, a turn's tool calls are checkpointed before any of them
//! runs, so a crash mid-tools leaves a history ending in an assistant
//! message whose calls have no results. No provider accepts that. Each such
//! call is settled from the tool journal:
//!
//! - its result was journaled → that result is used (nothing is lost);
//! - its intent was journaled without a result → it may have taken effect,
//!   so it is not run again: the model is told it was interrupted and its
//!   effect is unknown;
//! - it is not in the journal → it never started (a call that is not
//!   read-only is journaled before it runs) or it is read-only, so running
//!   it again is safe;
//! - its journaled result says it was stopped before its tool started
//!   ([`ErrorKind::NotStarted`], an interrupt just after the intent)
//!   → it had no effect, so it runs.

pub use crate::history::dangling_calls;
use crate::message::{Message, ToolCall};
use crate::store::JournalEntry;
use crate::tool_result::{ErrorKind, ToolResult, ToolStatus};

/// How one dangling call is settled.
#[derive(Debug, Clone, PartialEq)]
pub enum CallRepair {
    /// The journal holds its result.
    Recorded(ToolResult),
    /// It started and its effect is unknown: this synthesized result.
    Interrupted(ToolResult),
    /// It never started, or is read-only: run it (again).
    Rerun(ToolCall),
    /// The journal holds its result, and the run's event log told it
    /// before the crash (the checkpoint that would hold it was not
    /// written): the result is reused and not told again.
    Told(ToolResult),
}

impl CallRepair {
    /// The call this settles.
    pub fn call_id(&self) -> &str {
        match self {
            Self::Recorded(result) | Self::Interrupted(result) | Self::Told(result) => &result.call_id,
            Self::Rerun(call) => &call.id,
        }
    }
}

/// How each of `calls` is settled, in call order.
pub fn plan(calls: &[ToolCall], journal: &[JournalEntry]) -> Vec<CallRepair> {
    plan_resuming(calls, journal, |_| false)
}

/// Like [`plan`], where a call that started without a recorded result is
/// run again when `resumable` says its tool continues its own work (see
/// [`crate::tool::Tool::resumable`]).
pub fn plan_resuming(
    calls: &[ToolCall],
    journal: &[JournalEntry],
    resumable: impl Fn(&ToolCall) -> bool,
) -> Vec<CallRepair> {
    calls
        .iter()
        .map(|call| match journal.iter().find(|entry| entry.call.id == call.id) {
            // Stopped before its tool started (an interrupt between the
            // journal's intent and the start): it had no effect, run it.
            Some(JournalEntry {
                result: Some(result), ..
            }) if result.metadata.error_kind == Some(ErrorKind::NotStarted) => CallRepair::Rerun(call.clone()),
            Some(JournalEntry {
                result: Some(result), ..
            }) => CallRepair::Recorded(result.clone()),
            Some(JournalEntry { result: None, .. }) if resumable(call) => CallRepair::Rerun(call.clone()),
            Some(JournalEntry { result: None, .. }) => CallRepair::Interrupted(interrupted_result(call)),
            None => CallRepair::Rerun(call.clone()),
        })
        .collect()
}

/// The result the model gets for a call that started but whose outcome was
/// never recorded.
pub fn interrupted_result(call: &ToolCall) -> ToolResult {
    ToolResult::new(
        &call.id,
        &call.name,
        ToolStatus::Error,
        format!(
            "Error: this call of {} was interrupted — the agent's process stopped (crash, kill or reboot) \
             after the call started and before its result was recorded. It may or may not have taken effect. \
             It was not run again automatically: check the current state before repeating it.",
            call.name
        ),
    )
    .with_error_kind(ErrorKind::Interrupted)
}

/// The result for a call that never ran to completion and is not run now
/// (continuing a session from a run that was interrupted).
pub fn not_run_result(call: &ToolCall) -> ToolResult {
    ToolResult::new(
        &call.id,
        &call.name,
        ToolStatus::Error,
        "Error: this call did not complete because the run was interrupted, and it changed nothing. \
         Call it again if you still need it.",
    )
    .with_error_kind(ErrorKind::Interrupted)
}

/// Closes every dangling call at the end of `messages` without running
/// anything: journaled results are used, the rest get synthesized results.
/// Used to continue a session from an earlier run that never finished.
pub fn close_dangling(messages: &mut Vec<Message>, journal: &[JournalEntry]) {
    let calls = dangling_calls(messages);
    for repair in plan(&calls, journal) {
        let result = match repair {
            CallRepair::Recorded(result) | CallRepair::Interrupted(result) | CallRepair::Told(result) => result,
            CallRepair::Rerun(call) => not_run_result(&call),
        };
        messages.push(Message::tool(&result.call_id, &result.name, &result.content));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::validate_history;
    use serde_json::json;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments: json!({}),
        }
    }

    fn history(calls: Vec<ToolCall>) -> Vec<Message> {
        vec![
            Message::system("s"),
            Message::user("u"),
            Message::Assistant {
                content: String::new(),
                tool_calls: calls,
            },
        ]
    }

    #[test]
    fn journaled_results_are_reused_started_calls_interrupted_others_rerun() {
        let calls = vec![call("a", "write_file"), call("b", "write_file"), call("c", "read_file")];
        let done = ToolResult::new("a", "write_file", ToolStatus::Success, "wrote 3 bytes");
        let journal = vec![
            JournalEntry {
                call: calls[0].clone(),
                result: Some(done.clone()),
            },
            JournalEntry {
                call: calls[1].clone(),
                result: None,
            },
        ];
        let repairs = plan(&dangling_calls(&history(calls.clone())), &journal);
        assert_eq!(repairs[0], CallRepair::Recorded(done));
        let CallRepair::Interrupted(interrupted) = &repairs[1] else {
            panic!("expected interrupted: {repairs:?}");
        };
        assert_eq!(interrupted.metadata.error_kind, Some(ErrorKind::Interrupted));
        assert!(interrupted.content.contains("may or may not have taken effect"));
        assert_eq!(repairs[2], CallRepair::Rerun(calls[2].clone()));
    }

    #[test]
    fn a_started_call_of_a_resumable_tool_runs_again_and_others_stay_interrupted() {
        let calls = vec![call("a", "task"), call("b", "write_file")];
        let journal: Vec<JournalEntry> = calls
            .iter()
            .map(|call| JournalEntry {
                call: call.clone(),
                result: None,
            })
            .collect();
        let repairs = plan_resuming(&calls, &journal, |call| call.name == "task");
        assert_eq!(repairs[0], CallRepair::Rerun(calls[0].clone()));
        assert!(matches!(repairs[1], CallRepair::Interrupted(_)));
    }

    #[test]
    fn a_call_stopped_before_its_tool_started_runs_on_resume() {
        let calls = vec![call("a", "write_file")];
        let stopped = crate::pipeline::ToolPipeline::cancelled(&calls[0]);
        let journal = vec![JournalEntry {
            call: calls[0].clone(),
            result: Some(stopped),
        }];
        assert_eq!(
            plan(&dangling_calls(&history(calls.clone())), &journal),
            vec![CallRepair::Rerun(calls[0].clone())]
        );
    }

    #[test]
    fn answered_calls_are_not_dangling() {
        let mut messages = history(vec![call("a", "x"), call("b", "y")]);
        messages.push(Message::tool("a", "x", "ok"));
        assert_eq!(dangling_calls(&messages), vec![call("b", "y")]);
        messages.push(Message::tool("b", "y", "ok"));
        assert!(dangling_calls(&messages).is_empty());
        assert!(dangling_calls(&[Message::user("hi")]).is_empty());
    }

    #[test]
    fn closing_makes_the_history_provider_valid() {
        let calls = vec![call("a", "write_file"), call("b", "read_file")];
        let journal = vec![JournalEntry {
            call: calls[0].clone(),
            result: None,
        }];
        let mut messages = history(calls);
        assert!(validate_history(&messages, false).is_err());
        close_dangling(&mut messages, &journal);
        validate_history(&messages, false).unwrap();
        assert_eq!(messages.len(), 5);
    }
}
