//! Structured compression (docs/context.md): the older part of the history becomes
//! one system message with eight sections, written by a model; the system
//! prompt, the user's latest request and the most recent messages stay as
//! they are. An assistant message with tool calls and its tool results are
//! never separated. Without a model (or when its summary does not help),
//! [`fallback`] drops the oldest tool outputs, then the oldest turns.

use crate::history::validate_history;
use crate::message::Message;
use crate::tokens::TokenCounter;

/// Starts the content of a compressed-history system message.
pub const SUMMARY_MARKER: &str = "[compressed history]";

/// The eight sections of a summary, in order.
pub const SECTIONS: [&str; 8] = [
    "Background context",
    "Key decisions",
    "Tool usage log",
    "User intent evolution",
    "Execution results",
    "Errors and solutions",
    "Open issues",
    "Future plans",
];

const SECTION_GUIDE: [&str; 8] = [
    "the project, the environment and working directory, the user's overall goal",
    "important choices made and why",
    "tools used, files read and changed, commands and their outcomes",
    "how the request changed, priorities, new requirements",
    "what was completed, files produced, checks passed",
    "problems met and how they were handled",
    "what is still unresolved, known limits",
    "the next steps",
];

/// Longest text of one message shown to the summarizer.
const MAX_CHARS_PER_MESSAGE: usize = 4_000;

/// Which part of a history is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionPlan {
    /// Messages at the start kept as they are (the system prompt).
    pub head: usize,
    /// Index of the first message kept at the end.
    pub cut: usize,
    /// The user's latest request when it falls in the compressed part.
    pub latest_user: Option<usize>,
}

/// Where to cut `messages` so about `keep_recent` messages stay, moving the
/// cut back so it never falls between a tool call and its results. `None`
/// when there is nothing worth compressing.
pub fn plan(messages: &[Message], keep_recent: usize) -> Option<CompressionPlan> {
    let head = usize::from(matches!(messages.first(), Some(Message::System { .. })));
    let mut cut = messages.len().saturating_sub(keep_recent.max(1)).max(head);
    while cut > head && matches!(messages[cut], Message::Tool { .. }) {
        cut -= 1;
    }
    if cut <= head {
        return None;
    }
    let kept_has_user = messages[cut..].iter().any(|m| matches!(m, Message::User { .. }));
    let latest_user = if kept_has_user {
        None
    } else {
        (head..cut).rev().find(|&i| matches!(messages[i], Message::User { .. }))
    };
    // Compressing only the request itself would gain nothing.
    let compressed = cut - head - usize::from(latest_user.is_some());
    (compressed > 0).then_some(CompressionPlan { head, cut, latest_user })
}

/// The history with the planned part replaced by `summary`.
pub fn splice(messages: &[Message], plan: &CompressionPlan, summary: Message) -> Vec<Message> {
    let mut out = Vec::with_capacity(plan.head + 2 + messages.len() - plan.cut);
    out.extend_from_slice(&messages[..plan.head]);
    out.push(summary);
    if let Some(index) = plan.latest_user {
        out.push(messages[index].clone());
    }
    out.extend_from_slice(&messages[plan.cut..]);
    out
}

/// The request that asks a model for the eight-section summary of
/// `messages[head..cut]`, bounded to about `max_tokens`.
pub fn summarizer_request(
    messages: &[Message],
    plan: &CompressionPlan,
    counter: &dyn TokenCounter,
    max_tokens: usize,
) -> Vec<Message> {
    let mut instructions = String::from(
        "You compress the history of an agent's conversation so the work can go on in a smaller context. \
         Write a summary with exactly these eight sections, as markdown headings in this order, each a few \
         short bullet points (write \"- none\" when a section has nothing). Keep file paths, names, numbers, \
         decisions and errors exactly; leave out pleasantries.\n",
    );
    for (index, (section, guide)) in SECTIONS.iter().zip(SECTION_GUIDE).enumerate() {
        instructions.push_str(&format!("\n## {}. {section}\n({guide})", index + 1));
    }
    let mut transcript = String::new();
    let mut budget = max_tokens;
    // Newest first, so the most recent history is the last to be left out.
    let mut parts = Vec::new();
    for message in messages[plan.head..plan.cut].iter().rev() {
        let text = render(message);
        let tokens = counter.count_text(&text);
        if tokens > budget {
            parts.push("[older history left out: it did not fit]".to_string());
            break;
        }
        budget -= tokens;
        parts.push(text);
    }
    for part in parts.iter().rev() {
        transcript.push_str(part);
        transcript.push_str("\n\n");
    }
    vec![
        Message::system(instructions),
        Message::user(format!(
            "The conversation to summarize:\n\n{transcript}Write the eight-section summary now."
        )),
    ]
}

