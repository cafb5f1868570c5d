//! Tool calls a model wrote as text where its server did not make them
//! calls: a small model served by llama.cpp, Ollama or vLLM often writes
//! its call as a fenced JSON block, a `<tool_call>` tag or a bare JSON
//! object, and the server's parser (which knows one shape per model
//! family) passes it on as text. Taken as the final answer, the run ends
//! with the call unmade (docs/tools.md, "Calls written as text").
//!
//! A block is a call only when it names an offered tool and carries its
//! arguments as an object: `{"name": T, "arguments": {…}}`, with the names
//! models use in their place (`function`, `tool`; `parameters`, `args`,
//! `input`), or `{"function": {"name": T, "arguments": …}}`. Arguments
//! written as a JSON string of an object (a chat template shows earlier
//! arguments that way, and the model copies it) are read as the object.

use serde_json::{Map, Value};

/// Keys a model writes the tool's name under.
const NAME_KEYS: [&str; 4] = ["name", "function", "tool", "tool_name"];
/// Keys a model writes the arguments under.
const ARGUMENT_KEYS: [&str; 4] = ["arguments", "parameters", "args", "input"];

/// Calls found in an answer's text, and the text without them.
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenCalls {
    /// Each call's tool name and arguments, in the order written.
    pub calls: Vec<(String, Value)>,
    /// The answer's text with the blocks that held calls taken out.
    pub rest: String,
}

/// The calls written in `text` to tools for which `offered` is true;
/// `None` when there are none.
pub fn recover(text: &str, offered: impl Fn(&str) -> bool) -> Option<WrittenCalls> {
    let mut calls = Vec::new();
    let mut rest = String::new();
    let mut at = 0;
    for block in blocks(text) {
        // A block counts only when every value in it is a call: a list of
        // records that happens to hold one call-shaped entry is data.
        let Some(found) = parse_block(&text[block.inner.clone()]).and_then(|values| {
            values
                .iter()
                .map(|value| as_call(value, &offered))
                .collect::<Option<Vec<_>>>()
        }) else {
            continue;
        };
        rest.push_str(&text[at..block.outer.start]);
        at = block.outer.end;
        calls.extend(found);
    }
    if calls.is_empty() {
        return None;
    }
    rest.push_str(&text[at..]);
    Some(WrittenCalls {
        calls,
        rest: rest.trim().to_string(),
    })
}

/// Where a candidate block is: all of it, and the JSON inside.
struct Block {
    outer: std::ops::Range<usize>,
    inner: std::ops::Range<usize>,
}

/// The candidate blocks of `text`, in order, not overlapping: `<tool_call>`
/// tags (the closing one may be missing at the end), fenced code blocks,
/// and — when there is neither — the whole text if it is one JSON value.
fn blocks(text: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut from = 0;
    while from < text.len() {
        let tag = text[from..].find("<tool_call>").map(|i| from + i);
        let fence = text[from..].find("```").map(|i| from + i);
        let (block, at, marker) = match (tag, fence) {
            (Some(t), Some(f)) if t < f => (tagged(text, t), t, "<tool_call>".len()),
            (Some(t), None) => (tagged(text, t), t, "<tool_call>".len()),
            (_, Some(f)) => (fenced(text, f), f, "```".len()),
            (None, None) => break,
        };
        match block {
            Some(block) => {
                from = block.outer.end.max(from + 1);
                found.push(block);
            }
            // Not a block after all (a fence never closed, say): a later
            // one may still be.
            None => from = at + marker,
        }
    }
    if found.is_empty() {
        let trimmed = text.trim();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            let start = text.len() - text.trim_start().len();
            found.push(Block {
                outer: 0..text.len(),
                inner: start..start + trimmed.len(),
            });
        }
    }
    found
}

fn tagged(text: &str, start: usize) -> Option<Block> {
    let inner_start = start + "<tool_call>".len();
    let (inner_end, end) = match text[inner_start..].find("</tool_call>") {
        Some(i) => (inner_start + i, inner_start + i + "</tool_call>".len()),
        None => (text.len(), text.len()),
    };
    Some(Block {
        outer: start..end,
        inner: inner_start..inner_end,
    })
}

fn fenced(text: &str, start: usize) -> Option<Block> {
    let after = start + 3;
    // The info string (`json`, `tool_call`, nothing) runs to the line's end.
    let line_end = text[after..].find('\n').map(|i| after + i + 1)?;
    let close = text[line_end..].find("```").map(|i| line_end + i);
    let (inner_end, end) = match close {
        Some(close) => (close, close + 3),
        None => (text.len(), text.len()),
    };
    Some(Block {
        outer: start..end,
        inner: line_end..inner_end,
    })
}

/// The JSON values of a block: one value, a list of them, or one per line.
fn parse_block(inner: &str) -> Option<Vec<Value>> {
    let inner = inner.trim();
    if inner.is_empty() {
        return None;
    }
    match crate::json_strict::parse_strict(inner) {
        Ok(Value::Array(items)) => Some(items),
        Ok(value) => Some(vec![value]),
        Err(_) => inner
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| crate::json_strict::parse_strict(line.trim()).ok())
            .collect(),
    }
}

