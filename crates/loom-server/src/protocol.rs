//! What clients send and receive, as types: each request with its typed
//! params ([`Request`]), each answer ([`Answer`]), the frames around them
//! and the views of runs — shared by the WebSocket methods and the HTTP
//! routes (docs/server.md), and published as a JSON Schema
//! ([`schema`], `loom serve --print-schema`, docs/protocol.schema.json).

use loom_core::{Event, PermissionDecision, RunMetrics, RunStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// `run.file`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotFile {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u32,
    /// The path.
    pub path: String,
    /// Whether the snapshot holds the file.
    pub exists: bool,
    /// Its text (`null` when absent or not UTF-8); at most 256 KiB.
    pub content: Option<String>,
    /// True when the text was cut at 256 KiB.
    pub truncated: bool,
}

/// `run.rewind`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rewound {
    /// The run.
    pub run_id: String,
    /// The step.
    pub to_step: u32,
    /// True when nothing was changed.
    pub dry_run: bool,
    /// Files written (or that would be).
    pub write: Vec<String>,
    /// Files removed (or that would be).
    pub remove: Vec<String>,
    /// Files among those changed outside Loom (a rewind without `force`
    /// is refused when there are any).
    pub changed_outside: Vec<String>,
    /// The run the session now continues from.
    pub continued_by: Option<String>,
}

/// `run.fork`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    /// The run forked from.
    pub run_id: String,
    /// The step.
    pub step: u32,
    /// The new session.
    pub session_id: String,
    /// Its first run: the one holding the conversation (`forkedFrom`).
    pub fork_run_id: String,
    /// Files restored.
    pub write: Vec<String>,
    /// Files removed.
    pub remove: Vec<String>,
    /// The run the prompt started, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<RunAccepted>,
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

/// The answer to a started run.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAccepted {
    /// The run (for `onBusy: steer`, the live run the prompt joined).
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// `QUEUED` or `RUNNING` (or where a run of an idempotent retry is now).
    pub status: RunStatus,
    /// Its place in the queue, 1 first, while `QUEUED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// True when the prompt joined a live run (`onBusy: steer`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steered: bool,
}

/// An ask waiting for an answer, as the run shows it.
pub use loom_core::PendingAsk;

/// A run as `run.get` and `run.list` show it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// The answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Steps, tokens, cost, tools.
    pub metrics: RunMetrics,
    /// Asks waiting for an answer.
    pub pending_asks: Vec<PendingAsk>,
    /// Its place in the queue while `QUEUED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// The `seq` of its last event seen by the server.
    pub last_seq: u64,
    /// The run whose `task` call started it, for a sub-agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
}

/// A page of `run.list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunPage {
    /// Newest first.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to a cancel: given once the run has stopped.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Always true.
    pub cancelled: bool,
    /// The `seq` of the run's last event (`lifecycle.end`).
    pub final_seq: u64,
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

/// `agent.steer`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Steered {
    /// The run.
    pub run_id: String,
    /// Always true: the message joins at the run's next turn.
    pub accepted: bool,
}

/// `permission.respond`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Responded {
    /// The run.
    pub run_id: String,
    /// The ask.
    pub request_id: String,
    /// The answer given.
    pub decision: PermissionDecision,
}

/// `permission.list`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Asks {
    /// Oldest first.
    pub asks: Vec<PendingAsk>,
}

/// `run.subscribe`'s answer; the events follow.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subscribed {
    /// The run.
    pub run_id: String,
    /// Events after this seq follow.
    pub after_seq: u64,
}

/// `run.unsubscribe`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unsubscribed {
    /// The run.
    pub run_id: String,
    /// Always true.
    pub unsubscribed: bool,
}

/// The answer to a [`Request`], one type per method.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Answer {
    /// `agent.run`.
    Accepted(RunAccepted),
    /// `agent.cancel`.
    Cancelled(Cancelled),
    /// `agent.steer`.
    Steered(Steered),
    /// `permission.respond`.
    Responded(Responded),
    /// `permission.list`.
    Asks(Asks),
    /// `run.get`.
    Run(Box<RunView>),
    /// `run.list`.
    Page(RunPage),
    /// `run.subscribe`.
    Subscribed(Subscribed),
    /// `run.unsubscribe`.
    Unsubscribed(Unsubscribed),
    /// `run.rewind`.
    Rewound(Rewound),
    /// `run.fork`.
    Forked(Box<Forked>),
    /// `run.file`.
    File(SnapshotFile),
}

