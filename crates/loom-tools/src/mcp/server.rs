//! One configured MCP server over its whole life: started on demand,
//! restarted with backoff after it dies, its tool list kept current, every
//! call bounded in time and cancellable — with `notifications/cancelled`
//! sent for a call Loom gives up on, which rmcp does not do by itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientRequest, RequestId,
    ServerResult,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::config::{Endpoint, McpServerConfig};
use super::connection::{Connection, Handler, ProcessSetup, StderrTail};
use super::listing::{tool_infos, ToolInfo};
use crate::shell::Isolation;

/// Restart delays after consecutive failures: the first restart is at
/// once, then 1, 2, 4 … s, at most this.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A session that lived this long resets the failure count.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// Where a server is, for `loom mcp list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Configured with `enabled = false`.
    Disabled,
    /// Not started yet.
    Idle,
    /// Connected.
    Ready,
    /// Its last start failed or it died; it is started again on next use.
    Down(String),
    /// Shut down.
    Stopped,
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Idle => f.write_str("idle"),
            Self::Ready => f.write_str("ready"),
            Self::Down(why) => write!(f, "down: {why}"),
            Self::Stopped => f.write_str("stopped"),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    #[error("MCP server '{server}' is not available: {why}")]
    Unavailable { server: String, why: String },
    #[error("MCP server '{server}' stopped during the call; it is restarted on next use ({why})")]
    Died { server: String, why: String },
    #[error("MCP server '{server}' did not answer within {limit:.1} s; the request was cancelled")]
    TimedOut { server: String, limit: f64 },
    #[error("cancelled")]
    Cancelled,
    #[error("MCP server '{server}' answered with an error: {message}")]
    Protocol { server: String, message: String },
}

enum Session {
    Idle,
    /// A session (found dead on the next use, when its server died);
    /// `failures` counts the quick deaths and failed starts before it.
    Up {
        connection: Arc<Connection>,
        failures: u32,
    },
    /// The last start failed.
    Down {
        failures: u32,
        at: Instant,
    },
    Stopped,
}

/// One server.
pub struct McpServer {
    name: String,
    config: McpServerConfig,
    endpoint: Endpoint,
    dir: PathBuf,
    /// What a stdio server's process is kept from.
    isolation: Arc<Isolation>,
    session: tokio::sync::Mutex<Session>,
    state: Mutex<ServerState>,
    tools: Mutex<Arc<Vec<ToolInfo>>>,
    skipped: Mutex<Vec<String>>,
    generation: AtomicU64,
    stderr: StderrTail,
    /// Tool lists being fetched again after `list_changed`.
    refreshing: tokio::sync::watch::Sender<usize>,
    /// `list_changed` notifications seen on the wire whose handler has not
    /// run yet (stdio: see `connection::ListChangedTap`).
    announced: Arc<AtomicU64>,
    /// A background start is under way (`retry_if_due`).
    retrying: std::sync::atomic::AtomicBool,
    me: Weak<McpServer>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").field("name", &self.name).finish()
    }
}

