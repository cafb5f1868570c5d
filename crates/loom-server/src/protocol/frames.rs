//! The WebSocket frames around requests, answers and events, and how a
//! request frame is read.

use loom_core::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Answer, Request};
use crate::error::{ApiError, Code};

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
}
