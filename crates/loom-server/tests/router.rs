//! `App::router()` in process (`tower::ServiceExt::oneshot`, no socket):
//! every error path of the HTTP API answers its status and its JSON error,
//! before and after the layer that signs requests in and limits their rate.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use loom_core::{async_trait, Agent};
use loom_llm::{ScriptTurn, ScriptedModel};
use loom_server::{AgentFactory, AgentSpec, App, ServerConfig, ServerSettings, Service};
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "alice-token-0123456789";

/// Agents whose model answers at once.
struct Answering;

#[async_trait]
impl AgentFactory for Answering {
    fn default_model(&self) -> String {
        "scripted:inline".into()
    }

    async fn build(&self, _spec: AgentSpec) -> Result<Agent, String> {
        let turn = ScriptTurn {
            content: Some("done".into()),
            ..ScriptTurn::default()
        };
        Agent::builder()
            .model(ScriptedModel::new(vec![turn; 50]))
            .build()
            .map_err(|err| err.to_string())
    }
}

fn router(settings: Value) -> axum::Router {
    let mut settings = settings;
    settings["tokens"] = json!([{"name": "alice", "token": TOKEN}]);
    let settings: ServerSettings = serde_json::from_value(settings).unwrap();
    let config = ServerConfig::from_settings(&settings, None).unwrap();
    App::new(Service::new(config, Arc::new(Answering), None)).router()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

async fn send(router: &axum::Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, headers, body }
}

fn request(method: Method, path: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
}

fn json_body(method: Method, path: &str, body: &str) -> Request<Body> {
    request(method, path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn empty(method: Method, path: &str) -> Request<Body> {
    request(method, path).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn routes_and_methods_that_do_not_exist() {
    let router = router(json!({}));
    let unknown = send(&router, empty(Method::GET, "/v1/nothing")).await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (StatusCode::NOT_FOUND, "METHOD_NOT_FOUND")
    );
    // A wrong method is 405 with the JSON error, whoever asks.
    for signed_in in [true, false] {
        let builder = if signed_in {
            request(Method::DELETE, "/v1/runs")
        } else {
            Request::builder().method(Method::DELETE).uri("/v1/runs")
        };
        let wrong = send(&router, builder.body(Body::empty()).unwrap()).await;
        assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED, "signed in: {signed_in}");
        assert_eq!(wrong.code(), "METHOD_NOT_FOUND");
    }
}

#[tokio::test]
async fn every_api_route_needs_a_token() {
    let router = router(json!({}));
    for (method, path) in [
        (Method::POST, "/v1/runs"),
        (Method::GET, "/v1/runs"),
        (Method::GET, "/v1/runs/r"),
        (Method::GET, "/v1/runs/r/events"),
        (Method::POST, "/v1/runs/r/cancel"),
        (Method::POST, "/v1/runs/r/steer"),
        (Method::POST, "/v1/runs/r/permissions/q"),
        (Method::GET, "/v1/permissions"),
    ] {
        let anonymous = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let refused = send(&router, anonymous).await;
        assert_eq!(
            (refused.status, refused.code()),
            (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            "{method} {path}"
        );
        let wrong = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::AUTHORIZATION, "Bearer not-the-token")
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&router, wrong).await.code(), "UNAUTHORIZED", "{method} {path}");
    }
}

