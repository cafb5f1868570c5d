//! An HTTP request through the gateway's router in process (no socket):
//! the layers that sign in, bound the body and parse it, and every route.
//! The input is a request in text: the first line `METHOD PATH`, then
//! header lines, a blank line, and the body. Whatever it is, the answer is
//! never a server fault (`500`), and every refusal is the protocol's JSON
//! error. Runs never start (the agent factory refuses), so the request is
//! judged only by the gateway's own checks.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use loom_core::{async_trait, Agent};
use loom_server::{AgentFactory, AgentSpec, App, ServerConfig, ServerSettings, Service};
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "fuzz-token-0123456789";

struct NoAgents;

#[async_trait]
impl AgentFactory for NoAgents {
    fn default_model(&self) -> String {
        "scripted:inline".into()
    }

    async fn build(&self, _spec: AgentSpec) -> Result<Agent, String> {
        Err("no agents while fuzzing".into())
    }
}

struct Gateway {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

fn gateway() -> Option<&'static Gateway> {
    static GATEWAY: OnceLock<Option<Gateway>> = OnceLock::new();
    GATEWAY
        .get_or_init(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            let settings: ServerSettings = serde_json::from_value(json!({
                "tokens": [
                    {"name": "fuzz", "token": TOKEN},
                    {"name": "watch", "token": "watch-token-0123456789", "role": "viewer"},
                ],
                // Every request is judged, none refused for its rate.
                "requests_per_minute": 4_000_000_000u32,
                "max_frame_bytes": 65536,
            }))
            .ok()?;
            let config = ServerConfig::from_settings(&settings, None).ok()?;
            let router = runtime.block_on(async { App::new(Service::new(config, Arc::new(NoAgents), None)).router() });
            Some(Gateway { runtime, router })
        })
        .as_ref()
}

/// The request `data` describes, if it is one `http` can build.
fn request(data: &[u8]) -> Option<Request<Body>> {
    let text = String::from_utf8_lossy(data);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let first = lines.next()?;
    let (method, path) = first.split_once(' ').unwrap_or(("GET", first));
    let mut builder = Request::builder().method(method).uri(path);
    let mut signed = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        signed |= name.trim().eq_ignore_ascii_case("authorization");
        builder = builder.header(name.trim(), value.trim());
    }
    if !signed && !path.contains("token=") {
        builder = builder.header("authorization", format!("Bearer {TOKEN}"));
    }
    builder.body(Body::from(body.to_string())).ok()
}

pub fn run(data: &[u8]) {
    let Some(gateway) = gateway() else {
        return;
    };
    let Some(request) = request(data) else {
        return;
    };
    // A HEAD answer has no body, whatever it says.
    let head = request.method() == axum::http::Method::HEAD;
    let router = gateway.router.clone();
    let (status, body) = gateway.runtime.block_on(async move {
        let Ok(response) = router.oneshot(request).await;
        let status = response.status();
        // An SSE stream would not end; none exists (no run starts).
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (status, bytes)
    });
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        String::from_utf8_lossy(&body)
    );
    if !head && (status.is_client_error() || status.is_server_error()) {
        let error: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert!(
            error["error"]["code"].is_string(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}
