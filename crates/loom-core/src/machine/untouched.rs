//! An answer given without touching the files the task names: a small
//! model asked "Which function in shapes.py has no docstring?" or "Create
//! config.json from settings.ini" often answers — at once, or after
//! writing a file — from what it imagines the file holds; asked to "write a
//! summary to SUMMARY.md" it answers with the summary, or with what it
//! means to do, and writes nothing. The task's own words say which files
//! matter, so the runtime can tell: when the model answers and a file the
//! task names appears in none of the run's tool calls — one that existed
//! when the run began (never looked at), or one that did not (never
//! written) — the answer is sent back once with guidance naming those
//! files (docs/context.md, "Answers that are not answers"). A file is
//! touched when any call's arguments name it — read, grep, write, a
//! command: the rule catches answers made up from nothing, not a
//! particular way of working.
//!
//! Which words of the task name files is decided here, without IO; which
//! of them exist is the driver's to find out when the run begins.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, ToolCall};

/// The files a task names that no call of the run has named yet, as the
/// run found them when it began. A name leaves when a call names it (kept
/// here, not read back from the history, which compression shortens).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedFiles {
    /// Files that existed: an answer needs a call that names them (to look).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) existing: Vec<String>,
    /// Files that did not ([`may_be_made`]): an answer needs a call that
    /// names them (to write; a call that only tried counts too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) missing: Vec<String>,
}

impl NamedFiles {
    /// Whether no named file is left untouched.
    pub fn is_empty(&self) -> bool {
        self.existing.is_empty() && self.missing.is_empty()
    }

    /// The model made `calls`: the files they name are touched.
    pub(crate) fn touched_by(&mut self, calls: &[ToolCall]) {
        let named_by_a_call = |name: &String| calls.iter().any(|call| mentions(&call.arguments, base_name(name)));
        self.existing.retain(|name| !named_by_a_call(name));
        self.missing.retain(|name| !named_by_a_call(name));
    }
}

/// At most this many of the words of a task that name files are looked
/// up (the first ones): a reminder naming more would not be read.
pub(crate) const MAX_NAMED_FILES: usize = 8;

/// Characters that end a word of the task around a path.
const AROUND_A_PATH: &[char] = &[
    '`', '\'', '"', '(', ')', '[', ']', '<', '>', '{', '}', ',', ';', '!', '?', '*',
];

/// Extensions of the files a task may ask for that are not there yet
/// (a word like `Node.js` is one too: it costs one more call, once).
const MADE_FILE_EXTENSIONS: &[&str] = &[
    "md", "txt", "rst", "json", "jsonl", "toml", "yaml", "yml", "ini", "cfg", "conf", "env", "csv", "tsv", "log",
    "xml", "html", "css", "sql", "sh", "py", "rs", "js", "ts", "go", "java", "rb", "c", "h", "cpp", "hpp",
];

/// Whether `name`, not in the workspace, is a file a task may ask for: a
/// common extension, or a dot file (`.env`, `.gitignore`).
pub(crate) fn may_be_made(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    match base.rsplit_once('.') {
        Some(("", _)) => true,
        Some((_, extension)) => MADE_FILE_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str()),
        None => false,
    }
}

/// The words of `task` that may name a file in the workspace: relative
/// paths with a file extension (`calc.py`, `src/app/urls.py`,
/// `docker-compose.yml`, `.env`), each once, in order. Whether such a file
/// exists is not decided here.
pub(crate) fn candidates(task: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in task.split(|c: char| c.is_whitespace() || AROUND_A_PATH.contains(&c)) {
        if is_an_abbreviation(word) {
            continue;
        }
        // A sentence's full stop or colon is not part of the name.
        let word = word.trim_end_matches(['.', ':']);
        let word = word.strip_prefix("./").unwrap_or(word);
        if looks_like_a_file(word) && !out.iter().any(|seen| seen == word) {
            out.push(word.to_string());
        }
    }
    out
}

/// `e.g.`, `i.e.`: single letters each followed by a full stop.
fn is_an_abbreviation(word: &str) -> bool {
    let bytes = word.as_bytes();
    bytes.len() >= 4
        && bytes.len() % 2 == 0
        && bytes
            .chunks(2)
            .all(|pair| pair[0].is_ascii_alphabetic() && pair[1] == b'.')
}

/// `name.ext` or `dir/name.ext`, relative, staying beneath the workspace.
fn looks_like_a_file(word: &str) -> bool {
    if word.is_empty() || word.starts_with('/') || word.contains("://") || word.contains('\\') {
        return false;
    }
    if word
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return false;
    }
    let name = word.rsplit('/').next().unwrap_or(word);
    let Some((stem, extension)) = name.rsplit_once('.') else {
        return false;
    };
    // `.env` is a name; `e.g` and `1.5` are not.
    let stem_ok = stem.is_empty() || stem.chars().any(|c| c.is_ascii_alphabetic());
    let extension_ok = (1..=10).contains(&extension.len())
        && extension.chars().all(|c| c.is_ascii_alphanumeric())
        && extension.chars().any(|c| c.is_ascii_alphabetic());
    stem_ok
        && extension_ok
        && word
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

/// The named files no tool call of the conversation has named (the
/// conversation may hold calls from before this run: a chat's earlier turns).
pub(crate) fn untouched<'a>(named: &'a [String], messages: &[Message]) -> Vec<&'a str> {
    named
        .iter()
        .filter(|name| {
            !messages
                .iter()
                .flat_map(Message::tool_calls)
                .any(|call| mentions(&call.arguments, base_name(name)))
        })
        .map(String::as_str)
        .collect()
}

