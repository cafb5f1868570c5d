//! Discover and validate, and the wording of the results they refuse with.

use serde_json::Value;

use crate::escaped_args;
use crate::message::ToolCall;
use crate::tool::{RegisteredTool, ToolRegistry};
use crate::tool_result::{ErrorKind, ToolResult, ToolStatus};

/// How many schema violations to list in one error result.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// A call refused before it ran.
pub(crate) struct Rejection {
    kind: ErrorKind,
    message: String,
}

impl Rejection {
    pub(crate) fn new(kind: ErrorKind, message: String) -> Self {
        Self { kind, message }
    }

    pub(crate) fn into_result(self, call: &ToolCall) -> ToolResult {
        error(call, self.kind, self.message)
    }
}

/// An `error` result with a machine-readable kind.
pub(crate) fn error(call: &ToolCall, kind: ErrorKind, content: String) -> ToolResult {
    ToolResult::new(&call.id, &call.name, ToolStatus::Error, content).with_error_kind(kind)
}

/// Stage 1: find the tool and check it is available.
pub(crate) fn discover<'a>(registry: &'a ToolRegistry, call: &ToolCall) -> Result<&'a RegisteredTool, Rejection> {
    let Some(registered) = registry.get(&call.name) else {
        let available: Vec<&str> = registry.names().collect();
        let list = if available.is_empty() {
            "none (answer without tools)".to_string()
        } else {
            available.join(", ")
        };
        let hint = code_name_hint(&call.name, registry);
        return Err(Rejection::new(
            ErrorKind::UnknownTool,
            format!(
                "Error: there is no tool named '{}'. Available tools: {list}. Call one of them by its exact name.{hint}",
                call.name
            ),
        ));
    };
    if let Err(reason) = registered.tool.check_available() {
        return Err(Rejection::new(
            ErrorKind::Unavailable,
            format!(
                "Error: tool '{}' is not available right now: {reason}. Try another way.",
                call.name
            ),
        ));
    }
    Ok(registered)
}

/// Tools a small model is pointed to when it calls a name from the code.
const CODE_TOOLS: [&str; 3] = ["grep", "read_file", "edit_file"];

/// Words of a tool-like name: `read_fiel`, `list_files` or `run_shell` is a
/// wrong tool name, not a name from the project's code.
const TOOLISH_WORDS: [&str; 12] = [
    "file", "dir", "folder", "read", "write", "edit", "list", "grep", "glob", "search", "bash", "shell",
];

/// A small model asked to fix `slugify` or add `is_palindrome` calls a
/// tool of that name. When the unknown name is a plain identifier that does
/// not speak of files or commands, and the file tools are there, the
/// refusal says how such a name is reached: found, read and changed in its
/// file.
fn code_name_hint(name: &str, registry: &ToolRegistry) -> String {
    let lower = name.to_ascii_lowercase();
    let identifier = name.len() > 2
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let toolish = TOOLISH_WORDS.iter().any(|word| lower.contains(word));
    if !identifier || toolish || !CODE_TOOLS.iter().all(|tool| registry.get(tool).is_some()) {
        return String::new();
    }
    format!(
        " If '{name}' is a function or another name in the project's code, it is not a tool: find its file with \
grep (pattern '{name}'), read it with read_file and change it with edit_file."
    )
}

/// Stage 2: the arguments must be a JSON object matching the tool's schema.
pub(crate) fn validate(call: &ToolCall, registered: &RegisteredTool, arguments: &Value) -> Result<Value, Rejection> {
    let args = match arguments {
        Value::Null => Value::Object(Default::default()),
        // Arguments that arrived as text the model could not make valid JSON.
        Value::String(raw) => crate::json_strict::parse_strict(raw).map_err(|err| {
            Rejection::new(
                ErrorKind::InvalidArguments,
                format!(
                    "Error: the arguments for '{}' are not valid JSON ({err}). Send the arguments as one JSON object matching the tool's schema.",
                    call.name
                ),
            )
        })?,
        other => other.clone(),
    };
    let violations: Vec<String> = registered
        .validator
        .iter_errors(&args)
        .take(MAX_REPORTED_VIOLATIONS)
        .map(|violation| {
            let at = violation.instance_path().to_string();
            if at.is_empty() {
                violation.to_string()
            } else {
                format!("at {at}: {violation}")
            }
        })
        .collect();
    if violations.is_empty() {
        if let Some((argument, tail)) = escaped_args::copied_tail(&args) {
            return Err(Rejection::new(
                ErrorKind::InvalidArguments,
                escaped_args::refusal(&call.name, &argument, &tail),
            ));
        }
        return Ok(args);
    }
    Err(Rejection::new(
        ErrorKind::InvalidArguments,
        format!(
            "Error: invalid arguments for '{}': {}. Expected arguments matching this JSON Schema: {}",
            call.name,
            violations.join("; "),
            registered.spec.parameters
        ),
    ))
}
