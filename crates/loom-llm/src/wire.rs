//! Pieces shared by the providers' request bodies. Bodies are serialized
//! straight from the borrowed history to bytes — no intermediate JSON tree,
//! no copy of the history — so a request costs one pass over what it sends.
//! Text that must be joined (a message and its reminder) is written through
//! `Display` into the serializer, which escapes it as it goes.

use std::fmt;

use loom_core::llm::{REMINDER_CLOSE, REMINDER_OPEN};
use serde::{Serialize, Serializer};
use serde_json::Value;

/// A message's text followed by an inline reminder ([`loom_core::llm::reminder`]),
/// as one JSON string.
pub(crate) struct WithReminder<'a> {
    pub text: &'a str,
    pub reminder: Option<&'a str>,
}

impl fmt::Display for WithReminder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)?;
        if let Some(guidance) = self.reminder {
            if !self.text.is_empty() {
                f.write_str("\n\n")?;
            }
            write!(f, "{REMINDER_OPEN}\n{guidance}\n{REMINDER_CLOSE}")?;
        }
        Ok(())
    }
}

impl Serialize for WithReminder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.reminder {
            None => serializer.serialize_str(self.text),
            Some(_) => serializer.collect_str(self),
        }
    }
}

/// A tool call's arguments as JSON text (what OpenAI's `arguments` holds):
/// text the model wrote that was not JSON goes back as it was — or, with
/// `json_only`, as `{}`, for servers that parse it.
pub(crate) struct ArgumentsText<'a> {
    pub arguments: &'a Value,
    pub json_only: bool,
}

impl Serialize for ArgumentsText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.arguments {
            Value::String(_) if self.json_only => serializer.serialize_str("{}"),
            Value::String(raw) => serializer.serialize_str(raw),
            // `Value`'s Display is its compact JSON.
            other => serializer.collect_str(other),
        }
    }
}

/// Pieces joined with a separator, as one JSON string.
pub(crate) struct Joined<'a, I> {
    pub pieces: I,
    pub separator: &'a str,
}

impl<'a, I> fmt::Display for Joined<'a, I>
where
    I: Iterator<Item = &'a str> + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, piece) in self.pieces.clone().enumerate() {
            if index > 0 {
                f.write_str(self.separator)?;
            }
            f.write_str(piece)?;
        }
        Ok(())
    }
}

impl<'a, I> Serialize for Joined<'a, I>
where
    I: Iterator<Item = &'a str> + Clone,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A body as bytes; a failure (which typed bodies do not have) is reported
/// as an invalid request rather than a panic.
pub(crate) fn to_bytes(body: &impl Serialize) -> Result<bytes::Bytes, loom_core::LlmError> {
    serde_json::to_vec(body)
        .map(bytes::Bytes::from)
        .map_err(|err| loom_core::LlmError::InvalidRequest(format!("cannot write the request body: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn joined_text_is_escaped_once() {
        let text = WithReminder {
            text: "line \"1\"\n",
            reminder: Some("say \\ \"hi\""),
        };
        let json = serde_json::to_string(&text).unwrap();
        let back: String = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back,
            "line \"1\"\n\n\n<system-reminder>\nsay \\ \"hi\"\n</system-reminder>"
        );
        assert_eq!(
            back,
            format!("line \"1\"\n\n\n{}", loom_core::llm::reminder("say \\ \"hi\""))
        );
        let text =
            |arguments: &Value, json_only| serde_json::to_string(&ArgumentsText { arguments, json_only }).unwrap();
        let args = text(&json!({"path": "a \"b\""}), false);
        assert_eq!(serde_json::from_str::<String>(&args).unwrap(), r#"{"path":"a \"b\""}"#);
        assert_eq!(text(&json!("{broken"), false), r#""{broken""#);
        assert_eq!(text(&json!("{broken"), true), r#""{}""#);
        assert_eq!(text(&json!({"a": 1}), true), r#""{\"a\":1}""#);
        let joined = Joined {
            pieces: ["a", "b\"c"].into_iter(),
            separator: "\n\n",
        };
        assert_eq!(serde_json::to_string(&joined).unwrap(), r#""a\n\nb\"c""#);
    }
}
