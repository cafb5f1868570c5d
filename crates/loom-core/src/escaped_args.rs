//! Arguments copied from an escaped earlier call. Some chat templates show
//! the model its earlier calls with their arguments as one JSON *string*
//! (llama.cpp's Qwen template does), and a small model that repeats a call
//! copies that form: its server then parses the first argument as holding
//! the rest of the object, escaped — a content
//! `hello\n","path":"out.txt"}` (a backslash and an `n`), a path
//! `counts.json"}}`. Run as given, such a call creates a file of that name,
//! or replaces a good file with the escaped copy.
//!
//! So a finished call's arguments are read back into the object the model
//! meant ([`repaired`]): the value is the end of that object's text, so the
//! object is its opening (`{"content": "`) followed by the value, less the
//! closing braces nothing opened. What cannot be read back that way is
//! refused by the validate stage with what to do ([`copied_tail`],
//! [`refusal`]). docs/tools.md, "Arguments copied in escaped form".

use serde_json::{Map, Value};

/// Levels of escaping read back: a call copied from a copy is escaped twice.
const MAX_LEVELS: usize = 3;

/// The arguments the model meant, when a string argument holds the escaped
/// end of their object; `None` when no argument does, or when one does but
/// cannot be read back.
pub(crate) fn repaired(args: &Value) -> Option<Value> {
    let Value::Object(fields) = args else {
        return None;
    };
    let mut current = fields.clone();
    let mut changed = false;
    for _ in 0..MAX_LEVELS {
        let Some((name, text)) = first_with_tail(&current) else {
            return changed.then_some(Value::Object(current));
        };
        let meant = read_back(&name, &text)?;
        current.extend(meant);
        changed = true;
    }
    (changed && first_with_tail(&current).is_none()).then_some(Value::Object(current))
}

/// The object whose text ends in `text`, the value of argument `name`: its
/// opening, then the value, less one closing brace at a time until it reads.
fn read_back(name: &str, text: &str) -> Option<Map<String, Value>> {
    let opening = format!("{{{}: \"", serde_json::to_string(name).ok()?);
    let mut candidate = text.trim_end();
    loop {
        if let Ok(Value::Object(meant)) = crate::json_strict::parse_strict(&format!("{opening}{candidate}")) {
            if meant.contains_key(name) {
                return Some(meant);
            }
        }
        candidate = candidate.strip_suffix('}')?;
    }
}

/// The first string argument (its name and value) that ends in a copied tail.
fn first_with_tail(fields: &Map<String, Value>) -> Option<(String, String)> {
    fields.iter().find_map(|(name, value)| match value {
        Value::String(text) if tail_of(text).is_some() => Some((name.clone(), text.clone())),
        _ => None,
    })
}

/// The first string argument (its name, and the tail it ends in) that ends
/// like the JSON object it was cut from: a quote, then one or more closing
/// braces that nothing in the value opened. Balanced text — a JSON file's
/// content such as `{"level": "info"}` — is not such a tail.
pub(crate) fn copied_tail(args: &Value) -> Option<(String, String)> {
    let Value::Object(fields) = args else {
        return None;
    };
    let (name, text) = first_with_tail(fields)?;
    let tail = tail_of(&text)?.to_string();
    Some((name, tail))
}

/// The tail `"}`, `"}}`, … that `text` ends in after some other text,
/// when its closing braces outnumber its opening ones.
fn tail_of(text: &str) -> Option<&str> {
    let trimmed = text.trim_end();
    let without_braces = trimmed.trim_end_matches('}');
    let braces = trimmed.len() - without_braces.len();
    // Something must come before the tail: a grep pattern `"}` is a pattern.
    if braces == 0 || !without_braces.ends_with('"') || without_braces.len() < 2 {
        return None;
    }
    let opened = text.matches('{').count();
    let closed = text.matches('}').count();
    (closed > opened).then(|| &trimmed[without_braces.len() - 1..])
}

/// What the model reads when a call whose arguments could not be read back
/// is refused.
pub(crate) fn refusal(tool: &str, argument: &str, tail: &str) -> String {
    format!(
        "Error: '{tool}' was not run: the value of '{argument}' ends in `{tail}`, the end of an earlier call \
copied in its escaped form. Call again with each argument as a plain value, or give your final answer if the \
task is done."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_copied_in_escaped_form_are_read_back() {
        // Seen from Qwen2.5-Coder 1.5B behind llama.cpp (bench/realmodel).
        let path = json!({"content": "INFO: 1", "path": "counts.json\"}}"});
        assert_eq!(
            repaired(&path),
            Some(json!({"content": "INFO: 1", "path": "counts.json"}))
        );
        let content = json!({"content": "hello\\n\",\"path\":\"out.txt\"}", "path": "out.txt\"}}"});
        assert_eq!(
            repaired(&content),
            Some(json!({"content": "hello\n", "path": "out.txt"}))
        );
        let nested = json!({
            "content": "{\\\"INFO\\\": 1}\",\"path\":\"counts.json\"}}",
            "path": "counts.json"
        });
        assert_eq!(
            repaired(&nested),
            Some(json!({"content": "{\"INFO\": 1}", "path": "counts.json"}))
        );
        // A copy of a copy: escaped twice.
        let twice = json!({
            "content": "{\\\\\\\"INFO\\\\\\\": 1}\\\",\\\"path\\\":\\\"counts.json\\\"}}\",\"path\":\"counts.json\"}",
            "path": "counts.json"
        });
        assert_eq!(
            repaired(&twice),
            Some(json!({"content": "{\"INFO\": 1}", "path": "counts.json"}))
        );
        let edit = json!({
            "path": "orders.py",
            "old_string": "x = 1",
            "new_string": "print('open')\",\"old_string\":\"x = 2\",\"path\":\"orders.py\"}"
        });
        assert_eq!(
            repaired(&edit),
            Some(json!({"path": "orders.py", "old_string": "x = 2", "new_string": "print('open')"}))
        );
    }

    #[test]
    fn what_cannot_be_read_back_is_left_for_the_refusal() {
        let broken = json!({"path": "a\"b\"}"});
        assert_eq!(repaired(&broken), None);
        assert_eq!(copied_tail(&broken), Some(("path".into(), "\"}".into())));
        let text = refusal("write_file", "path", "\"}");
        assert!(text.starts_with("Error: 'write_file' was not run"), "{text}");
        assert!(text.contains("'path' ends in `\"}`"), "{text}");
    }

    #[test]
    fn balanced_json_and_ordinary_text_are_left_alone() {
        for args in [
            json!({"path": "counts.json", "content": "{\"INFO\": 7, \"level\": \"info\"}"}),
            json!({"path": "a.json", "content": "{\"a\": {\"b\": \"c\"}}\n"}),
            json!({"path": "main.py", "content": "print(f\"{x}\")"}),
            json!({"path": "x.rs", "old_string": "}", "new_string": "}\n"}),
            json!({"pattern": "\"}"}),
            json!({"command": "echo '{}'"}),
            json!({"count": 3, "nested": {"path": "a\"}"}}),
            json!("a\"}"),
        ] {
            assert_eq!(copied_tail(&args), None, "{args}");
            assert_eq!(repaired(&args), None, "{args}");
        }
    }
}