#[tokio::test]
async fn bodies_that_are_not_what_a_route_takes() {
    let router = router(json!({"max_frame_bytes": 4096}));
    let cases = [
        ("{not json", "PARSE_ERROR"),
        (r#"["a list"]"#, "INVALID_PARAMS"),
        (r#"{"prompt": "hi", "colour": "red"}"#, "INVALID_PARAMS"),
        (r#"{"maxSteps": 3}"#, "INVALID_PARAMS"),
        (r#"{"prompt": "hi", "onBusy": "sometimes"}"#, "INVALID_PARAMS"),
    ];
    for (body, code) in cases {
        let answer = send(&router, json_body(Method::POST, "/v1/runs", body)).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, code),
            "{body}"
        );
    }
    let untyped = request(Method::POST, "/v1/runs")
        .body(Body::from(r#"{"prompt": "hi"}"#))
        .unwrap();
    assert_eq!(send(&router, untyped).await.code(), "INVALID_REQUEST");
    let large = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(5000));
    let answer = send(&router, json_body(Method::POST, "/v1/runs", &large)).await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
    );
    let conflict = request(Method::POST, "/v1/runs")
        .header(header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", "one")
        .body(Body::from(r#"{"prompt": "hi", "idempotencyKey": "two"}"#))
        .unwrap();
    assert_eq!(send(&router, conflict).await.code(), "INVALID_PARAMS");
    let steer = send(&router, json_body(Method::POST, "/v1/runs/r/steer", r#"{"text": "x"}"#)).await;
    assert_eq!(steer.code(), "INVALID_PARAMS");
    let decision = json_body(Method::POST, "/v1/runs/r/permissions/q", r#"{"decision": "maybe"}"#);
    assert_eq!(send(&router, decision).await.code(), "INVALID_PARAMS");
}

#[tokio::test]
async fn queries_that_are_not_what_a_route_takes() {
    let router = router(json!({}));
    for path in ["/v1/runs?colour=red", "/v1/runs?limit=many", "/v1/runs?status=SLEEPING"] {
        let answer = send(&router, empty(Method::GET, path)).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "INVALID_PARAMS"),
            "{path}"
        );
    }
    let cursor = send(&router, empty(Method::GET, "/v1/runs/r/events?afterSeq=soon")).await;
    assert_eq!(cursor.code(), "INVALID_PARAMS");
    // A percent escape that is not UTF-8, in a path or a query (found by
    // the fuzzer: axum answered these in plain text).
    for path in [
        "/v1/runs/a%bc/events",
        "/v1/runs/%ff",
        "/v1/runs/r/permissions/%c3",
        "/v1/runs/r/events?afterSeq=%ff",
    ] {
        let answer = send(&router, empty(Method::GET, path)).await;
        let answer = if answer.status == StatusCode::METHOD_NOT_ALLOWED {
            send(&router, empty(Method::POST, path)).await
        } else {
            answer
        };
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "INVALID_PARAMS"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn runs_that_do_not_exist_are_not_found_everywhere() {
    let router = router(json!({}));
    let requests = [
        empty(Method::GET, "/v1/runs/nope"),
        empty(Method::GET, "/v1/runs/nope/events"),
        empty(Method::POST, "/v1/runs/nope/cancel"),
        json_body(Method::POST, "/v1/runs/nope/steer", r#"{"message": "x"}"#),
        json_body(Method::POST, "/v1/runs/nope/permissions/q", r#"{"decision": "allow"}"#),
        empty(Method::GET, "/v1/permissions?runId=nope"),
    ];
    for request in requests {
        let path = request.uri().to_string();
        let answer = send(&router, request).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::NOT_FOUND, "NOT_FOUND"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_run_is_accepted_and_found() {
    let router = router(json!({}));
    let accepted = send(&router, json_body(Method::POST, "/v1/runs", r#"{"prompt": "hi"}"#)).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
    let run_id = accepted.body["runId"].as_str().unwrap();
    let found = send(&router, empty(Method::GET, &format!("/v1/runs/{run_id}"))).await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.body["runId"], run_id);
}

#[tokio::test]
async fn past_the_rate_the_layer_answers_rate_limited_with_retry_after() {
    // 60 a minute: a burst of 15, then one a second.
    let router = router(json!({"requests_per_minute": 60}));
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..20 {
        let answer = send(&router, empty(Method::GET, "/v1/runs")).await;
        statuses.push(answer.status);
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(answer);
            break;
        }
    }
    let limited = limited.unwrap_or_else(|| panic!("never limited: {statuses:?}"));
    assert_eq!(limited.code(), "RATE_LIMITED");
    assert!(limited.headers.contains_key(header::RETRY_AFTER));
    assert!(statuses.len() > 10, "the burst: {statuses:?}");
    // Every route of the API counts: another route is limited too.
    let other = send(&router, empty(Method::GET, "/v1/permissions")).await;
    assert_eq!(other.code(), "RATE_LIMITED");
}

/// A key repeated in a body, at the top or deeper, is refused whatever
/// value came last (docs/server.md, "Errors"): no run is made from it.
#[tokio::test]
async fn a_key_repeated_in_a_body_is_refused_and_makes_no_run() {
    let router = router(json!({}));
    for body in [
        // The last value would be a mode every token may use.
        r#"{"prompt": "hi", "mode": "bypass", "mode": "default"}"#,
        // The same key, escaped the second time.
        r#"{"prompt": "hi", "mode": "bypass", "mo\u0064e": "default"}"#,
        r#"{"prompt": "hi", "prompt": "hi"}"#,
        // Deeper down: refused for the repetition, not for the field.
        r#"{"prompt": "hi", "x": [{"a": 1, "a": 2}]}"#,
    ] {
        let answer = send(&router, json_body(Method::POST, "/v1/runs", body)).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "INVALID_PARAMS"),
            "{body}: {}",
            answer.body
        );
        let message = answer.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("duplicate key"), "{body}: {message}");
    }
    let steer = send(
        &router,
        json_body(Method::POST, "/v1/runs/r/steer", r#"{"message": "a", "message": "b"}"#),
    )
    .await;
    assert_eq!(steer.code(), "INVALID_PARAMS");
    let runs = send(&router, empty(Method::GET, "/v1/runs")).await;
    assert_eq!(runs.status, StatusCode::OK);
    assert_eq!(runs.body["runs"], json!([]), "{}", runs.body);
}
