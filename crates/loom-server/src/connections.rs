//! The gateway's accept loop (docs/server.md, "Connections"): at most
//! `max_connections` client connections at once, each given
//! `header_timeout` for a request's headers and closed once no byte has
//! moved either way for `idle_timeout`; at shutdown, connections finish
//! their request and close, within a grace.
//!
//! A client that opens connections and never finishes them must not hold
//! descriptors for minutes: that is how a few hundred of them once made
//! `/healthz` and every authenticated call time out.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long connections get to close after a shutdown.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// The kernel send buffer of each client connection.
const SEND_BUFFER: usize = 128 * 1024;

/// Connections over the cap being told so at once: beyond these, an
/// extra connection is closed without a word (each one being told holds
/// a descriptor for up to `REFUSAL_PATIENCE`).
const REFUSALS_AT_ONCE: usize = 64;

/// How long a refused connection is given to read its 503.
const REFUSAL_PATIENCE: Duration = Duration::from_secs(1);

/// What a connection over the cap reads before it is closed.
fn refusal() -> String {
    let body = r#"{"error":{"code":"OVERLOADED","message":"too many connections; try again in a moment"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The limits every connection is held to.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// Accepts connections and serves `router` on them until `stopping`
/// resolves; then stops accepting, lets each connection finish the
/// request it is on, and cuts those still open after `CLOSE_GRACE`.
/// Connections upgraded to WebSocket are the caller's to close.
pub(crate) async fn serve(listener: TcpListener, router: Router, limits: Limits, stopping: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let tracker = TaskTracker::new();
    let closing = CancellationToken::new();
    let cut = CancellationToken::new();
    tokio::pin!(stopping);
    loop {
        let tcp = tokio::select! {
            () = &mut stopping => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(err) => {
                    // Out of descriptors (or a connection reset before it
                    // was taken): trying again at once would spin.
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // At the cap, a new connection is refused at once (503, then
        // closed) rather than left waiting in the kernel's queue: a health
        // check or a client that retries gets in as soon as a slot frees
        // (at worst after `header_timeout`, when the oldest unfinished
        // connection is closed), not behind every connection queued
        // before it.
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics::counter!("loom_http_connections_refused_total").increment(1);
            if let Ok(telling) = refusals.clone().try_acquire_owned() {
                tokio::spawn(refuse(tcp, telling));
            }
            continue;
        };
        tune(&tcp);
        let io = Watched::new(tcp, permit);
        tracker.spawn(connection(io, router.clone(), limits, closing.clone(), cut.clone()));
    }
    drop(listener);
    closing.cancel();
    tracker.close();
    if tokio::time::timeout(CLOSE_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("HTTP connections still open {CLOSE_GRACE:?} after the shutdown; closing them");
        cut.cancel();
    }
}

/// Events are small and must not wait for Nagle; a fixed send buffer
/// keeps kernel memory per connection bounded (the default grows to
/// 4 MiB), so a client that stops reading falls behind soon and is
/// dropped, instead of having megabytes queued for it.
fn tune(tcp: &TcpStream) {
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(tcp).set_send_buffer_size(SEND_BUFFER);
}

/// Tells a connection over the cap so, and closes it once the client has
/// read that (or after `REFUSAL_PATIENCE`). Closing with its request
/// unread would reset the connection and lose the answer.
async fn refuse(mut tcp: TcpStream, telling: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REFUSAL_PATIENCE, async {
        tcp.write_all(refusal().as_bytes()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 1024];
        loop {
            tcp.readable().await?;
            match tcp.try_read(&mut sink) {
                Ok(0) => return Ok::<(), std::io::Error>(()),
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
    })
    .await;
    drop(telling);
}

/// One HTTP/1 connection, with its header timeout and idle watch.
async fn connection(io: Watched, router: Router, limits: Limits, closing: CancellationToken, cut: CancellationToken) {
    let activity = io.activity.clone();
    let mut builder = http1::Builder::new();
    // hyper starts the header clock when a connection opens and again when
    // a response is done: it bounds both a request whose headers never
    // end and a keep-alive connection that sends nothing more.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // While a request is being handled the connection is not idle, even if
    // no byte moves (a cancel waits for its run to stop); a body that
    // stalls meanwhile is the body timeout's.
    let handled = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let handling = Handling::enter(handled.clone());
        let mut router = router.clone();
        // Router is always ready (its `poll_ready` returns at once).
        let response = tower_service::Service::call(&mut router, request);
        async move {
            let response = response.await;
            drop(handling);
            response
        }
    });
    let served = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(served);
    let idle = idle(activity, limits.idle_timeout);
    tokio::pin!(idle);
    let mut finishing = false;
    loop {
        tokio::select! {
            ended = served.as_mut() => {
                if let Err(err) = ended {
                    if err.is_timeout() {
                        metrics::counter!("loom_http_timeouts_total", "kind" => "header").increment(1);
                    }
                    tracing::debug!(error = %err, "connection ended");
                }
                return;
            }
            () = &mut idle => {
                metrics::counter!("loom_http_timeouts_total", "kind" => "idle").increment(1);
                tracing::debug!("connection idle for {:?}; closed", limits.idle_timeout);
                return;
            }
            () = closing.cancelled(), if !finishing => {
                // Finishes the request in progress, then closes.
                finishing = true;
                served.as_mut().graceful_shutdown();
            }
            () = cut.cancelled() => return,
        }
    }
}

/// Resolves once no byte has moved, and no request has been handled, for
/// `limit`.
async fn idle(activity: Arc<Activity>, limit: Duration) {
    loop {
        if activity.handling.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(limit).await;
            continue;
        }
        let quiet = activity.quiet_for();
        if quiet >= limit {
            return;
        }
        tokio::time::sleep(limit - quiet).await;
    }
}

/// When a connection last moved a byte, and whether a request is being
/// handled on it.
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened`.
    last: AtomicU64,
    /// Requests in a handler (0 or 1 on HTTP/1).
    handling: AtomicU64,
}

/// A request in its handler: the connection is busy, not idle.
struct Handling(Arc<Activity>);

impl Handling {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.handling.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        // The quiet time counts from the end of the handler.
        self.0.touch();
        self.0.handling.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Activity {
    fn touch(&self) {
        let now = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(last)
    }
}

/// A client's socket that notes when bytes move, and holds the
/// connection's slot under the cap (and its place in the gauge) until it
/// is dropped — after an upgrade, when the WebSocket ends.
struct Watched {
    tcp: TcpStream,
    activity: Arc<Activity>,
    _slot: Slot,
}

impl Watched {
    fn new(tcp: TcpStream, permit: OwnedSemaphorePermit) -> Self {
        Self {
            tcp,
            activity: Arc::new(Activity {
                opened: Instant::now(),
                last: AtomicU64::new(0),
                handling: AtomicU64::new(0),
            }),
            _slot: Slot::new(permit),
        }
    }
}

/// A place under the cap (given back when dropped), counted in
/// `loom_http_connections`.
struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        metrics::gauge!("loom_http_connections").increment(1.0);
        Self { _permit: permit }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!("loom_http_connections").decrement(1.0);
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.tcp).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
