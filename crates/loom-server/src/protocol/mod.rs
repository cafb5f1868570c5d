//! What clients send and receive, as types: each request with its typed
//! params ([`Request`]), each answer ([`Answer`]), the frames around them
//! and the views of runs — shared by the WebSocket methods and the HTTP
//! routes (docs/server.md), and published as a JSON Schema
//! ([`schema`], `loom serve --print-schema`, docs/protocol.schema.json).

mod answers;
mod frames;
mod requests;

pub use answers::*;
pub use frames::*;
pub use requests::*;

use schemars::JsonSchema;
use serde_json::Value;

use crate::error::ApiError;

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
