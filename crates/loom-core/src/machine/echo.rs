//! An answer that only repeats an error: a small model often gives a
//! tool's error text back as its final answer ("Error: 'x' does not
//! exist"), or writes an error it never got, instead of acting on it. The
//! run would end `DONE` with the task undone, so such an answer is sent
//! back once with guidance (docs/context.md, "An error echoed as the answer").

use crate::message::Message;

/// Guidance of a retry after an answer that repeats an error.
pub(crate) const ERROR_ECHO_NUDGE: &str = "Your reply only repeats an error message; the task is not done. \
An error from a tool tells you what to fix: call the tool again with corrected arguments, or use another tool \
(list_dir or glob find the right path). Do not report an error you have not checked with a tool.";

/// The shortest piece of a tool's error that, found in the answer, counts as repeating it.
const MIN_ECHO_CHARS: usize = 16;

/// Whether `answer` repeats an error rather than answering: it starts as
/// an error message does, or it quotes the error the last tool results
/// gave. `messages` is the history before the answer.
pub(crate) fn echoes_an_error(answer: &str, messages: &[Message]) -> bool {
    let answer = answer.trim();
    if answer.is_empty() {
        return false;
    }
    if starts_as_an_error(answer) {
        return true;
    }
    last_results(messages)
        .filter_map(failed_result_line)
        .any(|line| line.chars().count() >= MIN_ECHO_CHARS && answer.contains(line))
}

fn starts_as_an_error(text: &str) -> bool {
    let head: String = text.chars().take(6).collect::<String>().to_ascii_lowercase();
    head.starts_with("error:") || head.starts_with("error ") || head == "error"
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
    fn an_answer_that_starts_as_an_error_or_quotes_the_last_one_is_an_echo() {
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
    fn a_real_answer_is_not_an_echo() {
        let messages = after_result("Error: cannot read 'a.txt': No such file or directory (os error 2)");
        assert!(!echoes_an_error(
            "The file a.txt does not exist, so I created it with the totals.",
            &messages
        ));
        assert!(!echoes_an_error("There are 12 pages.", &after_result("Pages: 12")));
        // An error word later in a real answer, and short error texts, are not an echo.
        assert!(!echoes_an_error(
            "Fixed the error in calc.py; the tests pass.",
            &messages
        ));
        assert!(!echoes_an_error("Done: x", &after_result("Error: x")));
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
