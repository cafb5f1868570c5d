//! The chat completions request body, serialized from the borrowed history.

use std::fmt;

use loom_core::llm::{REMINDER_CLOSE, REMINDER_OPEN};
use loom_core::{GuidancePlacement, LlmRequest, Message, ToolCall, ToolSpec};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::text_tools;
use crate::wire::{ArgumentsText, WithReminder};

/// The body of `POST /chat/completions`.
#[derive(Serialize)]
pub(crate) struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: Messages<'a>,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Tools<'a>>,
    /// `"required"` when the answer must call a tool; absent otherwise
    /// (the server's default, `"auto"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

#[derive(Serialize)]
pub(crate) struct StreamOptions {
    pub include_usage: bool,
}

/// The tools, as `{"type": "function", "function": {…}}`.
pub(crate) struct Tools<'a>(pub &'a [ToolSpec]);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            description: &'a str,
            parameters: &'a Value,
        }
        #[derive(Serialize)]
        struct Tool<'a> {
            r#type: &'static str,
            function: Function<'a>,
        }
        serializer.collect_seq(self.0.iter().map(|tool| Tool {
            r#type: "function",
            function: Function {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        }))
    }
}

/// The conversation with the request's guidance placed, and — for models
/// without native tool calling — tools, calls and results written as text.
pub(crate) struct Messages<'a> {
    pub request: LlmRequest<'a>,
    pub placement: GuidancePlacement,
    /// Arguments that are not JSON (a call cut short, say) are sent as `{}`.
    pub json_arguments_only: bool,
    /// Calls and results written as text, for a model without tool calling.
    pub text_mode: bool,
    /// The tools described for such a model (when tools are offered).
    pub instructions: Option<&'a str>,
    /// The shape every chat template accepts (docs/context.md): every
    /// system message (the prompt, a compression summary) joined into one
    /// at the start, and user turns that follow tool results or another
    /// user turn (a steer, text-mode results) folded into that message, so
    /// user and assistant alternate. Only the official API takes any order.
    pub template_safe: bool,
}

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let messages = self.request.messages;
        let guidance = self.request.guidance;
        let inline = self.placement == GuidancePlacement::Inline;
        let target = guidance.and(inline.then(|| self.request.reminder_target()).flatten());
        let first_system = messages.iter().position(is_system);
        let mut seq = serializer.serialize_seq(None)?;
        if self.template_safe {
            // The system messages, wherever they are, and the text-mode
            // instructions, as one leading message.
            let pieces = messages
                .iter()
                .filter(|m| is_system(m))
                .map(Message::content)
                .chain(self.instructions);
            if first_system.is_some() || self.instructions.is_some() {
                seq.serialize_element(&JoinedSystem(pieces))?;
            }
            let turns: Vec<usize> = (0..messages.len()).filter(|&i| !is_system(&messages[i])).collect();
            let mut at = 0;
            while at < turns.len() {
                let lead = &messages[turns[at]];
                let mut end = at + 1;
                while end < turns.len() && folds_into(lead, &messages[turns[end]], self.text_mode) {
                    end += 1;
                }
                let group = &turns[at..end];
                let reminder = guidance.filter(|_| target.is_some_and(|t| group.contains(&t)));
                if let [only] = group {
                    seq.serialize_element(&self.wire(&messages[*only], reminder))?;
                } else {
                    seq.serialize_element(&Folded {
                        messages: group.iter().map(|&i| &messages[i]).collect(),
                        reminder,
                        text_mode: self.text_mode,
                    })?;
                }
                at = end;
            }
        } else {
            if let (Some(instructions), None) = (self.instructions, first_system) {
                seq.serialize_element(&Plain("system", instructions))?;
            }
            for (index, message) in messages.iter().enumerate() {
                let mut wire = self.wire(message, guidance.filter(|_| target == Some(index)));
                // Text mode describes the tools in the first system message.
                wire.instructions = self.instructions.filter(|_| first_system == Some(index));
                seq.serialize_element(&wire)?;
            }
        }
        match (guidance, inline, target) {
            (Some(guidance), false, _) => seq.serialize_element(&Plain("system", guidance))?,
            // The conversation ends with the model's words: the reminder
            // comes as a user message of its own.
            (Some(guidance), true, None) => seq.serialize_element(&Reminder(guidance))?,
            _ => {}
        }
        seq.end()
    }
}