/// The last component of a path: a call naming `app/urls.py` for
/// `src/app/urls.py` looked at it.
fn base_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Whether a string anywhere in `arguments` holds `name` as a whole name:
/// not `a.py` inside `data.py`, not `.env` inside `.env.example`.
fn mentions(arguments: &Value, name: &str) -> bool {
    match arguments {
        Value::String(text) => names(text, name),
        Value::Array(items) => items.iter().any(|item| mentions(item, name)),
        Value::Object(fields) => fields.values().any(|value| mentions(value, name)),
        _ => false,
    }
}

/// Whether `text` holds `name` with no character of a name on either side.
fn names(text: &str, name: &str) -> bool {
    let part_of_a_name = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        // A sentence's full stop after a name ends it.
        let after_ends = match after {
            Some('.') => text[at + name.len() + 1..]
                .chars()
                .next()
                .is_none_or(|c| !part_of_a_name(c)),
            other => other.is_none_or(|c| !part_of_a_name(c)),
        };
        before.is_none_or(|c| !part_of_a_name(c)) && after_ends
    })
}

/// Guidance of a retry after an answer given without touching `unread`
/// (files that exist) and `unwritten` (files that did not).
pub(crate) fn untouched_files_nudge(unread: &[&str], unwritten: &[&str]) -> String {
    let listed = |files: &[&str]| {
        files
            .iter()
            .map(|file| format!("`{file}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !unread.is_empty() {
        let them = if unread.len() == 1 { "it" } else { "them" };
        parts.push(format!(
            "You answered without looking at {}, which the task names: read {them} with your tools now, \
             since what the files hold decides the answer.",
            listed(unread)
        ));
    }
    if !unwritten.is_empty() {
        let (it, does) = if unwritten.len() == 1 {
            ("it", "does")
        } else {
            ("them", "do")
        };
        parts.push(format!(
            "{}, which the task names, {does} not exist and no tool has written {it}: if the task asks for {it}, \
             write {it} now with your tools; if not, check your answer with a tool.",
            listed(unwritten)
        ));
    }
    parts.push("Then finish the task and answer again.".to_string());
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: format!("id-{name}"),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn paths_with_an_extension_are_candidates() {
        assert_eq!(
            candidates("Create config.json from settings.ini: one object per section."),
            ["config.json", "settings.ini"]
        );
        assert_eq!(
            candidates("Fix `src/blog/urls.py` (see ./docker-compose.yml, and .env)."),
            ["src/blog/urls.py", "docker-compose.yml", ".env"]
        );
        assert_eq!(candidates("In 'app.log', count app.log's lines"), ["app.log"]);
    }

    #[test]
    fn other_words_are_not() {
        for task in [
            "Run python3 -m unittest, e.g. twice, with version 1.5 and 2.0.",
            "Read /etc/passwd and ../secret.txt and https://example.com/a.html",
            "Summarize this workspace.",
            "Use C:\\x\\y.txt or src//a.py",
        ] {
            assert!(candidates(task).is_empty(), "{task}: {:?}", candidates(task));
        }
    }

    #[test]
    fn a_file_is_looked_at_when_any_call_names_it() {
        let named = vec!["shapes.py".to_string(), "src/app/urls.py".to_string()];
        let mut messages = vec![Message::user("Which function in shapes.py has no docstring?")];
        assert_eq!(untouched(&named, &messages), ["shapes.py", "src/app/urls.py"]);
        messages.push(Message::Assistant {
            content: String::new(),
            tool_calls: vec![
                call("bash", json!({"command": "grep -n def shapes.py"})),
                call("read_file", json!({"path": "app/urls.py"})),
            ],
        });
        assert!(untouched(&named, &messages).is_empty());
    }

    #[test]
    fn a_name_is_touched_only_as_a_whole_name() {
        let named = vec!["a.py".to_string(), ".env".to_string()];
        let messages = |command: &str| {
            vec![Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("bash", json!({ "command": command }))],
            }]
        };
        assert_eq!(
            untouched(&named, &messages("cat data.py .env.example")),
            ["a.py", ".env"]
        );
        assert!(untouched(&named, &messages("cat ./a.py; cp x .env.")).is_empty());
        let mut files = NamedFiles {
            existing: vec!["a.py".into()],
            missing: vec![".env".into()],
        };
        files.touched_by(&[call("write_file", json!({"path": ".env", "content": "A=1"}))]);
        assert_eq!(files.existing, ["a.py"]);
        assert!(files.missing.is_empty());
    }

    #[test]
    fn files_to_make_have_a_common_extension_or_are_dot_files() {
        for name in ["SUMMARY.md", "out/counts.json", ".env", ".gitignore", "stats.TXT"] {
            assert!(may_be_made(name), "{name}");
        }
        for name in ["example.com", "e.g", "v1.2b", "Makefile"] {
            assert!(!may_be_made(name), "{name}");
        }
    }

    #[test]
    fn the_nudge_names_the_files() {
        let one = untouched_files_nudge(&["shapes.py"], &[]);
        assert!(one.contains("`shapes.py`") && one.contains("read it"), "{one}");
        assert!(!one.contains("exist"), "{one}");
        let both = untouched_files_nudge(&["a.py", "b.ini"], &["SUMMARY.md"]);
        assert!(both.contains("`a.py`, `b.ini`") && both.contains("read them"), "{both}");
        assert!(
            both.contains("`SUMMARY.md`, which the task names, does not exist"),
            "{both}"
        );
        assert!(both.ends_with("answer again."), "{both}");
    }
}