/// `"request"`, `"response"`, `"event"`: what a WebSocket frame is.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FrameType {
    /// A client's request.
    Request,
    /// The server's answer to one.
    Response,
    /// An event of a run the connection follows.
    Event,
}

/// A request's `id`: the client's, echoed in the response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FrameId {
    /// A number.
    Number(serde_json::Number),
    /// A string.
    Text(String),
}

/// What a client sends over the WebSocket: these fields and no other. The
/// server also takes a request without `payload` when all of its method's
/// params are optional (`run.list`, `permission.list`).
#[derive(Debug, Clone, JsonSchema)]
#[schemars(extend("unevaluatedProperties" = false))]
#[allow(dead_code)] // described for the schema; read field by field (`RequestFrame::read`)
pub struct RequestFrame {
    /// Always `"request"`.
    r#type: FrameType,
    /// Echoed in the response.
    id: FrameId,
    /// The method and its payload.
    #[schemars(flatten)]
    request: Request,
}

/// The fields a request frame has.
const FRAME_FIELDS: [&str; 4] = ["type", "id", "method", "payload"];

/// A request frame as read, before its payload is typed: the id to echo,
/// the method and the payload (`null` when absent). The payload is typed by
/// [`Request::parse`] only once the request is admitted (its rate), so a
/// flood of bad payloads pays the rate like any other.
#[derive(Debug, Clone)]
pub struct FrameEnvelope {
    /// Echoed in the response.
    pub id: FrameId,
    /// The method's name.
    pub method: String,
    /// Its payload.
    pub payload: Value,
    /// Why the frame is refused with `INVALID_PARAMS` once admitted, when
    /// one of its objects repeats a key (`{"mode":"bypass","mode":"default"}`):
    /// `duplicate key "mode" at line 1 column 33`.
    pub repeated_key: Option<String>,
}

impl RequestFrame {
    /// The id of a request frame, read without keeping the rest (for a
    /// refusal made before the frame is admitted, such as too many requests
    /// in progress): none when the text is no JSON object, its id is no
    /// string or number, or the frame is over `max_bytes` (not read at all).
    pub fn id_of(text: &str, max_bytes: usize) -> Option<FrameId> {
        #[derive(Deserialize)]
        struct IdOnly {
            id: Option<FrameId>,
        }
        if text.len() > max_bytes || !text.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str::<IdOnly>(text).ok()?.id
    }

    /// Reads the text of a WebSocket frame: `PARSE_ERROR` for text that is
    /// not JSON, `INVALID_REQUEST` for JSON that is not a request frame (a
    /// field it does not have; no `type: request`, `id` or `method`), with
    /// the id when one could be read. A key repeated in any object of the
    /// frame is told in [`FrameEnvelope::repeated_key`].
    pub fn read(text: &str) -> Result<FrameEnvelope, (Option<FrameId>, ApiError)> {
        let (frame, repeated_key) = read_strictly(text.as_bytes())
            .map_err(|err| (None, ApiError::new(Code::ParseError, format!("not JSON: {err}"))))?;
        let id = frame
            .get("id")
            .and_then(|id| serde_json::from_value::<FrameId>(id.clone()).ok());
        let unknown = frame
            .as_object()
            .and_then(|fields| fields.keys().find(|key| !FRAME_FIELDS.contains(&key.as_str())));
        if let Some(field) = unknown {
            let error = ApiError::new(Code::InvalidRequest, format!("unknown field '{field}' in the frame"));
            return Err((id, error));
        }
        let (Some("request"), Some(method), Some(id)) = (
            frame.get("type").and_then(Value::as_str),
            frame.get("method").and_then(Value::as_str),
            id.clone(),
        ) else {
            let error = ApiError::new(
                Code::InvalidRequest,
                "a request is {\"type\":\"request\",\"id\":…,\"method\":…,\"payload\":{…}}",
            );
            return Err((id, error));
        };
        Ok(FrameEnvelope {
            id,
            method: method.to_string(),
            payload: frame.get("payload").cloned().unwrap_or(Value::Null),
            repeated_key,
        })
    }
}

/// JSON text (a frame, a body) read once, refusing no repeated key yet:
/// the value, and why it is to be refused if one of its objects repeats a
/// key. Only such text is read a second time (as `serde_json` reads it,
/// the last value of a key kept), for what the refusal needs (a frame's
/// id) and to tell it from text that is not JSON at all.
pub(crate) fn read_strictly(text: &[u8]) -> Result<(Value, Option<String>), serde_json::Error> {
    match loom_core::json_strict::parse_strict_slice(text) {
        Ok(value) => Ok((value, None)),
        Err(strict) => {
            let value = serde_json::from_slice(text)?;
            Ok((value, Some(format!("a key may appear once in an object: {strict}"))))
        }
    }
}

