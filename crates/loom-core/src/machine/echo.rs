//! An answer that stops at an error: a small model often gives a tool's
//! error text back as its final answer ("Error: 'x' does not exist"),
//! writes an error it never got, or answers right after a failed call with
//! advice on how to fix it — instead of fixing it. The run would end `DONE`
//! with the task undone, so such an answer is sent back once with guidance
//! (docs/context.md, "An error echoed as the answer").

use crate::message::Message;

/// Guidance of a retry after an answer that stops at an error.
pub(crate) const ERROR_ECHO_NUDGE: &str = "The task is not done: your reply stops at an error. \
The error says what went wrong with the call; fix it yourself now — call the tool again with corrected \
arguments, or use another tool (listing the directory finds the right path). \
Do not report an error you have not checked with a tool.";

/// Whether `answer` stops at an error rather than answering: it starts as
/// an error message does; or it comes right after a failed call and quotes
/// it, talks of an error, or writes out the fix (code, steps) instead of
/// making it.
/// A plain answer after a failure ("config.toml is not in the workspace,
/// so the port is not set") is an answer. `messages` is the history
/// before the answer.
pub(crate) fn echoes_an_error(answer: &str, messages: &[Message]) -> bool {
    let answer = answer.trim();
    if answer.is_empty() {
        return false;
    }
    if starts_as_an_error(answer) {
        return true;
    }
    let failures: Vec<&str> = last_results(messages).filter_map(failed_result_line).collect();
    if failures.is_empty() {
        return false;
    }
    let quotes_one = failures
        .iter()
        .any(|line| line.chars().count() >= MIN_QUOTED_CHARS && answer.contains(line));
    quotes_one || mentions_an_error(answer) || super::described::describes_work(answer)
}

/// The shortest first line of an error that, found in the answer, counts as repeating it.
const MIN_QUOTED_CHARS: usize = 16;

/// The word "error" anywhere (`error`, `errors`, `Error:`), not inside another word.
fn mentions_an_error(text: &str) -> bool {
    text.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word == "error" || word == "errors")
}

/// `Error: …`, `error - …`, `ERROR`; not `Error handling was added …`
/// nor `Errors were fixed`: after the word comes punctuation or nothing.
fn starts_as_an_error(text: &str) -> bool {
    let head: String = text.chars().take(12).collect::<String>().to_ascii_lowercase();
    let Some(rest) = head.strip_prefix("error") else {
        return false;
    };
    rest.trim_start()
        .chars()
        .next()
        .is_none_or(|next| !next.is_alphanumeric())
}

/// The tool results of the latest turn, if the history ends with them.
fn last_results(messages: &[Message]) -> impl Iterator<Item = &str> {
    messages.iter().rev().map_while(|message| match message {
        Message::Tool { content, .. } => Some(content.as_str()),
        _ => None,
    })
}

/// The first line of a failed result's message (without its `Error:`).
fn failed_result_line(content: &str) -> Option<&str> {
    let rest = content.trim_start().strip_prefix("Error")?;
    let rest = rest.trim_start_matches(':').trim_start();
    rest.lines().next().map(str::trim).filter(|line| !line.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after_result(content: &str) -> Vec<Message> {
        vec![Message::user("go"), Message::tool("c1", "read_file", content)]
    }

    #[test]
    fn an_answer_that_starts_as_an_error_or_follows_a_failed_call_stops_at_it() {
        assert!(echoes_an_error(
            "Error: File 'pages.txt' does not exist.",
            &[Message::user("go")]
        ));
        assert!(echoes_an_error("error - cannot read", &[]));
        let messages = after_result("Error: cannot read 'src/calc.rs': No such file or directory (os error 2)");
        assert!(echoes_an_error(
            "I could not finish: cannot read 'src/calc.rs': No such file or directory (os error 2)",
            &messages
        ));
        let bash = after_result("Error: exit code 1 (0.1 s)\n--- stderr ---\nboom\n[sandbox: none]");
        assert!(echoes_an_error("exit code 1 (0.1 s)", &bash));
    }

    #[test]
    fn advice_right_after_a_failed_call_stops_at_it_too() {
        let messages = after_result("Error: cannot list 'src': it does not exist. What '.' holds:\ninventory.py");
        assert!(echoes_an_error(
            "To fix the error, you should change the `path` argument to the right directory.",
            &messages
        ));
    }

    #[test]
    fn a_fix_written_out_right_after_a_failed_call_stops_at_it() {
        let messages = after_result("Error: exit code 1 (0.4 s)\n--- stderr ---\nFAILED (failures=1)");
        assert!(echoes_an_error(
            "Here's the updated function:\n```python\ndef parse_price(s):\n    return float(s)\n```",
            &messages
        ));
    }

    #[test]
    fn a_plain_answer_after_a_failed_call_is_an_answer() {
        let messages = after_result("Error: cannot read 'config.toml': it does not exist. What '.' holds:\nREADME");
        assert!(!echoes_an_error(
            "config.toml is not in the workspace, so the port is not set anywhere.",
            &messages
        ));
        assert!(!echoes_an_error("recovered", &messages));
    }

    #[test]
    fn a_real_answer_is_not_an_echo() {
        assert!(!echoes_an_error("There are 12 pages.", &after_result("Pages: 12")));
        // An answer about errors is not one.
        assert!(!echoes_an_error(
            "Error handling was added to parse_price; the tests pass.",
            &after_result("ok")
        ));
        assert!(!echoes_an_error("Errors were fixed in calc.py.", &after_result("ok")));
        // An error word later in an answer after a successful call.
        assert!(!echoes_an_error(
            "Fixed the error in calc.py; the tests pass.",
            &after_result("ok")
        ));
        // Only the latest results count.
        let older = vec![
            Message::tool(
                "c1",
                "read_file",
                "Error: cannot read 'a.txt': No such file or directory",
            ),
            Message::assistant("ok"),
        ];
        assert!(!echoes_an_error(
            "cannot read 'a.txt': No such file or directory",
            &older
        ));
    }
}
