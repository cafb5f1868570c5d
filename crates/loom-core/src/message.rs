//! Conversation messages and the tool calls a model asks for.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned call id; every tool message answers exactly one id.
    pub id: String,
    /// Name of the tool the model wants to run.
    pub name: String,
    /// Arguments as the model gave them. Normally a JSON object; when the
    /// model produced text that is not valid JSON it is kept as a JSON string
    /// so the validate stage can tell the model what went wrong.
    pub arguments: Value,
}

/// One message of the conversation, in the shape every provider understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions from the runtime: the system prompt, guidance, summaries.
    System {
        /// The text of the message.
        content: String,
    },
    /// A request or steering message from the person.
    User {
        /// The text of the message.
        content: String,
    },
    /// A model answer, possibly asking for tools.
    Assistant {
        /// Text the model produced (may be empty when it only calls tools).
        #[serde(default)]
        content: String,
        /// Tools the model asked for, in the model's order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call this message answers.
        tool_call_id: String,
        /// The tool's name (Anthropic-style APIs and logs need it).
        name: String,
        /// What the model reads as the tool's output.
        content: String,
    },
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
        }
    }

    /// An assistant message without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// A tool message answering `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, name: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            name: name.into(),
            content: content.into(),
        }
    }

    /// The role name as providers spell it.
    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant { .. } => "assistant",
            Self::Tool { .. } => "tool",
        }
    }

    /// The text content of the message.
    pub fn content(&self) -> &str {
        match self {
            Self::System { content }
            | Self::User { content }
            | Self::Assistant { content, .. }
            | Self::Tool { content, .. } => content,
        }
    }

    /// The tool calls of an assistant message (empty for every other role).
    pub fn tool_calls(&self) -> &[ToolCall] {
        match self {
            Self::Assistant { tool_calls, .. } => tool_calls,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serializes_with_role_tag() {
        let msg = Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a"}),
            }],
        };
        let value = serde_json::to_value(&msg).unwrap();
        assert_eq!(value["role"], "assistant");
        assert_eq!(value["tool_calls"][0]["id"], "c1");
        let back: Message = serde_json::from_value(value).unwrap();
        assert_eq!(back, msg);
        let tool = serde_json::to_value(Message::tool("c1", "read_file", "x")).unwrap();
        assert_eq!(tool["role"], "tool");
        assert_eq!(tool["tool_call_id"], "c1");
    }
}