/// The server's answer to a request frame.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ResponseFrame {
    /// It worked.
    Ok {
        /// Always `"response"`.
        r#type: FrameType,
        /// The request's id (null when the frame could not be read).
        id: Option<FrameId>,
        /// Always true.
        ok: bool,
        /// The method's answer.
        payload: Answer,
    },
    /// It did not.
    Failed {
        /// Always `"response"`.
        r#type: FrameType,
        /// The request's id (null when the frame could not be read).
        id: Option<FrameId>,
        /// Always false.
        ok: bool,
        /// Why.
        error: ApiError,
    },
}

/// An event of a followed run (or of its sub-agents).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventFrame {
    /// Always `"event"`.
    pub r#type: FrameType,
    /// The event's name (its payload's `type`).
    pub event: String,
    /// The run it belongs to.
    pub run_id: String,
    /// Its seq in that run.
    pub seq: u64,
    /// The event (docs/events.md).
    pub payload: Event,
}

/// Everything the protocol sends, for the schema's root.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a shape for the schema, never built
struct Protocol {
    /// A client's WebSocket frame.
    request: RequestFrame,
    /// The server's answer frame.
    response: ResponseFrame,
    /// An event frame.
    event: EventFrame,
    /// The body of every HTTP error: `{"error": …}`.
    http_error: HttpError,
}

/// An HTTP error's body.
#[derive(JsonSchema)]
#[allow(dead_code)] // a shape for the schema, never built
struct HttpError {
    /// The error.
    error: ApiError,
}

/// The protocol's JSON Schema (draft 2020-12): the root's properties name
/// the frames, `$defs` every type. Clients in other languages generate
/// their types from it; docs/protocol.schema.json is a copy a test keeps
/// current.
pub fn schema() -> Value {
    let schema = schemars::schema_for!(Protocol);
    serde_json::to_value(schema).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_a_frame_refused_unread_is_its_own_or_none() {
        let frame = r#"{"type":"request","id":"r7","method":"run.list","payload":{"a":[1,2]}}"#;
        assert!(matches!(RequestFrame::id_of(frame, 1024), Some(FrameId::Text(id)) if id == "r7"));
        let numbered = r#"{"id":12,"method":"run.list"}"#;
        assert!(matches!(RequestFrame::id_of(numbered, 1024), Some(FrameId::Number(_))));
        // No id to echo: none rather than a wrong one.
        for text in [
            r#"["r7"]"#,
            r#"{"id":{"a":1}}"#,
            r#"{"id":true}"#,
            "not json",
            r#"{"method":"x"}"#,
        ] {
            assert!(RequestFrame::id_of(text, 1024).is_none(), "{text}");
        }
        // Over the limit: not read at all.
        assert!(RequestFrame::id_of(frame, 10).is_none());
    }
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

    #[test]
    fn a_frame_repeating_a_key_is_read_with_its_id_and_marked_for_refusal() {
        let envelope = RequestFrame::read(
            r#"{"type":"request","id":"r7","method":"agent.run","payload":{"prompt":"hi","mode":"bypass","mode":"default"}}"#,
        )
        .unwrap();
        assert!(
            matches!(&envelope.id, FrameId::Text(id) if id == "r7"),
            "{:?}",
            envelope.id
        );
        let why = envelope.repeated_key.unwrap_or_default();
        assert!(why.contains("duplicate key \"mode\""), "{why}");
        let clean = RequestFrame::read(r#"{"type":"request","id":1,"method":"run.list"}"#).unwrap();
        assert_eq!(clean.repeated_key, None);
        let (_, broken) = RequestFrame::read(r#"{"type":"request","id":1,"id":2"#).unwrap_err();
        assert_eq!(broken.code, Code::ParseError, "not JSON, repeated key or not");
    }

    #[test]
    fn the_schema_names_every_method_and_event() {
        let text = schema().to_string();
        for method in Request::METHODS {
            assert!(text.contains(&format!("\"{method}\"")), "{method}");
        }
        for event in loom_core::EventKind::NAMES {
            assert!(text.contains(&format!("\"{event}\"")), "{event}");
        }
    }
}
