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
pub(crate) const DESCRIBED_WORK_NUDGE: &str = "Nothing in the workspace has changed: describing the work \
does not do it. If the task asks you to create or change files or to run something, do it now with your tools \
that write files or run commands. If your answer needs no change, give it again.";

/// List lines (`- `, `* `, `1. `) that make an answer a written-out plan.
const MIN_LIST_LINES: usize = 2;

/// Whether `answer`, given before the run changed anything, writes the
/// work out: a fenced code block, or a list of steps or items.
pub(crate) fn describes_work(answer: &str) -> bool {
    if answer.contains("```") {
        return true;
    }
    let list_lines = answer
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("- ") || line.starts_with("* ") || is_numbered(line))
        .count();
    list_lines >= MIN_LIST_LINES
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
    fn a_plain_answer_does_not() {
        for answer in [
            "8443",
            "There are 12 pages.",
            "Done.\n",
            "1. Only one step.",
            "Version 2.0 is out.",
        ] {
            assert!(!describes_work(answer), "{answer:?}");
        }
    }
}
