//! What a client asks: each method with its typed params ([`Request`]),
//! read strictly (unknown fields refused).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use loom_core::{PermissionDecision, RunStatus};

use crate::error::{ApiError, Code};

/// What happens to a new run on a session that already has a live one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Wait for the live run to end, then continue its conversation.
    #[default]
    Enqueue,
    /// Refuse with `CONFLICT`.
    Reject,
    /// Give the prompt to the live run at its next turn.
    Steer,
    /// Cancel the live run, then start.
    Interrupt,
}

/// `agent.run` / `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartRun {
    /// The task.
    pub prompt: String,
    /// The conversation to continue (default: a new one, named after the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// One of the models the server allows (default: its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tool turns before the final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Only these of the server's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The permission mode (docs/server.md, "Permission modes"): one the
    /// server's `allowed_modes` lists (default: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<loom_core::Mode>,
    /// The same key with the same payload returns the same run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// What happens when the session has a live run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_busy: Option<OnBusy>,
    /// A W3C trace context: the run's trace span becomes the child of
    /// this span (docs/telemetry.md). Over HTTP the `traceparent` header
    /// gives it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<loom_core::TraceParent>,
}

/// A run id.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunIdParams {
    /// The run.
    pub run_id: String,
}

/// `run.rewind` (docs/rewind.md).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RewindParams {
    /// The run; it must not be executing.
    pub run_id: String,
    /// The step: 0 is before any tool ran (and before the run's prompt),
    /// N after the tools of step N.
    pub step: u32,
    /// Restore the workspace (default true).
    #[serde(default = "yes")]
    pub files: bool,
    /// Make the session continue from the conversation as of the step
    /// (default true).
    #[serde(default = "yes")]
    pub conversation: bool,
    /// Only say what would change.
    #[serde(default)]
    pub dry_run: bool,
    /// Restore files changed outside Loom since it last recorded them.
    #[serde(default)]
    pub force: bool,
}

fn yes() -> bool {
    true
}

/// `run.fork` (docs/rewind.md).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkParams {
    /// The run; it must not be executing.
    pub run_id: String,
    /// The step the new session starts from.
    pub step: u32,
    /// Start the new session's first run with this prompt (its events then
    /// follow on the connection); without one the session waits for an
    /// `agent.run` with its `sessionId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Restore files changed outside Loom since it last recorded them.
    #[serde(default)]
    pub force: bool,
    /// A W3C trace context for the prompt's run, as in `agent.run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<loom_core::TraceParent>,
}

/// `run.file` (docs/rewind.md): one file as a step's snapshot holds it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileParams {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u32,
    /// The file's path in the workspace.
    pub path: String,
}

/// `agent.steer`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SteerParams {
    /// The run.
    pub run_id: String,
    /// The user message that joins at the next turn.
    pub message: String,
}

/// `POST /v1/runs/{id}/steer`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SteerBody {
    /// The user message that joins at the next turn.
    pub message: String,
}

/// `permission.respond`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RespondParams {
    /// The run.
    pub run_id: String,
    /// The ask.
    pub request_id: String,
    /// The answer.
    pub decision: PermissionDecision,
}

/// `POST /v1/runs/{id}/permissions/{requestId}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecisionBody {
    /// The answer.
    pub decision: PermissionDecision,
}

/// `permission.list`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PermissionListParams {
    /// Only this run's asks.
    #[serde(default)]
    pub run_id: Option<String>,
}

/// `run.list` / `GET /v1/runs`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListParams {
    /// Only runs in this status.
    #[serde(default)]
    pub status: Option<RunStatus>,
    /// Only the runs of this session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// At most this many (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<usize>,
    /// `nextCursor` of the page before.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `run.subscribe`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscribeParams {
    /// The run.
    pub run_id: String,
    /// Only events after this `seq` (default 0: all).
    #[serde(default)]
    pub after_seq: u64,
}

