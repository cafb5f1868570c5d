//! The ordering rules that every provider enforces on a conversation.
//!
//! OpenAI and Anthropic both reject a request in which an assistant message
//! with tool calls is not followed, before anything else, by exactly one tool
//! message per call id. Loom checks the rule on its own histories (tests, the
//! scripted model) so a violation is caught here rather than by a provider.

use std::collections::HashSet;

use crate::message::{Message, ToolCall};

/// Why a history would be rejected by a provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// A tool message answers an id that the preceding assistant message did not ask for.
    #[error("message {index}: tool result for unknown or already answered call id '{call_id}'")]
    UnexpectedToolResult {
        /// Position of the offending message.
        index: usize,
        /// The call id it answers.
        call_id: String,
    },
    /// Tool results came in a different order than the calls.
    #[error("message {index}: tool result '{found}' arrived where '{expected}' was expected (results must follow call order)")]
    OutOfOrder {
        /// Position of the offending message.
        index: usize,
        /// The id that should have been answered here.
        expected: String,
        /// The id that was answered.
        found: String,
    },
    /// Another message arrived before every call was answered.
    #[error("message {index}: a {role} message arrived before tool call '{call_id}' was answered")]
    MissingToolResult {
        /// Position of the message that interrupted the results.
        index: usize,
        /// Its role.
        role: &'static str,
        /// The first unanswered call id.
        call_id: String,
    },
    /// Two calls of one assistant message share an id.
    #[error("message {index}: duplicate tool call id '{call_id}'")]
    DuplicateCallId {
        /// Position of the assistant message.
        index: usize,
        /// The repeated id.
        call_id: String,
    },
}

/// A run's conversation without its system prompt, which each run writes
/// anew: what the next run of the session continues from.
pub fn without_system_prompt(mut messages: Vec<Message>) -> Vec<Message> {
    if matches!(messages.first(), Some(Message::System { .. })) {
        messages.remove(0);
    }
    messages
}

/// The tool calls at the end of `messages` that have no result yet.
pub fn dangling_calls(messages: &[Message]) -> Vec<ToolCall> {
    let Some(position) = messages
        .iter()
        .rposition(|message| matches!(message, Message::Assistant { .. }))
    else {
        return Vec::new();
    };
    let answered: HashSet<&str> = messages[position + 1..]
        .iter()
        .filter_map(|message| match message {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    messages[position]
        .tool_calls()
        .iter()
        .filter(|call| !answered.contains(call.id.as_str()))
        .cloned()
        .collect()
}

/// Checks that after each assistant message with tool calls there is exactly
/// one tool message per call id, in call order, before any other message.
/// A history may end with calls still unanswered only if `allow_pending_tail`.
pub fn validate_history(messages: &[Message], allow_pending_tail: bool) -> Result<(), HistoryError> {
    let mut pending: Vec<&str> = Vec::new();
    let mut next = 0usize;
    for (index, message) in messages.iter().enumerate() {
        match message {
            Message::Tool { tool_call_id, .. } => match pending.get(next) {
                Some(expected) if *expected == tool_call_id => next += 1,
                Some(expected) if pending[next..].contains(&tool_call_id.as_str()) => {
                    return Err(HistoryError::OutOfOrder {
                        index,
                        expected: (*expected).to_string(),
                        found: tool_call_id.clone(),
                    })
                }
                _ => {
                    return Err(HistoryError::UnexpectedToolResult {
                        index,
                        call_id: tool_call_id.clone(),
                    })
                }
            },
            other => {
                if let Some(missing) = pending.get(next) {
                    return Err(HistoryError::MissingToolResult {
                        index,
                        role: other.role(),
                        call_id: (*missing).to_string(),
                    });
                }
                pending.clear();
                next = 0;
                let calls = other.tool_calls();
                let mut seen = HashSet::with_capacity(calls.len());
                for call in calls {
                    if !seen.insert(call.id.as_str()) {
                        return Err(HistoryError::DuplicateCallId {
                            index,
                            call_id: call.id.clone(),
                        });
                    }
                    pending.push(call.id.as_str());
                }
            }
        }
    }
    match pending.get(next) {
        Some(missing) if !allow_pending_tail => Err(HistoryError::MissingToolResult {
            index: messages.len(),
            role: "end of history",
            call_id: (*missing).to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: json!({}),
        }
    }

    fn asks(ids: &[&str]) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        }
    }

    #[test]
    fn accepts_answered_calls_in_order() {
        let h = vec![
            Message::system("s"),
            Message::user("q"),
            asks(&["a", "b"]),
            Message::tool("a", "t", "1"),
            Message::tool("b", "t", "2"),
            Message::system("guidance"),
            Message::assistant("done"),
        ];
        assert_eq!(validate_history(&h, false), Ok(()));
    }

    #[test]
    fn rejects_reordered_missing_and_unknown_results() {
        let reordered = vec![
            asks(&["a", "b"]),
            Message::tool("b", "t", ""),
            Message::tool("a", "t", ""),
        ];
        assert!(matches!(
            validate_history(&reordered, false),
            Err(HistoryError::OutOfOrder { .. })
        ));
        let missing = vec![asks(&["a", "b"]), Message::tool("a", "t", ""), Message::system("x")];
        assert!(matches!(
            validate_history(&missing, false),
            Err(HistoryError::MissingToolResult { .. })
        ));
        let unknown = vec![Message::user("q"), Message::tool("zz", "t", "")];
        assert!(matches!(
            validate_history(&unknown, false),
            Err(HistoryError::UnexpectedToolResult { .. })
        ));
        let tail = vec![asks(&["a"])];
        assert!(validate_history(&tail, false).is_err());
        assert!(validate_history(&tail, true).is_ok());
    }
}
