//! Content that is a tool's result, not a file's text. A small model that
//! has just written a file often writes it again with the result it read
//! (`Created 'config.json': 171 bytes, 1 lines.`) as the content, or
//! copies `read_file`'s numbered lines into the file it meant to write,
//! replacing good work with text no one asked for. `write_file` refuses
//! such content and says the file is unchanged (docs/tools.md).

/// What `content` was copied from, when it is a result rather than text
/// meant for a file.
pub(super) fn copied_result(content: &str) -> Option<&'static str> {
    let start = content.trim_start();
    let first_line = content.lines().next().unwrap_or_default();
    if start.starts_with("<tool_response>") {
        return Some("a tool's result as your chat shows it (`<tool_response>`)");
    }
    if is_file_tool_result(start.lines().next().unwrap_or_default()) {
        return Some("the result of an earlier call, not the file's text");
    }
    if is_numbered_line(first_line) {
        return Some("read_file's output with its line numbers, not the file's text");
    }
    None
}

/// `Created 'x': 3 bytes, 1 lines.` and the other results of `write_file`
/// and `edit_file`.
fn is_file_tool_result(line: &str) -> bool {
    ["Created '", "Replaced '", "Appended to '", "Edited '"]
        .iter()
        .find_map(|verb| line.strip_prefix(verb))
        .and_then(|rest| rest.split_once("': "))
        .is_some_and(|(_, after)| after.contains(" bytes, ") || after.starts_with("replaced "))
}

/// The first line as `read_file` numbers it: the number 1 right-aligned
/// in six columns, then a tab.
fn is_numbered_line(line: &str) -> bool {
    line.strip_prefix("     1\t").is_some()
}

#[cfg(test)]
mod tests {
    use super::copied_result;

    #[test]
    fn results_and_numbered_reads_are_not_file_text() {
        for content in [
            "Created 'SUMMARY.md': 445 bytes, 9 lines.",
            "Replaced 'config.json': 42 bytes, 1 lines.\",\"path\":\"config.json\"}",
            "Appended to 'log.txt': 3 bytes, 1 lines.",
            "Edited 'settings.py': replaced 1 occurrence; the new text is on lines 25-25.",
            "<tool_response>\n     1\t\"Keep track of items\"",
            "     1\timport json\n     2\t",
        ] {
            assert!(copied_result(content).is_some(), "{content}");
        }
    }

    #[test]
    fn ordinary_text_is_written() {
        for content in [
            "Created by the build script.\n",
            "Replaced 'old' with 'new' in every file.",
            "# Notes\n\n     1\tindented",
            "1\tone\n2\ttwo",
            "",
        ] {
            assert_eq!(copied_result(content), None, "{content}");
        }
    }
}