fn render(message: &Message) -> String {
    let clip = |text: &str| crate::text::clip(text, MAX_CHARS_PER_MESSAGE, "… [cut]");
    match message {
        Message::Assistant { content, tool_calls } if !tool_calls.is_empty() => {
            let calls: Vec<String> = tool_calls
                .iter()
                .map(|c| format!("{}({})", c.name, c.arguments))
                .collect();
            format!(
                "[assistant] {}\n[assistant calls] {}",
                clip(content),
                clip(&calls.join("; "))
            )
        }
        Message::Tool { name, content, .. } => format!("[tool {name}] {}", clip(content)),
        other => format!("[{}] {}", other.role(), clip(other.content())),
    }
}

/// The summary message from the model's answer: its sections in order,
/// with any section it left out marked as such.
pub fn format_summary(answer: &str) -> Message {
    let lowered = answer.to_lowercase();
    let mut found: Vec<(usize, usize)> = SECTIONS
        .iter()
        .enumerate()
        .filter_map(|(index, name)| lowered.find(&name.to_lowercase()).map(|at| (at, index)))
        .collect();
    found.sort();
    let mut bodies: Vec<Option<String>> = vec![None; SECTIONS.len()];
    for (position, &(at, index)) in found.iter().enumerate() {
        let start = answer[at..].find('\n').map_or(answer.len(), |nl| at + nl + 1);
        let end = found
            .get(position + 1)
            .map_or(answer.len(), |&(next, _)| answer[..next].rfind('\n').unwrap_or(next));
        let body = answer.get(start..end.max(start)).unwrap_or_default().trim();
        bodies[index] = Some(if body.is_empty() {
            "- none".to_string()
        } else {
            body.to_string()
        });
    }
    let mut content =
        format!("{SUMMARY_MARKER} Earlier parts of this conversation were compressed into this summary.\n");
    let any_found = bodies.iter().any(Option::is_some);
    for (index, section) in SECTIONS.iter().enumerate() {
        let body = match &bodies[index] {
            Some(body) => body.clone(),
            // A free-form answer still carries the facts: keep it in the first section.
            None if index == 0 && !any_found => answer.trim().to_string(),
            None => "- (not recorded)".to_string(),
        };
        content.push_str(&format!("\n## {}. {section}\n{body}\n", index + 1));
    }
    Message::system(content)
}

