//! Discover and validate, and the wording of the results they refuse with.

use serde_json::Value;

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
        return Err(Rejection::new(
            ErrorKind::UnknownTool,
            format!(
                "Error: there is no tool named '{}'. Available tools: {list}. Call one of them by its exact name.",
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