/// `value` as a call to an offered tool.
fn as_call(value: &Value, offered: &impl Fn(&str) -> bool) -> Option<(String, Value)> {
    let object = value.as_object()?;
    // `{"function": {"name": …, "arguments": …}}` (the API's own shape).
    if let Some(inner) = object.get("function").and_then(Value::as_object) {
        return named_call(inner, offered);
    }
    named_call(object, offered)
}

fn named_call(object: &Map<String, Value>, offered: &impl Fn(&str) -> bool) -> Option<(String, Value)> {
    let name = NAME_KEYS.iter().find_map(|key| object.get(*key)?.as_str())?;
    if !offered(name) {
        return None;
    }
    let arguments = match ARGUMENT_KEYS.iter().find_map(|key| object.get(*key)) {
        None => Value::Object(Map::new()),
        Some(Value::Object(arguments)) => Value::Object(arguments.clone()),
        Some(Value::String(text)) => unwrap_string(text)?,
        Some(_) => return None,
    };
    // Anything else in the object means it is not (only) a call.
    let known = object.keys().all(|key| {
        NAME_KEYS.contains(&key.as_str()) || ARGUMENT_KEYS.contains(&key.as_str()) || key == "id" || key == "type"
    });
    known.then(|| (name.to_string(), arguments))
}

/// Arguments written as JSON text (maybe escaped more than once) of an object.
fn unwrap_string(text: &str) -> Option<Value> {
    let mut current = crate::json_strict::parse_strict(text).ok()?;
    for _ in 0..3 {
        match current {
            Value::Object(_) => return Some(current),
            Value::String(inner) => current = crate::json_strict::parse_strict(&inner).ok()?,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offered(name: &str) -> bool {
        ["read_file", "write_file", "bash"].contains(&name)
    }

    fn calls(text: &str) -> Option<Vec<(String, Value)>> {
        recover(text, offered).map(|found| found.calls)
    }

    #[test]
    fn a_fenced_block_with_function_instead_of_name_is_a_call() {
        let text = "I will read it.\n```json\n{\"function\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n```";
        let found = recover(text, offered).unwrap();
        assert_eq!(found.calls, vec![("read_file".into(), json!({"path": "a.py"}))]);
        assert_eq!(found.rest, "I will read it.");
    }

    #[test]
    fn tool_call_tags_bare_objects_and_the_api_shape_are_calls() {
        assert_eq!(
            calls("<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>"),
            Some(vec![("bash".into(), json!({"command": "ls"}))])
        );
        // The closing tag cut off by the end of the answer.
        assert_eq!(
            calls("<tool_call>{\"name\": \"bash\", \"parameters\": {\"command\": \"ls\"}}"),
            Some(vec![("bash".into(), json!({"command": "ls"}))])
        );
        assert_eq!(
            calls("  {\"name\": \"read_file\", \"arguments\": {\"path\": \"x\"}}  "),
            Some(vec![("read_file".into(), json!({"path": "x"}))])
        );
        assert_eq!(
            calls("```\n{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"x\\\"}\"}}\n```"),
            Some(vec![("read_file".into(), json!({"path": "x"}))])
        );
    }

    #[test]
    fn several_calls_in_one_block_or_in_several() {
        let text = "```json\n[{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}, {\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}]\n```\nthen\n<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>";
        let found = recover(text, offered).unwrap();
        assert_eq!(found.calls.len(), 3);
        assert_eq!(found.rest, "then");
        // One call per line (Qwen's own way of writing several).
        let lines = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}\n</tool_call>";
        assert_eq!(calls(lines).map(|c| c.len()), Some(2));
        // A fence that opens no block does not hide a later call.
        assert_eq!(
            calls("Running ```ls``` now: <tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>"),
            Some(vec![("bash".into(), json!({"command": "ls"}))])
        );
    }

    #[test]
    fn arguments_escaped_once_or_twice_are_read_as_the_object() {
        let once =
            json!({"name": "write_file", "arguments": "{\"path\": \"calc.py\", \"content\": \"x\"}"}).to_string();
        let twice = json!({"name": "write_file", "arguments": json!("{\"path\": \"calc.py\", \"content\": \"x\"}").to_string()})
            .to_string();
        for text in [once, twice] {
            assert_eq!(
                calls(&text),
                Some(vec![("write_file".into(), json!({"path": "calc.py", "content": "x"}))]),
                "{text}"
            );
        }
    }

    #[test]
    fn data_prose_and_tools_not_offered_are_not_calls() {
        for text in [
            "The answer is 42.",
            // A config the task asked for, that happens to have a name.
            "```json\n{\"name\": \"read_file\", \"version\": 2}\n```",
            "```json\n{\"name\": \"my-app\", \"arguments\": {}}\n```",
            "{\"name\": \"delete_everything\", \"arguments\": {}}",
            "```python\nprint('hi')\n```",
            "<tool_call>not json</tool_call>",
            "{\"name\": \"read_file\", \"arguments\": [1, 2]}",
        ] {
            assert_eq!(calls(text), None, "{text}");
        }
    }
}