impl<'a> Messages<'a> {
    fn wire(&self, message: &'a Message, reminder: Option<&'a str>) -> Wire<'a> {
        Wire {
            message,
            reminder,
            instructions: None,
            text_mode: self.text_mode,
            json_arguments_only: self.json_arguments_only,
        }
    }
}

fn is_system(message: &Message) -> bool {
    matches!(message, Message::System { .. })
}

/// Whether `next` joins the message `lead` starts, in the template-safe
/// shape: a user turn after tool results or after a user turn (Mistral's,
/// Gemma's and other templates raise unless user and assistant alternate),
/// and in text mode, where results are user turns, results too.
fn folds_into(lead: &Message, next: &Message, text_mode: bool) -> bool {
    match (lead, next) {
        (Message::User { .. }, Message::User { .. }) => true,
        (Message::Tool { .. }, Message::User { .. }) => true,
        (Message::User { .. } | Message::Tool { .. }, Message::Tool { .. }) => text_mode,
        _ => false,
    }
}

/// Several turns sent as one message: the lead's role (and call id), its
/// text, then each following text — a user's words after a tool result
/// marked as theirs — and the reminder last.
struct Folded<'a> {
    messages: Vec<&'a Message>,
    reminder: Option<&'a str>,
    text_mode: bool,
}

impl fmt::Display for Folded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lead_is_result = matches!(self.messages.first(), Some(Message::Tool { .. })) && !self.text_mode;
        for (index, message) in self.messages.iter().enumerate() {
            if index > 0 {
                f.write_str("\n\n")?;
            }
            match message {
                Message::Tool {
                    tool_call_id,
                    name,
                    content,
                } if self.text_mode => text_tools::write_result(f, name, tool_call_id, content)?,
                Message::User { content } if lead_is_result => {
                    write!(f, "{USER_OPEN}\n{content}\n{USER_CLOSE}")?;
                }
                other => f.write_str(other.content())?,
            }
        }
        if let Some(guidance) = self.reminder {
            write!(f, "\n\n{REMINDER_OPEN}\n{guidance}\n{REMINDER_CLOSE}")?;
        }
        Ok(())
    }
}

/// The marks around a person's words sent inside a tool result.
const USER_OPEN: &str = "<user-message>";
const USER_CLOSE: &str = "</user-message>";

impl Serialize for Folded<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self.messages.first() {
            Some(Message::Tool { tool_call_id, .. }) if !self.text_mode => {
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
            }
            _ => map.serialize_entry("role", "user")?,
        }
        map.serialize_entry("content", &DisplayText(self))?;
        map.end()
    }
}

/// Any `Display` as a JSON string.
struct DisplayText<'a, T>(&'a T);

impl<T: fmt::Display> Serialize for DisplayText<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}

/// `{"role": ROLE, "content": TEXT}`.
struct Plain<'a>(&'static str, &'a str);

impl Serialize for Plain<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", self.0)?;
        map.serialize_entry("content", self.1)?;
        map.end()
    }
}

/// One system message whose text is `pieces` joined by blank lines.
struct JoinedSystem<I>(I);

impl<'p, I: Iterator<Item = &'p str> + Clone> Serialize for JoinedSystem<I> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", "system")?;
        map.serialize_entry(
            "content",
            &crate::wire::Joined {
                pieces: self.0.clone(),
                separator: "\n\n",
            },
        )?;
        map.end()
    }
}

/// A user message holding only a reminder.
struct Reminder<'a>(&'a str);

