//! The gateway's error codes (docs/server.md) and how each reads in a
//! WebSocket response and an HTTP answer.

use std::time::Duration;

use axum::http::StatusCode;
use serde::Serialize;

/// An error code of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    /// The frame or body is not JSON.
    ParseError,
    /// JSON, but not a request.
    InvalidRequest,
    /// No such method.
    MethodNotFound,
    /// The payload does not fit the method.
    InvalidParams,
    /// No such run (or not this token's).
    NotFound,
    /// The run is not in a state that allows this.
    InvalidState,
    /// No valid token.
    Unauthorized,
    /// A request this token may not make: a change by a viewer, a model
    /// or tool the token is not granted, the audit trail read by a
    /// non-admin; or a state change with the page's session cookie from
    /// another origin.
    Forbidden,
    /// The frame or body is over the size limit.
    PayloadTooLarge,
    /// The body did not arrive within the body timeout.
    RequestTimeout,
    /// Too many requests from this token.
    RateLimited,
    /// Too many runs waiting.
    Overloaded,
    /// A busy session with `onBusy: reject`, or an idempotency key reused
    /// with another payload.
    Conflict,
    /// The store cannot be reached now (a Redis that is down or restarting,
    /// a database locked by another process): try again (`retryAfterMs`).
    Unavailable,
    /// A fault of the server.
    Internal,
}

impl Code {
    /// The HTTP status that carries it.
    pub fn status(self) -> StatusCode {
        match self {
            Self::ParseError | Self::InvalidRequest | Self::InvalidParams => StatusCode::BAD_REQUEST,
            Self::MethodNotFound | Self::NotFound => StatusCode::NOT_FOUND,
            Self::InvalidState | Self::Conflict => StatusCode::CONFLICT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::RateLimited | Self::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    /// The code.
    pub code: Code,
    /// What happened, for a person.
    pub message: String,
    /// When to try again, in milliseconds, for `RATE_LIMITED`, `OVERLOADED` and `UNAVAILABLE`.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "millis")]
    #[schemars(with = "Option<u64>")]
    pub retry_after_ms: Option<Duration>,
}

fn millis<S: serde::Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(d) => serializer.serialize_u64(d.as_millis() as u64),
        None => serializer.serialize_none(),
    }
}

impl ApiError {
    /// An error with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// With a time to try again after.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after_ms = Some(after);
        self
    }

    /// `NOT_FOUND` for a run id: the same for a run that does not exist
    /// and for another token's, so ids cannot be probed.
    pub fn no_run(run_id: &str) -> Self {
        Self::new(Code::NotFound, format!("no run '{run_id}'"))
    }

    /// `INTERNAL`, logged with its cause (never shown to the client).
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "{context}");
        Self::new(Code::Internal, format!("{context}; see the server's log"))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}
