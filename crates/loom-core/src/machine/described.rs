//! An answer that describes the work instead of doing it: a small model
//! asked to fix a test or write a file often answers — at once, or after
//! reading a file or two — with the code or the steps written out ("1. Run
//! the tests. 2. …", a fenced block with the file's content), having called
//! nothing that changes anything. The run would end `DONE` with the
//! workspace as it was; so such an answer is sent back once with guidance
//! (docs/context.md, "Work described, not done"). A short answer, one
//! given after the run called a tool that may change something (one not
//! read-only: `write_file`, `edit_file`, `bash`, an MCP tool), or one from
//! an agent offered no such tool (plan mode, a read-only sub-agent) is
//! taken as it is.

/// Guidance of a retry after an answer that describes the work.
pub(crate) const DESCRIBED_WORK_NUDGE: &str = "Nothing in the workspace has changed: describing the work, \
or telling the user how to do it, does not do it. You have the files and the tools: if the task asks you to create \
or change files or to run something, do it now with your tools that write files or run commands. If your answer \
needs no change, check it with a tool (read what it is about), then give it again.";

/// List lines (`- `, `* `, `1. `) that make an answer a written-out plan.
const MIN_LIST_LINES: usize = 2;

/// Words with which an answer asks the person for what the agent could
/// find itself ("Please provide users.json", "I'll need the file").
const ASKS_FOR_INPUT: &[&str] = &[
    "please provide",
    "please copy",
    "please share",
    "please upload",
    "i'll need",
    "i will need",
];

/// Words with which an answer that opens "To …, " tells the person how to
/// do the work ("To fix it, you need to…"): a small model's way of not
/// doing it. Only after such an opening: "You can run it with make" at the
/// end of real work, or "You should use port 8443" as an answer, is not it.
const TELLS_HOW: &[&str] = &[
    "you need to",
    "you'll need to",
    "you will need to",
    "you should ",
    "you can ",
    "you must ",
    "you have to",
    "you may need",
    "follow these steps",
    "follow the steps",
    "we need to",
    "we can ",
];

/// How far into an answer those words count: its opening, where a small
/// model says what it is doing.
const OPENING_CHARS: usize = 200;

/// Whether `answer`, given before the run changed anything, writes the
/// work out — a fenced code block, a list of steps or items — or hands it
/// to the person in its opening words.
pub(crate) fn describes_work(answer: &str) -> bool {
    if answer.contains("```") || hands_the_work_over(answer) {
        return true;
    }
    let list_lines = answer
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("- ") || line.starts_with("* ") || is_numbered(line))
        .count();
    list_lines >= MIN_LIST_LINES
}

/// Whether the opening of `answer` asks the person for what the agent
/// could find itself, or opens "To …" and tells them how to do the work.
fn hands_the_work_over(answer: &str) -> bool {
    let opening: String = answer
        .trim_start()
        .chars()
        .take(OPENING_CHARS)
        .collect::<String>()
        .to_lowercase();
    ASKS_FOR_INPUT.iter().any(|words| opening.contains(words))
        || (opening.starts_with("to ") && TELLS_HOW.iter().any(|words| opening.contains(words)))
}

/// `1. …`, `12) …`.
fn is_numbered(line: &str) -> bool {
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && (line[digits..].starts_with(". ") || line[digits..].starts_with(") "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_steps_and_item_lists_describe_work() {
        assert!(describes_work("Here is config.json:\n```json\n{\"a\": 1}\n```"));
        assert!(describes_work(
            "To fix it:\n\n1. Run the tests.\n2. Open calc.py.\n3. Fix subtract."
        ));
        assert!(describes_work("- `add(x, y): adds`\n- `sub(x, y): subtracts`"));
    }

    #[test]
    fn handing_the_work_to_the_person_describes_it() {
        for answer in [
            "To fix the bug in `calc.py`, you need to find the exact text that old_string should replace.",
            "To complete this task, I'll need the `users.json` file. Please provide it to me.",
            "I apologize, but there is no content to summarize. Could you please provide more information?",
            "To count the TODO comments, you can use the `grep` function.",
        ] {
            assert!(describes_work(answer), "{answer:?}");
        }
    }

    #[test]
    fn a_plain_answer_does_not() {
        for answer in [
            "8443",
            "There are 12 pages.",
            "Done.\n",
            "1. Only one step.",
            "Version 2.0 is out.",
            // Advice that is the answer, or a hint after the work, is not handing over.
            "You should use port 8443, as config/production.yaml sets it.",
            "Done. You can run it with `make test`.",
            "To 2 decimal places the mean is 10.28.",
        ] {
            assert!(!describes_work(answer), "{answer:?}");
        }
    }
}
