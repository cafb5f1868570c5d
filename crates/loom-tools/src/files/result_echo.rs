//! Content that is a tool's result, not a file's text. A small model that
//! has just written a file often writes it again with the result it read
//! (`Created 'config.json': 171 bytes, 1 lines.`) as the content, or
//! copies `read_file`'s numbered lines into the file it meant to write,
//! replacing good work with text no one asked for. `write_file` refuses
//! such content and says the file is unchanged (docs/tools.md) — as a
//! success when the content is the result of the very write the file still
//! holds (the model confirming its work), else as an error.

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

/// The file and size a copied `write_file` result names (`Created 'x': 3
/// bytes, 1 lines.`, or `Replaced …`): the write it reports, when that
/// file still holds so many bytes, has landed — writing its result over it
/// would only confirm it.
pub(super) fn echoed_write(content: &str) -> Option<(&str, u64)> {
    let line = content.trim().lines().next()?;
    let rest = line
        .strip_prefix("Created '")
        .or_else(|| line.strip_prefix("Replaced '"))?;
    let (path, after) = rest.split_once("': ")?;
    let bytes = after.strip_suffix(" lines.")?.split_once(" bytes, ")?.0.parse().ok()?;
    Some((path, bytes))
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
    fn a_copied_write_result_names_its_file_and_size() {
        use super::echoed_write;
        assert_eq!(
            echoed_write("Created 'stats.txt': 49 bytes, 1 lines."),
            Some(("stats.txt", 49))
        );
        assert_eq!(
            echoed_write("Replaced 'a b.md': 3 bytes, 2 lines.\n"),
            Some(("a b.md", 3))
        );
        // An append reports the text added, not the file's size; an edit no size.
        assert_eq!(echoed_write("Appended to 'log.txt': 3 bytes, 1 lines."), None);
        assert_eq!(echoed_write("Edited 'x.py': replaced 1 occurrence"), None);
        assert_eq!(echoed_write("Created 'x': many bytes, 1 lines."), None);
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
