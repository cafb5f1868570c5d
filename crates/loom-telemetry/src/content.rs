//! What spans record of a run's contents (`[telemetry] capture_content`,
//! docs/telemetry.md): nothing by default; when captured, the prompt, the
//! answers, tool arguments and results, each through the redactor that
//! tool output goes through, and cut at 16 KiB.
//!
//! Redaction happens here, before the assembler's lock is taken: a regex
//! pass over a long result must not hold back every other run's events.

use loom_core::{EventKind, Redactor};
use serde_json::Value;

/// The text of a span's content attribute at most, in bytes: a span is
/// not a transcript, and a collector refuses large ones.
pub const CONTENT_LIMIT: usize = 16 * 1024;

/// Marks a value that was cut.
const CUT: &str = "…[cut]";

/// What spans record of a run's contents.
#[derive(Debug, Clone)]
pub struct Content {
    /// Whether message text, arguments and results are recorded.
    captured: bool,
    /// What they go through; also the names and ids a model chose (a tool
    /// name it made up, a call id), which spans carry either way.
    redactor: Redactor,
}

impl Default for Content {
    fn default() -> Self {
        Self::left()
    }
}

/// The contents of one event a span may carry, redacted; all empty when
/// contents are left out.
#[derive(Debug, Default)]
pub struct Kept {
    /// A run's prompt (`lifecycle.start`).
    pub prompt: Option<String>,
    /// An answer's text (`llm.finish`, `lifecycle.end`).
    pub answer: Option<String>,
    /// Each call's arguments, as JSON, by call id (`tool_calls.start`).
    pub arguments: Vec<(String, String)>,
    /// A call's result (`tool.result`).
    pub result: Option<String>,
    /// The tool's name, redacted (`tool.result`, `permission.request`):
    /// the model chooses it, and may make one up.
    pub tool: Option<String>,
    /// The call's id, redacted (`tool.result`): the model or its provider
    /// chooses it.
    pub call_id: Option<String>,
}

impl Content {
    /// No message text, arguments or results in any span (the default);
    /// names and ids a model chose go through [`Redactor::from_env`].
    pub fn left() -> Self {
        Self {
            captured: false,
            redactor: Redactor::from_env(),
        }
    }

    /// Message text, arguments and results recorded, each through
    /// `redactor` and cut to 16 KiB.
    pub fn captured(redactor: Redactor) -> Self {
        Self {
            captured: true,
            redactor,
        }
    }

    /// Whether contents are recorded.
    pub fn is_captured(&self) -> bool {
        self.captured
    }

    /// What of `kind` spans may carry.
    pub fn kept(&self, kind: &EventKind) -> Kept {
        let named = |tool: &str| Some(self.redactor.redact(tool).into_owned());
        let mut kept = match kind {
            EventKind::ToolResult { name, call_id, .. } => Kept {
                tool: named(name),
                call_id: named(call_id),
                ..Kept::default()
            },
            EventKind::PermissionRequest { tool, .. } => Kept {
                tool: named(tool),
                ..Kept::default()
            },
            _ => Kept::default(),
        };
        if !self.captured {
            return kept;
        }
        match kind {
            EventKind::LifecycleStart { prompt, .. } => kept.prompt = self.keep(prompt),
            EventKind::LlmFinish { content, .. } => kept.answer = self.keep(content),
            EventKind::LifecycleEnd { content, .. } => {
                kept.answer = content.as_deref().and_then(|content| self.keep(content));
            }
            EventKind::ToolCallsStart { calls } => {
                kept.arguments = calls
                    .iter()
                    .filter_map(|call| Some((call.call_id.clone(), self.keep_json(&call.args)?)))
                    .collect();
            }
            EventKind::ToolResult { content, .. } => kept.result = self.keep(content),
            _ => {}
        }
        kept
    }

    /// `text` as a span may carry it, when contents are captured.
    pub fn keep(&self, text: &str) -> Option<String> {
        if !self.captured {
            return None;
        }
        Some(cut(self.redactor.redact(text).into_owned(), CONTENT_LIMIT))
    }

    /// `value` (a call's arguments) as JSON a span may carry. Each string
    /// is redacted as text of its own — an assignment on a line of a file's
    /// content is caught as it would be in tool output, which the escaped
    /// newlines of serialized JSON would hide — and a string under a key
    /// that names a secret (`"apiKey": "…"`) as the redactor judges that
    /// pair. Too long, the longest strings are cut, so the JSON stays JSON.
    pub fn keep_json(&self, value: &Value) -> Option<String> {
        if !self.captured {
            return None;
        }
        let mut value = value.clone();
        redact_strings(&self.redactor, &mut value);
        let text = value.to_string();
        if text.len() <= CONTENT_LIMIT {
            return Some(text);
        }
        let strings = count_strings(&value).max(1);
        shorten_strings(&mut value, (CONTENT_LIMIT / strings).max(256));
        // Too many small values even so: cut as text.
        Some(cut(value.to_string(), CONTENT_LIMIT))
    }
}

