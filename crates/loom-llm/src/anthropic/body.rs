//! The Messages API request body, serialized from the borrowed history.
//!
//! The leading system messages become `system`; the rest alternate
//! user/assistant (consecutive messages of one side are one turn), with tool
//! calls as `tool_use` blocks and results as `tool_result` blocks in the
//! next user turn. A later system message (a compression summary) is text
//! in a user turn. The request's guidance is a text block — a marked
//! reminder — at the end of the last user turn: the API takes no system
//! message inside the conversation.

use std::ops::Range;

use loom_core::{LlmRequest, Message, ToolSpec};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::wire::{Joined, WithReminder};

/// The body of `POST /v1/messages`.
#[derive(Serialize)]
pub(crate) struct MessagesRequest<'a> {
    pub model: &'a str,
    pub max_tokens: u32,
    pub messages: Turns<'a>,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<System<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Tools<'a>>,
    /// `{"type": "any"}` when the answer must call a tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// Anthropic's `tool_choice`.
#[derive(Serialize)]
pub(crate) struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl<'a> MessagesRequest<'a> {
    pub(crate) fn new(model: &'a str, max_tokens: u32, request: &LlmRequest<'a>) -> Self {
        let messages = request.messages;
        let leading = messages
            .iter()
            .position(|message| !matches!(message, Message::System { .. }))
            .unwrap_or(messages.len());
        let (system, rest) = messages.split_at(leading);
        Self {
            model,
            max_tokens,
            messages: Turns::new(rest, request.guidance),
            stream: true,
            system: (!system.is_empty()).then_some(System(system)),
            tools: (!request.tools.is_empty()).then_some(Tools(request.tools)),
            tool_choice: (request.require_tool_call && !request.tools.is_empty()).then_some(ToolChoice { kind: "any" }),
        }
    }
}

/// The leading system messages, joined.
pub(crate) struct System<'a>(&'a [Message]);

impl Serialize for System<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Joined {
            pieces: self.0.iter().map(Message::content),
            separator: "\n\n",
        }
        .serialize(serializer)
    }
}

/// The tools, as `{"name", "description", "input_schema"}`.
pub(crate) struct Tools<'a>(&'a [ToolSpec]);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tool<'a> {
            name: &'a str,
            description: &'a str,
            input_schema: &'a Value,
        }
        serializer.collect_seq(self.0.iter().map(|tool| Tool {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.parameters,
        }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    User,
    Assistant,
}

impl Side {
    fn of(message: &Message) -> Option<Side> {
        match message {
            // An assistant message with neither text nor calls has no block.
            Message::Assistant { content, tool_calls } if content.is_empty() && tool_calls.is_empty() => None,
            Message::Assistant { .. } => Some(Side::Assistant),
            _ => Some(Side::User),
        }
    }

    fn role(self) -> &'static str {
        match self {
            Side::User => "user",
            Side::Assistant => "assistant",
        }
    }
}

/// The conversation as alternating turns: each turn a range of messages.
pub(crate) struct Turns<'a> {
    messages: &'a [Message],
    turns: Vec<(Side, Range<usize>)>,
    guidance: Option<&'a str>,
}

impl<'a> Turns<'a> {
    fn new(messages: &'a [Message], guidance: Option<&'a str>) -> Self {
        let mut turns: Vec<(Side, Range<usize>)> = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let Some(side) = Side::of(message) else { continue };
            match turns.last_mut() {
                Some((last, range)) if *last == side => range.end = index + 1,
                _ => turns.push((side, index..index + 1)),
            }
        }
        Self {
            messages,
            turns,
            guidance,
        }
    }
}

impl Serialize for Turns<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let last_is_user = matches!(self.turns.last(), Some((Side::User, _)));
        let mut seq = serializer.serialize_seq(None)?;
        for (index, (side, range)) in self.turns.iter().enumerate() {
            let last = index + 1 == self.turns.len();
            seq.serialize_element(&Turn {
                side: *side,
                messages: &self.messages[range.clone()],
                reminder: self.guidance.filter(|_| last && last_is_user),
            })?;
        }
        if let (Some(guidance), false) = (self.guidance, last_is_user) {
            seq.serialize_element(&Turn {
                side: Side::User,
                messages: &[],
                reminder: Some(guidance),
            })?;
        }
        seq.end()
    }
}

/// One turn: `{"role", "content": [blocks]}`.
struct Turn<'a> {
    side: Side,
    messages: &'a [Message],
    reminder: Option<&'a str>,
}

impl Serialize for Turn<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", self.side.role())?;
        map.serialize_entry(
            "content",
            &Blocks {
                messages: self.messages,
                reminder: self.reminder,
            },
        )?;
        map.end()
    }
}

struct Blocks<'a> {
    messages: &'a [Message],
    reminder: Option<&'a str>,
}

impl Serialize for Blocks<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for message in self.messages {
            match message {
                Message::System { content } | Message::User { content } => seq.serialize_element(&Text(content))?,
                Message::Assistant { content, tool_calls } => {
                    if !content.is_empty() {
                        seq.serialize_element(&Text(content))?;
                    }
                    for call in tool_calls {
                        seq.serialize_element(&ToolUse {
                            r#type: "tool_use",
                            id: &call.id,
                            name: &call.name,
                            // The API wants an object; text that was not JSON
                            // was reported to the model as invalid arguments.
                            input: Input(call.arguments.is_object().then_some(&call.arguments)),
                        })?;
                    }
                }
                Message::Tool {
                    tool_call_id, content, ..
                } => seq.serialize_element(&ToolResultBlock {
                    r#type: "tool_result",
                    tool_use_id: tool_call_id,
                    content,
                })?,
            }
        }
        if let Some(guidance) = self.reminder {
            seq.serialize_element(&ReminderText(guidance))?;
        }
        seq.end()
    }
}

/// A call's input: its arguments, or `{}`.
struct Input<'a>(Option<&'a Value>);

impl Serialize for Input<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(arguments) => arguments.serialize(serializer),
            None => serializer.serialize_map(Some(0))?.end(),
        }
    }
}

struct Text<'a>(&'a str);

impl Serialize for Text<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "text")?;
        map.serialize_entry("text", self.0)?;
        map.end()
    }
}

struct ReminderText<'a>(&'a str);

impl Serialize for ReminderText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "text")?;
        map.serialize_entry(
            "text",
            &WithReminder {
                text: "",
                reminder: Some(self.0),
            },
        )?;
        map.end()
    }
}

#[derive(Serialize)]
struct ToolUse<'a> {
    r#type: &'static str,
    id: &'a str,
    name: &'a str,
    input: Input<'a>,
}

#[derive(Serialize)]
struct ToolResultBlock<'a> {
    r#type: &'static str,
    tool_use_id: &'a str,
    content: &'a str,
}