impl Serialize for Reminder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", "user")?;
        map.serialize_entry(
            "content",
            &WithReminder {
                text: "",
                reminder: Some(self.0),
            },
        )?;
        map.end()
    }
}

/// One message as the API wants it.
struct Wire<'a> {
    message: &'a Message,
    reminder: Option<&'a str>,
    instructions: Option<&'a str>,
    text_mode: bool,
    json_arguments_only: bool,
}

impl Serialize for Wire<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let reminder = self.reminder;
        let mut map = serializer.serialize_map(None)?;
        match self.message {
            Message::System { content } => {
                map.serialize_entry("role", "system")?;
                match self.instructions {
                    Some(instructions) => map.serialize_entry(
                        "content",
                        &crate::wire::Joined {
                            pieces: [content.as_str(), instructions].into_iter(),
                            separator: "\n\n",
                        },
                    )?,
                    None => map.serialize_entry("content", content)?,
                }
            }
            Message::User { content } => {
                map.serialize_entry("role", "user")?;
                map.serialize_entry(
                    "content",
                    &WithReminder {
                        text: content,
                        reminder,
                    },
                )?;
            }
            Message::Assistant { content, tool_calls } if tool_calls.is_empty() => {
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("content", content)?;
            }
            Message::Assistant { content, tool_calls } if self.text_mode => {
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("content", &TextCalls { content, tool_calls })?;
            }
            Message::Assistant { content, tool_calls } => {
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("content", &(!content.is_empty()).then_some(content))?;
                map.serialize_entry(
                    "tool_calls",
                    &Calls {
                        calls: tool_calls,
                        json_arguments_only: self.json_arguments_only,
                    },
                )?;
            }
            Message::Tool {
                tool_call_id,
                name,
                content,
            } if self.text_mode => {
                map.serialize_entry("role", "user")?;
                map.serialize_entry(
                    "content",
                    &TextResult {
                        id: tool_call_id,
                        name,
                        content,
                        reminder,
                    },
                )?;
            }
            Message::Tool {
                tool_call_id, content, ..
            } => {
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
                map.serialize_entry(
                    "content",
                    &WithReminder {
                        text: content,
                        reminder,
                    },
                )?;
            }
        }
        map.end()
    }
}

/// `tool_calls` of an assistant message.
struct Calls<'a> {
    calls: &'a [ToolCall],
    json_arguments_only: bool,
}

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            arguments: ArgumentsText<'a>,
        }
        #[derive(Serialize)]
        struct Call<'a> {
            id: &'a str,
            r#type: &'static str,
            function: Function<'a>,
        }
        serializer.collect_seq(self.calls.iter().map(|call| Call {
            id: &call.id,
            r#type: "function",
            function: Function {
                name: &call.name,
                arguments: ArgumentsText {
                    arguments: &call.arguments,
                    json_only: self.json_arguments_only,
                },
            },
        }))
    }
}

/// An assistant message's text and calls written as `<tool_call>` blocks.
struct TextCalls<'a> {
    content: &'a str,
    tool_calls: &'a [ToolCall],
}

impl fmt::Display for TextCalls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lead = self.content.trim_start();
        f.write_str(lead)?;
        for (index, call) in self.tool_calls.iter().enumerate() {
            if index > 0 || !lead.is_empty() {
                f.write_str("\n")?;
            }
            text_tools::write_call(f, call)?;
        }
        Ok(())
    }
}

impl Serialize for TextCalls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A tool result written as a `<tool_result>` block.
struct TextResult<'a> {
    id: &'a str,
    name: &'a str,
    content: &'a str,
    reminder: Option<&'a str>,
}

impl fmt::Display for TextResult<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        text_tools::write_result(f, self.name, self.id, self.content)?;
        if let Some(guidance) = self.reminder {
            write!(
                f,
                "\n\n{}",
                WithReminder {
                    text: "",
                    reminder: Some(guidance)
                }
            )?;
        }
        Ok(())
    }
}

impl Serialize for TextResult<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