/// `text` cut to `limit` bytes on a character's boundary, marked.
fn cut(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut at = limit;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    text.push_str(CUT);
    text
}

fn redact_strings(redactor: &Redactor, value: &mut Value) {
    match value {
        Value::String(text) => {
            if let std::borrow::Cow::Owned(redacted) = redactor.redact(text) {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact_strings(redactor, item)),
        Value::Object(entries) => {
            for (key, item) in entries.iter_mut() {
                if let Value::String(text) = item {
                    // The pair as JSON text: how the redactor judges a
                    // secret by its key's name.
                    let pair = format!("{{{}: {}}}", Value::from(key.as_str()), Value::from(text.as_str()));
                    if redactor.redact(&pair) != pair.as_str() {
                        *text = loom_core::pipeline::REDACTED.to_string();
                        continue;
                    }
                }
                redact_strings(redactor, item);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn count_strings(value: &Value) -> usize {
    match value {
        Value::String(_) => 1,
        Value::Array(items) => items.iter().map(count_strings).sum(),
        Value::Object(entries) => entries.values().map(count_strings).sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

fn shorten_strings(value: &mut Value, limit: usize) {
    match value {
        Value::String(text) => *text = cut(std::mem::take(text), limit),
        Value::Array(items) => items.iter_mut().for_each(|item| shorten_strings(item, limit)),
        Value::Object(entries) => entries.values_mut().for_each(|item| shorten_strings(item, limit)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// One message in the GenAI conventions' JSON form.
pub fn message_json(role: &str, text: &str, finish_reason: Option<&str>) -> String {
    let mut message = serde_json::json!({
        "role": role,
        "parts": [{"type": "text", "content": text}],
    });
    if let Some(reason) = finish_reason {
        message["finish_reason"] = reason.into();
    }
    Value::Array(vec![message]).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn captured() -> Content {
        Content::captured(Redactor::default())
    }

    #[test]
    fn left_out_contents_keep_nothing_but_names_redacted() {
        let left = Content::left();
        assert_eq!(left.keep("text"), None);
        assert_eq!(left.keep_json(&json!({"a": "b"})), None);
        // A tool name a model made up, and a call id, go into spans anyway.
        let made_up = EventKind::ToolResult {
            call_id: "call-AKIAIOSFODNN7EXAMPLQ".into(),
            name: "x_ghp_abcdefghijklmnopqrstuvwxyz0123456789".into(),
            status: loom_core::ToolStatus::Error,
            content: "unknown tool".into(),
            duration_ms: 0,
            stages: Default::default(),
            decided_by: None,
        };
        let kept = left.kept(&made_up);
        assert!(!kept.tool.unwrap().contains("ghp_"));
        assert!(!kept.call_id.unwrap().contains("AKIA"));
        assert_eq!(kept.result, None);
    }

    #[test]
    fn arguments_are_redacted_string_by_string_and_by_their_keys() {
        let arguments = json!({
            "path": ".env",
            "content": "APP=demo\nDB_PASSWORD=hunter2-correct-horse\nPORT=8080\n",
            "command": "curl -H 'Authorization: Bearer ghp_abcdefghijklmnopqrstuvwxyz0123456789' x",
            "apiKey": "q9Xv2LmZ81KpRt5s",
            "sort_key": "name",
            "nested": [{"token": "sk-proj-abcdefghijklmnopqrstuvwxyz0123"}]
        });
        let kept = captured().keep_json(&arguments).unwrap();
        let kept: Value = serde_json::from_str(&kept).unwrap();
        let content = kept["content"].as_str().unwrap();
        assert!(
            content.contains("APP=demo") && content.contains("PORT=8080"),
            "{content}"
        );
        assert!(!content.contains("hunter2"), "{content}");
        assert!(!kept["command"].as_str().unwrap().contains("ghp_"), "{kept}");
        assert_eq!(kept["apiKey"], loom_core::pipeline::REDACTED);
        assert_eq!(kept["sort_key"], "name", "not a secret for its name alone");
        assert!(!kept.to_string().contains("sk-proj"), "{kept}");
        assert_eq!(kept["path"], ".env");
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary_and_json_stays_json() {
        // An ASCII byte first: the 3-byte characters then straddle the limit.
        let text = format!("a{}", "€".repeat(CONTENT_LIMIT));
        let kept = Content::captured(Redactor::disabled()).keep(&text).unwrap();
        assert!(
            kept.ends_with(CUT) && kept.len() <= CONTENT_LIMIT + CUT.len(),
            "{}",
            kept.len()
        );
        let arguments = json!({"content": text, "path": "a.txt"});
        let kept = Content::captured(Redactor::disabled()).keep_json(&arguments).unwrap();
        assert!(kept.len() <= CONTENT_LIMIT + CUT.len(), "{}", kept.len());
        let kept: Value = serde_json::from_str(&kept).unwrap();
        assert!(kept["content"].as_str().unwrap().ends_with(CUT));
        assert_eq!(kept["path"], "a.txt");
    }
}