impl McpServer {
    pub(crate) fn new(
        name: String,
        config: McpServerConfig,
        endpoint: Endpoint,
        dir: PathBuf,
        isolation: Arc<Isolation>,
    ) -> Arc<Self> {
        let state = if config.is_enabled() {
            ServerState::Idle
        } else {
            ServerState::Disabled
        };
        Arc::new_cyclic(|me| Self {
            name,
            config,
            endpoint,
            dir,
            isolation,
            session: tokio::sync::Mutex::new(Session::Idle),
            state: Mutex::new(state),
            tools: Mutex::new(Arc::new(Vec::new())),
            skipped: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            stderr: StderrTail::default(),
            refreshing: tokio::sync::watch::Sender::new(0),
            announced: Arc::new(AtomicU64::new(0)),
            retrying: std::sync::atomic::AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// The configured name (the prefix of its tools).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stdio or HTTP, and where.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Its state now.
    pub fn state(&self) -> ServerState {
        lock(&self.state).clone()
    }

    /// Its tools as last listed.
    pub(crate) fn tool_infos(&self) -> Arc<Vec<ToolInfo>> {
        lock(&self.tools).clone()
    }

    /// Tools of its list that were not offered, and why.
    pub fn skipped_tools(&self) -> Vec<String> {
        lock(&self.skipped).clone()
    }

    /// The last lines it wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr.lines()
    }

    /// Changes whenever its tool list changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.config.is_enabled()
    }

    pub(crate) fn call_timeout(&self) -> Option<Duration> {
        self.config.call_timeout()
    }

    /// A live session, started (or restarted after a death, with backoff)
    /// when there is none.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, CallError> {
        let unavailable = |why: String| CallError::Unavailable {
            server: self.name.clone(),
            why,
        };
        if !self.config.is_enabled() {
            return Err(unavailable("it is disabled in the configuration".to_string()));
        }
        let mut session = self.session.lock().await;
        let (failures, since) = match &*session {
            Session::Up { connection, .. } if connection.is_open() => return Ok(connection.clone()),
            // It died. A session that lived long enough was healthy; one
            // that died young counts as one more failure.
            Session::Up { connection, .. } if connection.started.elapsed() >= HEALTHY_AFTER => (1, Instant::now()),
            Session::Up { failures, .. } => (failures + 1, Instant::now()),
            Session::Down { failures, at } => (*failures, *at),
            Session::Idle => (0, Instant::now()),
            Session::Stopped => return Err(unavailable("Loom is shutting down".to_string())),
        };
        let wait = backoff(failures).saturating_sub(since.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if let Session::Up { connection, .. } = std::mem::replace(&mut *session, Session::Idle) {
            connection.shutdown().await;
        }
        match self.start().await {
            Ok(connection) => {
                *session = Session::Up {
                    connection: connection.clone(),
                    failures,
                };
                *lock(&self.state) = ServerState::Ready;
                Ok(connection)
            }
            Err(why) => {
                *session = Session::Down {
                    failures: failures + 1,
                    at: Instant::now(),
                };
                *lock(&self.state) = ServerState::Down(why.clone());
                Err(unavailable(why))
            }
        }
    }

    /// A server whose start failed offers no tools, so no call would start
    /// it again: once its backoff has passed, it is started in the
    /// background (at most one attempt at a time).
    pub(crate) fn retry_if_due(&self) {
        if !self.config.is_enabled() || !self.tool_infos().is_empty() || self.retrying.load(Ordering::Acquire) {
            return;
        }
        let due = match self.session.try_lock() {
            Ok(session) => matches!(&*session, Session::Down { failures, at } if at.elapsed() >= backoff(*failures)),
            Err(_) => false,
        };
        let Some(server) = self.me.upgrade() else {
            return;
        };
        if due && !self.retrying.swap(true, Ordering::AcqRel) {
            tokio::spawn(async move {
                let _ = server.connection().await;
                server.retrying.store(false, Ordering::Release);
            });
        }
    }

    /// Opens a session and lists its tools, within the start-up limit.
    async fn start(&self) -> Result<Arc<Connection>, String> {
        let limit = self.config.startup_timeout();
        let me = self.me.clone();
        // Counted as a refresh from the moment its bytes arrive, before
        // rmcp reads the answer after it: a run about to call the model
        // waits for the new list.
        let on_list_changed_bytes: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(server) = me.upgrade() {
                server.announced.fetch_add(1, Ordering::AcqRel);
                server.refreshing.send_modify(|count| *count += 1);
            }
        });
        let me = self.me.clone();
        let handler = Handler {
            on_tools_changed: Arc::new(move || {
                if let Some(server) = me.upgrade() {
                    // Seen on the wire already (stdio), the refresh was
                    // counted then; otherwise it is counted now.
                    let announced = server
                        .announced
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                        .is_ok();
                    if !announced {
                        server.refreshing.send_modify(|count| *count += 1);
                    }
                    tokio::spawn(async move {
                        server.refresh_tools().await;
                        server.refreshing.send_modify(|count| *count = count.saturating_sub(1));
                    });
                }
            }),
            on_list_changed_bytes,
        };
        let started = Instant::now();
        let connection = Connection::open(
            &self.name,
            &self.endpoint,
            ProcessSetup {
                env: &self.config.env,
                dir: &self.dir,
                isolation: &self.isolation,
            },
            handler,
            self.stderr.clone(),
            limit,
        )
        .await
        .map_err(|err| self.with_stderr(err.to_string()))?;
        let connection = Arc::new(connection);
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, connection.peer.list_all_tools()).await {
            Ok(Ok(tools)) => {
                self.set_tools(tools);
                Ok(connection)
            }
            Ok(Err(err)) => {
                connection.shutdown().await;
                Err(self.with_stderr(format!("tools/list failed: {err}")))
            }
            Err(_) => {
                connection.shutdown().await;
                Err(format!("no tool list within {limit:?}"))
            }
        }
    }

    /// `why` with what the server last said on stderr: its last line and,
    /// when that is not the error itself, the last line that looks like
    /// one (Node ends a crash with its version, Python with the exception).
    fn with_stderr(&self, why: String) -> String {
        let lines = self.stderr.lines();
        let said: Vec<&str> = lines
            .iter()
            .map(|line| line.trim())
            .filter(|line| !line.is_empty())
            .collect();
        let Some(last) = said.last() else {
            return why;
        };
        let error_like = said.iter().rev().find(|line| looks_like_an_error(line));
        match error_like {
            Some(error) if error != last => format!("{why} (stderr: {error} … {last})"),
            _ => format!("{why} (stderr: {last})"),
        }
    }

    /// Lists the tools again (after `notifications/tools/list_changed`).
    pub(crate) async fn refresh_tools(&self) {
        let connection = match &*self.session.lock().await {
            Session::Up { connection, .. } if connection.is_open() => Some(connection.clone()),
            _ => None,
        };
        let Some(connection) = connection else {
            return;
        };
        let listed = tokio::time::timeout(self.config.startup_timeout(), connection.peer.list_all_tools()).await;
        match listed {
            Ok(Ok(tools)) => self.set_tools(tools),
            Ok(Err(err)) => tracing::warn!(server = %self.name, "tools/list after list_changed failed: {err}"),
            Err(_) => tracing::warn!(server = %self.name, "tools/list after list_changed timed out"),
        }
    }

    /// Waits up to `limit` for tool lists being fetched again. A count
    /// still up after that (a notification whose handler never ran) is
    /// dropped, so later turns do not wait for it again.
    pub(crate) async fn settle(&self, limit: Duration) {
        let mut watch = self.refreshing.subscribe();
        if tokio::time::timeout(limit, watch.wait_for(|count| *count == 0))
            .await
            .is_err()
        {
            tracing::warn!(server = %self.name, "tool list refresh still pending after {limit:?}");
            self.announced.store(0, Ordering::Release);
            self.refreshing.send_replace(0);
        }
    }

    fn set_tools(&self, tools: Vec<rmcp::model::Tool>) {
        let (infos, skipped) = tool_infos(&self.name, tools);
        for why in &skipped {
            tracing::warn!(server = %self.name, "{why}");
        }
        *lock(&self.skipped) = skipped;
        let changed = {
            let mut current = lock(&self.tools);
            let changed = **current != infos;
            *current = Arc::new(infos);
            changed
        };
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Calls `tool` with `arguments`; gives up after `limit` or when
    /// `cancel` fires, telling the server with `notifications/cancelled`.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Value,
        limit: Option<Duration>,
        cancel: &CancellationToken,
    ) -> Result<CallToolResult, CallError> {
        // The limit covers the whole call: a (re)start, the request, the answer.
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        let timed_out = || CallError::TimedOut {
            server: self.name.clone(),
            limit: limit.unwrap_or_default().as_secs_f64(),
        };
        let until_deadline = || async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let connection = tokio::select! {
            connection = self.connection() => connection?,
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
            _ = until_deadline() => return Err(timed_out()),
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let sent = tokio::select! {
            sent = connection.peer.send_cancellable_request(request, PeerRequestOptions::no_options()) => sent,
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
            _ = until_deadline() => return Err(timed_out()),
        };
        let handle = sent.map_err(|err| self.failed(&connection, err))?;
        // From here until the answer, giving up must tell the server —
        // also when this future is dropped (the run's own timeout).
        let mut pending = CancelOnDrop {
            peer: connection.peer.clone(),
            id: Some(handle.id.clone()),
        };
        let answer = tokio::select! {
            answer = handle.await_response() => {
                pending.id = None;
                answer
            }
            _ = cancel.cancelled() => {
                pending.send("cancelled by the client").await;
                return Err(CallError::Cancelled);
            }
            _ = until_deadline() => {
                pending.send("timed out").await;
                return Err(timed_out());
            }
            _ = connection.closed.cancelled() => {
                pending.id = None;
                return Err(self.died(&connection, "the session ended".to_string()));
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(ServerResult::EmptyResult(_)) => Ok(CallToolResult::default()),
            Ok(_) => Err(CallError::Protocol {
                server: self.name.clone(),
                message: "an unexpected reply to tools/call".to_string(),
            }),
            Err(err) => Err(self.failed(&connection, err)),
        }
    }

    fn failed(&self, connection: &Connection, err: ServiceError) -> CallError {
        match err {
            ServiceError::McpError(data) => CallError::Protocol {
                server: self.name.clone(),
                message: data.message.to_string(),
            },
            other if !connection.is_open() || matches!(other, ServiceError::TransportClosed) => {
                self.died(connection, other.to_string())
            }
            other => CallError::Protocol {
                server: self.name.clone(),
                message: other.to_string(),
            },
        }
    }

    fn died(&self, _connection: &Connection, why: String) -> CallError {
        let why = self.with_stderr(why);
        *lock(&self.state) = ServerState::Down(why.clone());
        CallError::Died {
            server: self.name.clone(),
            why,
        }
    }

    /// Stops the server for good: no server outlives Loom.
    pub(crate) async fn shutdown(&self) {
        let previous = std::mem::replace(&mut *self.session.lock().await, Session::Stopped);
        if let Session::Up { connection, .. } = previous {
            connection.shutdown().await;
        }
        if self.config.is_enabled() {
            *lock(&self.state) = ServerState::Stopped;
        }
    }
}

/// Sends `notifications/cancelled` for a request Loom stopped waiting for.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl CancelOnDrop {
    async fn send(&mut self, reason: &str) {
        if let Some(id) = self.id.take() {
            let params = CancelledNotificationParam::new(Some(id), Some(reason.to_string()));
            let _ = self.peer.notify_cancelled(params).await;
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let peer = self.peer.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let params = CancelledNotificationParam::new(Some(id), Some("abandoned by Loom".to_string()));
                    let _ = peer.notify_cancelled(params).await;
                });
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(5)).min(MAX_BACKOFF),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether a line of a server's stderr reads like the error that ended it.
fn looks_like_an_error(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    [
        "error",
        "exception",
        "fatal",
        "panic",
        "cannot",
        "not found",
        "no such",
        "denied",
    ]
    .iter()
    .any(|word| lower.contains(word))
}
