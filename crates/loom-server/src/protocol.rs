//! What clients send and receive: method payloads and the views of runs,
//! shared by the WebSocket methods and the HTTP routes (docs/server.md).

use loom_core::{PermissionDecision, RunMetrics, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What happens to a new run on a session that already has a live one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The same key with the same payload returns the same run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// What happens when the session has a live run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_busy: Option<OnBusy>,
}

/// A run id.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunIdParams {
    /// The run.
    pub run_id: String,
}

/// `agent.steer`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SteerParams {
    /// The run.
    pub run_id: String,
    /// The user message that joins at the next turn.
    pub message: String,
}

/// `POST /v1/runs/{id}/steer`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SteerBody {
    /// The user message that joins at the next turn.
    pub message: String,
}

/// `permission.respond`.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecisionBody {
    /// The answer.
    pub decision: PermissionDecision,
}

/// `permission.list`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PermissionListParams {
    /// Only this run's asks.
    #[serde(default)]
    pub run_id: Option<String>,
}

/// `run.list` / `GET /v1/runs`.
#[derive(Debug, Clone, Default, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscribeParams {
    /// The run.
    pub run_id: String,
    /// Only events after this `seq` (default 0: all).
    #[serde(default)]
    pub after_seq: u64,
}

/// The answer to a started run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAccepted {
    /// The run (for `onBusy: steer`, the live run the prompt joined).
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// `QUEUED` or `RUNNING` (or where a run of an idempotent retry is now).
    pub status: RunStatus,
    /// Its place in the queue, 1 first, while `QUEUED`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// True when the prompt joined a live run (`onBusy: steer`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub steered: bool,
}

/// An ask waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAsk {
    /// The run.
    pub run_id: String,
    /// The ask, as in `permission.request`.
    pub request_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub args: Value,
    /// The rule that asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The `seq` of its `permission.request`.
    pub seq: u64,
}

/// A run as `run.get` and `run.list` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Its status.
    pub status: RunStatus,
    /// The task.
    pub prompt: String,
    /// The model.
    pub model: String,
    /// Start (or submission, while queued), ms since the epoch.
    pub started_ms: u64,
    /// End.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// The answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Steps, tokens, cost, tools.
    pub metrics: RunMetrics,
    /// Asks waiting for an answer.
    pub pending_asks: Vec<PendingAsk>,
    /// Its place in the queue while `QUEUED`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// The `seq` of its last event seen by the server.
    pub last_seq: u64,
    /// The run whose `task` call started it, for a sub-agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
}

/// A page of `run.list`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPage {
    /// Newest first.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to a cancel: given once the run has stopped.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Always true.
    pub cancelled: bool,
    /// The `seq` of the run's last event (`lifecycle.end`).
    pub final_seq: u64,
}

/// A request's params: a JSON object (or nothing), never a list or a
/// scalar, parsed into `T` (whose unknown fields are refused).
pub(crate) fn object_params<T: serde::de::DeserializeOwned>(
    payload: serde_json::Value,
) -> Result<T, crate::error::ApiError> {
    use crate::error::{ApiError, Code};
    let payload = match payload {
        serde_json::Value::Null => serde_json::Value::Object(serde_json::Map::new()),
        object @ serde_json::Value::Object(_) => object,
        _ => return Err(ApiError::new(Code::InvalidParams, "the payload must be a JSON object")),
    };
    serde_json::from_value(payload).map_err(|err| ApiError::new(Code::InvalidParams, err.to_string()))
}