/// Makes `messages` fit in `budget` tokens without a model: first the
/// oldest tool outputs are replaced by a note, then the oldest turns are
/// dropped. The system prompt, the user's latest request and the newest
/// turn always stay, and tool calls keep their results.
pub fn fallback(messages: &[Message], counter: &dyn TokenCounter, budget: usize) -> Vec<Message> {
    let mut out = messages.to_vec();
    let mut tokens: Vec<usize> = out.iter().map(|m| counter.count_message(m)).collect();
    let total = |tokens: &[usize]| tokens.iter().sum::<usize>();
    let last_turn = out
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
        .unwrap_or(out.len());

    // 1. Oldest tool outputs first.
    const REMOVED: &str = "[tool output removed to fit the context window]";
    for index in 0..last_turn {
        if total(&tokens) <= budget {
            return out;
        }
        if let Message::Tool { content, .. } = &mut out[index] {
            if content != REMOVED {
                *content = REMOVED.to_string();
                tokens[index] = counter.count_message(&out[index]);
            }
        }
    }

    // 2. Oldest turns: an assistant message with its tool results and the
    //    system notes after them, and user messages other than the latest.
    let head = usize::from(matches!(out.first(), Some(Message::System { .. })));
    let mut index = head;
    while total(&tokens) > budget && index < out.len() {
        // Positions move as turns are dropped: find them again each time.
        let latest_user = out.iter().rposition(|m| matches!(m, Message::User { .. }));
        let last_assistant = out.iter().rposition(|m| matches!(m, Message::Assistant { .. }));
        if Some(index) == latest_user || Some(index) >= last_assistant {
            index += 1;
            continue;
        }
        let end = match &out[index] {
            Message::Assistant { .. } => {
                let mut end = index + 1;
                while end < out.len() && matches!(out[end], Message::Tool { .. }) {
                    end += 1;
                }
                end
            }
            _ => index + 1,
        };
        // Never leave tool results without their call.
        if end < out.len() && matches!(out[end], Message::Tool { .. }) {
            index = end;
            continue;
        }
        out.drain(index..end);
        tokens.drain(index..end);
    }
    debug_assert!(validate_history(&out, true).is_ok());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::TiktokenCounter;
    use proptest::prelude::*;
    use serde_json::json;

    fn asks(ids: &[String]) -> Message {
        Message::Assistant {
            content: "working".into(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: id.clone(),
                    name: "t".into(),
                    arguments: json!({"x": 1}),
                })
                .collect(),
        }
    }

    /// A valid history from a list of turn shapes: 0 = plain answer, n = n tool calls,
    /// with optional guidance and user messages between turns.
    fn history(shape: &[(u8, bool, bool)]) -> Vec<Message> {
        let mut out = vec![Message::system("prompt"), Message::user("the first request")];
        for (turn, &(calls, guidance, user)) in shape.iter().enumerate() {
            if calls == 0 {
                out.push(Message::assistant(format!("answer {turn}")));
            } else {
                let ids: Vec<String> = (0..calls).map(|c| format!("c{turn}_{c}")).collect();
                out.push(asks(&ids));
                for id in &ids {
                    out.push(Message::tool(id, "t", "x".repeat(200)));
                }
            }
            if guidance {
                out.push(Message::system("guidance"));
            }
            if user {
                out.push(Message::user(format!("follow-up {turn}")));
            }
        }
        out
    }

    proptest! {
        #[test]
        fn any_cut_keeps_every_tool_result_after_its_call(
            shape in proptest::collection::vec((0u8..4, any::<bool>(), any::<bool>()), 0..25),
            keep in 0usize..40,
        ) {
            let messages = history(&shape);
            prop_assert!(validate_history(&messages, false).is_ok());
            if let Some(plan) = plan(&messages, keep) {
                let spliced = splice(&messages, &plan, format_summary("## Background context\n- x"));
                prop_assert!(validate_history(&spliced, false).is_ok(), "{:?}", plan);
                prop_assert!(spliced.iter().any(|m| matches!(m, Message::User { .. })), "a request is kept");
                prop_assert!(spliced.len() <= messages.len() + 1);
            }
        }

        #[test]
        fn fallback_keeps_the_history_valid(
            shape in proptest::collection::vec((0u8..4, any::<bool>(), any::<bool>()), 0..25),
            budget in 0usize..3000,
        ) {
            let counter = TiktokenCounter::for_model("gpt-4o");
            let messages = history(&shape);
            let out = fallback(&messages, &counter, budget);
            prop_assert!(validate_history(&out, false).is_ok());
            let starts_with_system = matches!(out[0], Message::System { .. });
            prop_assert!(starts_with_system);
            let latest = messages.iter().rev().find(|m| matches!(m, Message::User { .. }));
            prop_assert!(out.iter().any(|m| Some(m) == latest), "the latest request stays");
        }
    }

    #[test]
    fn summary_has_eight_sections_even_from_a_loose_answer() {
        let answer = "## 1. Background context\n- a Rust repo\n## 3. Tool usage log\n- read_file(README.md)\n";
        let summary = format_summary(answer);
        let text = summary.content();
        assert!(text.starts_with(SUMMARY_MARKER));
        for section in SECTIONS {
            assert!(text.contains(section), "{section} missing");
        }
        assert!(text.contains("- a Rust repo"));
        assert!(text.contains("- read_file(README.md)"));
        assert!(text.contains("## 2. Key decisions\n- (not recorded)"));
        let loose = format_summary("we read the README and fixed a bug");
        assert!(loose
            .content()
            .contains("## 1. Background context\nwe read the README and fixed a bug"));
    }

    #[test]
    fn the_cut_moves_back_to_the_call() {
        let messages = history(&[(2, false, false), (3, false, false), (1, false, false)]);
        // Keeping 2 would start inside the last turn's results.
        let plan = plan(&messages, 2).unwrap();
        assert!(matches!(messages[plan.cut], Message::Assistant { .. }));
        assert_eq!(plan.latest_user, Some(1));
    }
}
