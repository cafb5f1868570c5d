//! The outcome of one tool call, as the model and the event stream see it.

use serde::{Deserialize, Serialize};

/// How a tool call ended. Serialized in lowercase in `tool.result` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    /// The tool ran and produced output.
    Success,
    /// The tool ran but something deserves the model's attention
    /// (for example it produced no output at all).
    Warning,
    /// The call failed: unknown tool, invalid arguments, tool error or panic.
    Error,
    /// A permission rule refused the call; the tool never ran.
    Denied,
    /// The call ran past its time limit and was stopped.
    Timeout,
    /// The run was cancelled while the call was pending or running.
    Cancelled,
}

impl ToolStatus {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Denied => "denied",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the call counts as failed in metrics.
    pub fn is_failure(self) -> bool {
        !matches!(self, Self::Success | Self::Warning)
    }
}

/// Microseconds spent in each stage of the tool pipeline for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageTimings {
    /// Looking the tool up and checking it is available.
    pub discover_us: u64,
    /// Checking the arguments against the tool's JSON Schema.
    pub validate_us: u64,
    /// Hooks and permissions, including any wait for a person's answer.
    pub authorize_us: u64,
    /// Running the tool.
    pub execute_us: u64,
    /// Hooks, secret redaction and truncation of the output.
    pub format_us: u64,
}

/// Why a call did not succeed, machine-readable (`errorKind` in a stored
/// result). Read back from a store, a name this build does not know is
/// kept as it is (`Other`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ErrorKind {
    /// No tool of that name.
    UnknownTool,
    /// The tool is not available now (an MCP server down).
    Unavailable,
    /// The arguments do not match the tool's schema.
    InvalidArguments,
    /// The tool failed.
    ToolError,
    /// The tool panicked.
    Panic,
    /// The call could not be journaled, so it was not run.
    Journal,
    /// The tool returned nothing.
    EmptyOutput,
    /// The run was cancelled during the call.
    Cancelled,
    /// A rule, a hook or a person said no.
    Denied,
    /// The call ran out of time.
    Timeout,
    /// Stopped by an interrupt before the call began: a resumed run may
    /// run it (see [`crate::resume`]).
    NotStarted,
    /// Cut short by an interrupt or a crash: its effect is unknown.
    Interrupted,
    /// A kind from another version of Loom.
    Other(String),
}

impl ErrorKind {
    /// The name as stored and sent.
    pub fn as_str(&self) -> &str {
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::Unavailable => "unavailable",
            Self::InvalidArguments => "invalid_arguments",
            Self::ToolError => "tool_error",
            Self::Panic => "panic",
            Self::Journal => "journal",
            Self::EmptyOutput => "empty_output",
            Self::Cancelled => "cancelled",
            Self::Denied => "denied",
            Self::Timeout => "timeout",
            Self::NotStarted => "not_started",
            Self::Interrupted => "INTERRUPTED",
            Self::Other(name) => name,
        }
    }
}

impl From<String> for ErrorKind {
    fn from(name: String) -> Self {
        let known = [
            Self::UnknownTool,
            Self::Unavailable,
            Self::InvalidArguments,
            Self::ToolError,
            Self::Panic,
            Self::Journal,
            Self::EmptyOutput,
            Self::Cancelled,
            Self::Denied,
            Self::Timeout,
            Self::NotStarted,
            Self::Interrupted,
        ];
        known
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .unwrap_or(Self::Other(name))
    }
}

impl From<ErrorKind> for String {
    fn from(kind: ErrorKind) -> Self {
        kind.as_str().to_string()
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Facts about a call that are not part of what the model reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultMetadata {
    /// Wall time of the whole pipeline for this call, in milliseconds.
    pub duration_ms: u64,
    /// Per-stage timings.
    pub stages: StageTimings,
    /// Machine-readable reason for a non-success status (e.g. `unknown_tool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Who let the call run or refused it (`None` for a call settled before
    /// it was authorized: an unknown tool, invalid arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<Authority>,
}

crate::wire::wire_enum! {
    /// Who decided whether a call runs (`decidedBy` in `tool.result`), in
    /// the order of docs/extending.md: a hook, an explicit rule, the
    /// permission mode, the policy's default, a person, or a person's
    /// earlier "always" for the session.
    pub enum Authority {
        /// A hook (a configured command or a library `ToolHook`).
        Hook = "hook",
        /// An explicit `allow` or `deny` rule (an `ask` rule leads to a person).
        Rule = "rule",
        /// The permission mode (`accept-edits`, `bypass`).
        Mode = "mode",
        /// The policy's default decision.
        Default = "default",
        /// A person's answer to this call.
        Person = "person",
        /// A person's "always" earlier in the session.
        Session = "session",
    }
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The call this result answers.
    pub call_id: String,
    /// The tool's name as the model gave it.
    pub name: String,
    /// How the call ended.
    pub status: ToolStatus,
    /// What the model reads.
    pub content: String,
    /// Timing and diagnostics.
    pub metadata: ToolResultMetadata,
}

impl ToolResult {
    /// A result with empty metadata; the pipeline fills timing in.
    pub fn new(
        call_id: impl Into<String>,
        name: impl Into<String>,
        status: ToolStatus,
        content: impl Into<String>,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            name: name.into(),
            status,
            content: content.into(),
            metadata: ToolResultMetadata::default(),
        }
    }

    /// Sets the machine-readable error kind.
    pub fn with_error_kind(mut self, kind: ErrorKind) -> Self {
        self.metadata.error_kind = Some(kind);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_kind_is_stored_by_its_name_and_an_unknown_name_is_kept() {
        for kind in [
            ErrorKind::UnknownTool,
            ErrorKind::Unavailable,
            ErrorKind::InvalidArguments,
            ErrorKind::ToolError,
            ErrorKind::Panic,
            ErrorKind::Journal,
            ErrorKind::EmptyOutput,
            ErrorKind::Cancelled,
            ErrorKind::Denied,
            ErrorKind::Timeout,
            ErrorKind::NotStarted,
            ErrorKind::Interrupted,
        ] {
            let stored = serde_json::to_string(&kind).unwrap_or_default();
            assert_eq!(stored, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<ErrorKind>(&stored).ok(), Some(kind));
        }
        let later = serde_json::from_str::<ErrorKind>("\"rate_limited\"").ok();
        assert_eq!(later, Some(ErrorKind::Other("rate_limited".into())));
        // A result journaled by an earlier build reads as it was written.
        let stored = r#"{"durationMs":3,"stages":{"discoverUs":0,"validateUs":0,"authorizeUs":0,"executeUs":0,"formatUs":0},"errorKind":"not_started"}"#;
        let metadata: Option<ToolResultMetadata> = serde_json::from_str(stored).ok();
        assert_eq!(
            metadata.as_ref().and_then(|m| m.error_kind.clone()),
            Some(ErrorKind::NotStarted)
        );
        let again = metadata.map(|m| serde_json::to_string(&m).unwrap_or_default());
        assert_eq!(again.as_deref(), Some(stored));
    }
}
