//! A worker's own HTTP routes (`loom worker --addr`): `/healthz`,
//! `/readyz` and `/metrics`, for its supervisor and Prometheus. A worker
//! serves no clients and has no tokens: bind the address where only
//! those can reach it (it shows counts, never runs or secrets).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::Worker;

struct Routes {
    worker: Arc<Worker>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// The worker's routes.
pub fn router(worker: Arc<Worker>) -> Router {
    let routes = Arc::new(Routes {
        worker,
        metrics: crate::metrics::install(),
    });
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(routes)
}

async fn readyz(State(routes): State<Arc<Routes>>) -> Response {
    match routes.worker.ready().await {
        Ok(()) => Json(json!({"status": "ready", "executing": routes.worker.executing()})).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": why})),
        )
            .into_response(),
    }
}

async fn render_metrics(State(routes): State<Arc<Routes>>) -> Response {
    match &routes.metrics {
        Some(handle) => (
            [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics are not recorded in this process",
        )
            .into_response(),
    }
}

/// Serves the worker's routes on `listener` until the process ends.
pub async fn serve_routes(worker: Arc<Worker>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router(worker)).await
}