/// A request: its method and typed params (`payload` on the WebSocket, the
/// path and body over HTTP).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(tag = "method", content = "payload", deny_unknown_fields)]
pub enum Request {
    /// Start a run (its events then follow on the connection).
    #[serde(rename = "agent.run")]
    Run(StartRun),
    /// Cancel a run; answered once it has stopped.
    #[serde(rename = "agent.cancel")]
    Cancel(RunIdParams),
    /// A user message for a live run's next turn.
    #[serde(rename = "agent.steer")]
    Steer(SteerParams),
    /// Answer a permission ask.
    #[serde(rename = "permission.respond")]
    Respond(RespondParams),
    /// The asks waiting for an answer.
    #[serde(rename = "permission.list")]
    Asks(PermissionListParams),
    /// One run.
    #[serde(rename = "run.get")]
    Get(RunIdParams),
    /// A page of runs.
    #[serde(rename = "run.list")]
    List(ListParams),
    /// Follow a run's events after a seq.
    #[serde(rename = "run.subscribe")]
    Subscribe(SubscribeParams),
    /// Stop following a run.
    #[serde(rename = "run.unsubscribe")]
    Unsubscribe(RunIdParams),
    /// Take a run that is not executing back to a step.
    #[serde(rename = "run.rewind")]
    Rewind(RewindParams),
    /// Start a new session from a step of a run that is not executing.
    #[serde(rename = "run.fork")]
    Fork(ForkParams),
    /// One file as a step's snapshot holds it (for a diff).
    #[serde(rename = "run.file")]
    File(FileParams),
}

impl Request {
    /// Every method's name.
    pub const METHODS: [&'static str; 12] = [
        "agent.run",
        "agent.cancel",
        "agent.steer",
        "permission.respond",
        "permission.list",
        "run.get",
        "run.list",
        "run.subscribe",
        "run.unsubscribe",
        "run.rewind",
        "run.fork",
        "run.file",
    ];

    /// The request `method` with `payload`: `METHOD_NOT_FOUND` for a method
    /// there is not; `INVALID_PARAMS` for a payload that is not an object
    /// (absent is `{}`), lacks a field, or has one the method does not know.
    pub fn parse(method: &str, payload: Value) -> Result<Self, ApiError> {
        if !Self::METHODS.contains(&method) {
            return Err(ApiError::new(Code::MethodNotFound, format!("no method '{method}'")));
        }
        let payload = match payload {
            Value::Null => Value::Object(serde_json::Map::new()),
            object @ Value::Object(_) => object,
            _ => return Err(ApiError::new(Code::InvalidParams, "the payload must be a JSON object")),
        };
        let mut request = serde_json::Map::new();
        request.insert("method".into(), Value::String(method.into()));
        request.insert("payload".into(), payload);
        serde_json::from_value(Value::Object(request))
            .map_err(|err| ApiError::new(Code::InvalidParams, err.to_string()))
    }
}

/// An HTTP body: a JSON object (or nothing), never a list or a scalar,
/// parsed into `T` (whose unknown fields are refused).
pub(crate) fn object_params<T: serde::de::DeserializeOwned>(payload: Value) -> Result<T, ApiError> {
    let payload = match payload {
        Value::Null => Value::Object(serde_json::Map::new()),
        object @ Value::Object(_) => object,
        _ => return Err(ApiError::new(Code::InvalidParams, "the payload must be a JSON object")),
    };
    serde_json::from_value(payload).map_err(|err| ApiError::new(Code::InvalidParams, err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_method_parses_and_nothing_else_does() {
        let minimal = |method: &str| match method {
            "agent.run" => json!({"prompt": "hi"}),
            "agent.steer" => json!({"runId": "r", "message": "m"}),
            "permission.respond" => json!({"runId": "r", "requestId": "q", "decision": "allow"}),
            "permission.list" | "run.list" => json!({}),
            "run.rewind" | "run.fork" => json!({"runId": "r", "step": 1}),
            "run.file" => json!({"runId": "r", "step": 1, "path": "a.txt"}),
            _ => json!({"runId": "r"}),
        };
        for method in Request::METHODS {
            let parsed = Request::parse(method, minimal(method));
            assert!(parsed.is_ok(), "{method}: {parsed:?}");
        }
        let unknown = Request::parse("agent.fly", json!({})).unwrap_err();
        assert_eq!(unknown.code, Code::MethodNotFound);
    }

    #[test]
    fn params_are_objects_of_known_fields() {
        for (payload, why) in [
            (json!(["hi"]), "a list"),
            (json!("hi"), "a string"),
            (json!({"prompt": "hi", "colour": "red"}), "an unknown field"),
            (json!({}), "no prompt"),
        ] {
            let refused = Request::parse("agent.run", payload).unwrap_err();
            assert_eq!(refused.code, Code::InvalidParams, "{why}");
        }
        assert!(Request::parse("run.list", Value::Null).is_ok(), "absent is {{}}");
    }
}
