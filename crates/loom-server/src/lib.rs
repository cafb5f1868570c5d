//! Loom's gateway (`loom serve`): many clients start, watch, steer,
//! approve and cancel runs over WebSocket JSON-RPC (`/ws`) and HTTP with
//! SSE (`/v1/…`), with bearer tokens, Prometheus metrics at `/metrics`,
//! and runs that survive a restart. docs/server.md is the protocol;
//! docs/architecture.md shows where this crate sits.
//!
//! The protocol code (`ws`, `http`) only calls [`Service`]; the service
//! keeps live runs in a registry, admits them through a [`RunQueue`], and
//! fans their events out through an [`EventFeed`] — the seams a later step
//! backs with Redis ([`Service::with_seams`]).

mod agents;
pub mod auth;
pub(crate) mod body;
pub mod config;
mod connections;
pub mod control;
pub mod error;
mod extract;
pub mod feed;
mod http;
pub mod metrics;
mod observed_store;
pub mod protocol;
pub mod queue;
mod registry;
mod requests;
mod service;
mod web;
pub mod worker;
mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

pub use agents::{AgentFactory, AgentSpec};
pub use auth::{Grant, Principal, Role};
pub use config::{bound_max_connections, max_connections_for, ServerConfig, ServerSettings, TokenEntry};
pub use control::RunControl;
pub use error::{ApiError, Code};
pub use feed::{EventFeed, LocalFeed};
pub use queue::{LocalQueue, RunQueue};
pub use service::{Audited, Cluster, Next, Service, Subscription};

/// A 32-byte key from the OS's random source (two v4 UUIDs: 244 random
/// bits), for the web page's session key.
pub fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

/// What every route shares.
pub struct App {
    /// The operations.
    pub service: Service,
    /// Renders `/metrics`.
    metrics: Option<PrometheusHandle>,
    /// Cancelled at shutdown: WebSocket connections close with a reason,
    /// SSE streams end.
    closing: CancellationToken,
    /// When a shutdown must be over: its start plus `shutdown_grace`.
    /// WebSocket clients that do not answer the close frame are not waited
    /// for beyond it.
    shutdown_deadline: std::sync::OnceLock<tokio::time::Instant>,
    /// The WebSocket connections (axum does not wait for upgraded
    /// connections at shutdown; the server waits for these to say goodbye).
    connections: tokio_util::task::TaskTracker,
    /// Browsers signed in to the web page.
    sessions: web::Sessions,
}

/// Why `serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A non-loopback address without a token.
    #[error("refusing to listen on {0} without a token: configure [[server.tokens]] in loom.toml or set LOOM_TOKEN (without tokens only a loopback address such as 127.0.0.1 is allowed)")]
    OpenToTheNetwork(SocketAddr),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl App {
    /// How long a WebSocket connection closed by the shutdown waits for its
    /// client's close frame: 2 s, but never past the shutdown grace (save a
    /// moment to send its own).
    pub(crate) fn close_patience(&self) -> std::time::Duration {
        const AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);
        const TO_SEND_OURS: std::time::Duration = std::time::Duration::from_millis(100);
        let left = self.shutdown_deadline.get().map_or(AT_MOST, |deadline| {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        });
        left.min(AT_MOST).max(TO_SEND_OURS)
    }

    /// The gateway around `service`.
    pub fn new(service: Service) -> Arc<Self> {
        let config = service.config();
        let sessions = web::Sessions::new(config.session_key, config.session_revocations.clone());
        Arc::new(Self {
            service,
            metrics: metrics::install(),
            closing: CancellationToken::new(),
            shutdown_deadline: std::sync::OnceLock::new(),
            connections: tokio_util::task::TaskTracker::new(),
            sessions,
        })
    }

    /// The routes.
    pub fn router(self: &Arc<Self>) -> Router {
        // The HTTP API: signed in and rate-limited by one layer.
        let api = Router::new()
            .route("/v1/runs", post(http::start_run).get(http::list_runs))
            .route("/v1/runs/{id}", get(http::get_run))
            .route("/v1/runs/{id}/events", get(http::events))
            .route("/v1/runs/{id}/cancel", post(http::cancel_run))
            .route("/v1/runs/{id}/steer", post(http::steer_run))
            .route("/v1/runs/{id}/rewind", post(http::rewind_run))
            .route("/v1/runs/{id}/fork", post(http::fork_run))
            .route("/v1/runs/{id}/files", get(http::snapshot_file))
            .route("/v1/runs/{id}/permissions/{request_id}", post(http::respond))
            .route("/v1/permissions", get(http::list_permissions))
            .route("/v1/audit", get(http::audit))
            // Outermost last: signed in and rate-limited, then the body read.
            .route_layer(axum::middleware::from_fn_with_state(self.clone(), body::bounded))
            .route_layer(axum::middleware::from_fn_with_state(self.clone(), http::admitted));
        // Open to anyone: its body is read within the same bounds.
        let session = Router::new()
            .route("/v1/session", post(web::sign_in).get(web::whoami).delete(web::sign_out))
            .route_layer(axum::middleware::from_fn_with_state(self.clone(), body::bounded));
        Router::new()
            .merge(api)
            .merge(session)
            .route("/ws", get(ws::upgrade))
            .route("/metrics", get(http::metrics))
            .route("/", get(web::index))
            .route("/assets/app.js", get(web::script))
            .route("/assets/app.css", get(web::style))
            .route("/assets/icon.svg", get(web::icon))
            .route("/favicon.ico", get(web::icon))
            .route("/healthz", get(http::healthz))
            .route("/readyz", get(http::readyz))
            .fallback(http::not_found)
            .method_not_allowed_fallback(http::method_not_allowed)
            .layer(axum::middleware::from_fn(http::log_request))
            .with_state(self.clone())
    }

    /// Serves on `listener` until `stop` resolves; then shuts down: no new
    /// runs, live runs interrupted and checkpointed (resumed by the next
    /// start), connections closed with a reason, all within the shutdown
    /// grace plus a few seconds.
    pub async fn serve(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        if !self.service.config().may_listen_on(addr) {
            return Err(ServeError::OpenToTheNetwork(addr));
        }
        let app = self.clone();
        let stopping = async move {
            stop.await;
            let grace = app.service.config().shutdown_grace;
            let _ = app.shutdown_deadline.set(tokio::time::Instant::now() + grace);
            tracing::info!("shutting down: interrupting live runs");
            app.service.shutdown().await;
            app.closing.cancel();
        };
        let config = self.service.config();
        let limits = connections::Limits {
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            max_connections: config.max_connections,
        };
        connections::serve(listener, self.router(), limits, stopping).await;
        // WebSocket connections send their close frame and wait a moment
        // for the client's answer.
        self.connections.close();
        // Each connection waits `close_patience` at most; a moment more
        // for their tasks to end.
        let grace = self.close_patience() + std::time::Duration::from_millis(200);
        if tokio::time::timeout(grace, self.connections.wait()).await.is_err() {
            tracing::warn!("WebSocket connections still open {grace:?} after the shutdown; closing them");
        }
        Ok(())
    }
}
