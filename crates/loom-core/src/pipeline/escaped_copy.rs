//! Arguments copied from an escaped earlier call. Some chat templates show
//! the model its earlier calls with their arguments as one JSON *string*
//! (llama.cpp's Qwen template does), and a small model that repeats a call
//! copies that form: its argument values end in the tail of the object they
//! were cut from — a path `counts.json"}}`, a content ending
//! `…","path":"counts.json"}}`. Run as given, such a call creates a file
//! with that name, or replaces a good file with the escaped copy, so the
//! validate stage refuses it with what happened and what to do
//! (docs/tools.md, "Arguments copied in escaped form").

use serde_json::Value;

/// The first string argument (its name, and the tail it ends in) that ends
/// like the JSON object it was cut from: a quote, then one or more closing
/// braces that nothing in the value opened. Balanced text — a JSON file's
/// content such as `{"level": "info"}` — is not such a tail.
pub(crate) fn copied_tail(args: &Value) -> Option<(String, String)> {
    let Value::Object(fields) = args else {
        return None;
    };
    fields.iter().find_map(|(name, value)| {
        let Value::String(text) = value else {
            return None;
        };
        tail_of(text).map(|tail| (name.clone(), tail.to_string()))
    })
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

/// What the model reads when a call is refused for a copied tail.
pub(crate) fn refusal(tool: &str, argument: &str, tail: &str) -> String {
    format!(
        "Error: '{tool}' was not run: the value of '{argument}' ends in `{tail}`, the end of an earlier call \
copied in its escaped form, so this call is most likely a repeat. If the earlier call succeeded, do not repeat \
it: do the next step, or give your final answer if the task is done. Otherwise call again with each argument \
as a plain value."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_or_a_content_ending_in_the_tail_of_a_call_is_caught() {
        // Seen from Qwen2.5-Coder 1.5B behind llama.cpp (bench/realmodel).
        let path = json!({"content": "INFO: 1", "path": "counts.json\"}}"});
        assert_eq!(copied_tail(&path), Some(("path".into(), "\"}}".into())));
        let content = json!({
            "content": "{\\\"INFO\\\": 1}\",\"path\":\"counts.json\"}}",
            "path": "counts.json"
        });
        assert_eq!(copied_tail(&content), Some(("content".into(), "\"}}".into())));
        let edit = json!({
            "path": "orders.py",
            "old_string": "x = 1",
            "new_string": "print('open')\",\"old_string\":\"x\",\"path\":\"orders.py\"}"
        });
        assert_eq!(copied_tail(&edit), Some(("new_string".into(), "\"}".into())));
        assert_eq!(
            copied_tail(&json!({"path": "VERSION\"} \n"})),
            Some(("path".into(), "\"}".into()))
        );
    }

    #[test]
    fn balanced_json_and_ordinary_text_pass() {
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
        }
    }

    #[test]
    fn the_refusal_names_the_argument_and_what_to_do() {
        let text = refusal("write_file", "path", "\"}}");
        assert!(text.starts_with("Error: 'write_file' was not run"), "{text}");
        assert!(text.contains("'path' ends in `\"}}`"), "{text}");
        assert!(text.contains("give your final answer"), "{text}");
    }
}
