//! Request bodies: a layer that reads each body once within the size limit
//! and the body timeout (`max_frame_bytes`, `body_timeout_secs`), and the
//! extractor that parses it strictly (`Content-Type: application/json`, an
//! object, no key repeated in any object, unknown fields refused by each
//! type). Handlers only name the
//! type they take: `JsonBody<StartRun>`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Code};
use crate::App;

/// Reads the body within the limit and the timeout, before the handler
/// runs. A client that sends less than its `Content-Length` and waits gets
/// `REQUEST_TIMEOUT`, and the connection closes with the answer (its body
/// was not read to the end); one over the limit gets `PAYLOAD_TOO_LARGE`.
pub(crate) async fn bounded(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let config = app.service.config();
    let (limit, patience) = (config.max_frame_bytes, config.body_timeout);
    let (parts, body) = request.into_parts();
    // Announced over the limit: refused at once, not after waiting for it.
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if announced.is_some_and(|length| length > limit as u64) {
        return too_large(limit).into_response();
    }
    let read = match tokio::time::timeout(patience, axum::body::to_bytes(body, limit)).await {
        Ok(read) => read,
        Err(_) => {
            metrics::counter!("loom_http_timeouts_total", "kind" => "body").increment(1);
            return ApiError::new(
                Code::RequestTimeout,
                format!("the body did not arrive within {} s", patience.as_secs_f64()),
            )
            .into_response();
        }
    };
    let Ok(bytes) = read else {
        return too_large(limit).into_response();
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        Code::PayloadTooLarge,
        format!("the body is over the limit of {limit} bytes"),
    )
}

/// A JSON object body of type `T` (an empty body reads as `{}`), from a
/// request whose body [`bounded`] has read.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = request.into_parts();
        // Already in memory and within the limit (the layer read it).
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .map_err(|err| ApiError::internal("the body could not be read", err))?;
        // Not JSON at all is a parse error whatever it was labelled; JSON
        // must also say so; a key repeated in any of its objects is
        // refused, not settled by keeping one value.
        let (value, repeated_key) = crate::protocol::read_strictly(if bytes.is_empty() { b"{}" } else { &bytes })
            .map_err(|err| ApiError::new(Code::ParseError, format!("not JSON: {err}")))?;
        if !bytes.is_empty() && !is_json(&parts.headers) {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "a body must be sent with Content-Type: application/json",
            ));
        }
        if let Some(why) = repeated_key {
            return Err(ApiError::new(Code::InvalidParams, why));
        }
        crate::protocol::object_params(value).map(JsonBody)
    }
}

/// Whether the request says its body is JSON (`application/json`, any parameters).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::CONTENT_TYPE;

    fn request(content_type: Option<&str>, body: &'static str) -> Request {
        let mut builder = Request::builder().method("POST").uri("/");
        if let Some(media) = content_type {
            builder = builder.header(CONTENT_TYPE, media);
        }
        builder.body(Body::from(body)).unwrap_or_default()
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Message {
        message: String,
    }

    async fn parse(content_type: Option<&str>, body: &'static str) -> Result<Message, Code> {
        JsonBody::<Message>::from_request(request(content_type, body), &())
            .await
            .map(|JsonBody(message)| message)
            .map_err(|err| err.code)
    }

    #[tokio::test]
    async fn a_body_is_a_json_object_of_the_type_sent_as_json() {
        let ok = parse(Some("application/json; charset=utf-8"), r#"{"message":"hi"}"#).await;
        assert_eq!(ok.map(|m| m.message), Ok("hi".to_string()));
        assert_eq!(
            parse(None, r#"{"message":"hi"}"#).await.unwrap_err(),
            Code::InvalidRequest
        );
        assert_eq!(
            parse(Some("text/plain"), r#"{"message":"hi"}"#).await.unwrap_err(),
            Code::InvalidRequest
        );
        // Not JSON at all: a parse error, whatever it was labelled.
        assert_eq!(parse(Some("text/plain"), "hello").await.unwrap_err(), Code::ParseError);
        assert_eq!(
            parse(Some("application/json"), "{not json").await.unwrap_err(),
            Code::ParseError
        );
        assert_eq!(
            parse(Some("application/json"), r#"["hi"]"#).await.unwrap_err(),
            Code::InvalidParams
        );
        // A key repeated: refused, not settled by keeping the last.
        assert_eq!(
            parse(Some("application/json"), r#"{"message":"hi","message":"ho"}"#)
                .await
                .unwrap_err(),
            Code::InvalidParams
        );
        assert_eq!(
            parse(Some("application/json"), r#"{"message":"hi","extra":1}"#)
                .await
                .unwrap_err(),
            Code::InvalidParams
        );
    }
}
