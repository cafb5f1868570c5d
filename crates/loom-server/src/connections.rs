//! The gateway's accept loop (docs/server.md, "Connections"): at most
//! `max_connections` client connections at once, each given
//! `header_timeout` for a request's headers and closed once no byte has
//! moved either way for `idle_timeout`; at shutdown, connections finish
//! their request and close, within a grace.
//!
//! A client that opens connections and never finishes them must not hold
//! descriptors for minutes: that is how a few hundred of them once made
//! `/healthz` and every authenticated call time out. Nor may it hold the
//! cap: at the cap, the connection that has waited longest without a
//! request is closed to admit a newcomer (a flood of idle sockets that
//! reopened each one closed once made `/healthz` fail 37 times in 40).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// Connections closed to admit a newcomer that have not finished closing:
/// beyond these, a newcomer is refused as if none were idle, so that
/// evictions cannot outrun the closes and overshoot the cap by much.
const CLOSING_AT_ONCE: usize = 64;

/// Idle-looking connections passed over at the cap because a complete
/// request already waits in their socket, before a newcomer is refused
/// instead (each look is a system call under the registry's lock).
const SPARED_AT_MOST: usize = 8;

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
    let open = Arc::new(Registry::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let tracker = TaskTracker::new();
    let closing = CancellationToken::new();
    let cut = CancellationToken::new();
    tokio::pin!(stopping);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut stopping => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors (or a connection reset before it
                    // was taken): trying again at once would spin.
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // At the cap, the connection that has waited longest without a
        // request makes room (`Registry::admit`); only when every one is
        // busy is the newcomer refused at once (503, then closed) rather
        // than left waiting in the kernel's queue, so a health check or a
        // client that retries gets in as soon as a slot frees.
        let Some(slot) = Registry::admit(&open) else {
            metrics::counter!("loom_http_connections_refused_total").increment(1);
            if let Ok(telling) = refusals.clone().try_acquire_owned() {
                tokio::spawn(refuse(tcp, telling));
            }
            continue;
        };
        tune(&tcp);
        let io = Watched::new(tcp, slot);
        tracker.spawn(connection(
            io,
            peer,
            router.clone(),
            limits,
            closing.clone(),
            cut.clone(),
        ));
    }
    drop(listener);
    closing.cancel();
    tracker.close();
    if tokio::time::timeout(CLOSE_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("HTTP connections still open {CLOSE_GRACE:?} after the shutdown; closing them");
        cut.cancel();
    }
}

/// The open client connections, each with what it is doing, so that at
/// the cap an idle one can be closed for a newcomer. The lock is a std
/// one, held for a map operation (or, at the cap, one pass over the map)
/// and never across an `.await`.
struct Registry {
    cap: usize,
    epoch: Instant,
    inner: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    connections: HashMap<u64, Arc<Activity>>,
    /// Evicted connections whose tasks have not dropped them yet.
    closing: usize,
}

impl Registry {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            epoch: Instant::now(),
            inner: Mutex::new(Open::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a new connection: a free one, or the one of the
    /// connection that has waited longest for a request, which is told to
    /// close. `None` when every connection is busy (a request in its
    /// handler or its answer still being sent, a WebSocket) or too many
    /// evicted ones are still closing.
    fn admit(registry: &Arc<Self>) -> Option<Slot> {
        let mut open = registry.lock();
        if open.connections.len() >= registry.cap {
            if open.closing >= CLOSING_AT_ONCE {
                return None;
            }
            // One pass per look, only at the cap. A connection whose
            // complete request sits unread in its socket (its task has
            // not run yet; under a flood the next connections come
            // faster) has sent its request: it is spared.
            let mut spared: Vec<u64> = Vec::new();
            let (id, evicted) = loop {
                let (&id, oldest) = open
                    .connections
                    .iter()
                    .filter(|(id, activity)| activity.evictable() && !spared.contains(id))
                    .min_by_key(|(_, activity)| activity.waiting_since.load(Ordering::Relaxed))?;
                if !oldest.request_waiting() {
                    break (id, oldest.clone());
                }
                spared.push(id);
                if spared.len() >= SPARED_AT_MOST {
                    return None;
                }
            };
            open.connections.remove(&id);
            evicted.evicted.store(true, Ordering::Relaxed);
            evicted.evict.cancel();
            open.closing += 1;
            metrics::counter!("loom_http_connections_evicted_total").increment(1);
        }
        let id = open.next_id;
        open.next_id += 1;
        let activity = Arc::new(Activity::new(registry.epoch));
        open.connections.insert(id, activity.clone());
        drop(open);
        metrics::gauge!("loom_http_connections").increment(1.0);
        Some(Slot {
            registry: registry.clone(),
            id,
            activity,
        })
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
async fn connection(
    io: Watched,
    peer: std::net::SocketAddr,
    router: Router,
    limits: Limits,
    closing: CancellationToken,
    cut: CancellationToken,
) {
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
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        // Who is at the other end, for the audit trail.
        request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
        let handling = Handling::enter(handled.clone());
        // Busy from the moment its headers are in until its answer has
        // been sent (an SSE stream: until it ends), so never evicted.
        let answering = Answering::enter(handled.clone());
        let mut router = router.clone();
        // Router is always ready (its `poll_ready` returns at once).
        let response = tower_service::Service::call(&mut router, request);
        async move {
            let response = response.await;
            drop(handling);
            response.map(|response| {
                if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
                    // A WebSocket from here on: its own pings watch it.
                    answering.0.upgraded.store(true, Ordering::Relaxed);
                }
                // The answer's body holds `answering` until hyper has
                // sent it and dropped it.
                response.map(|body| {
                    axum::body::Body::new(Answered {
                        body,
                        _answering: answering,
                    })
                })
            })
        }
    });
    let served = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(served);
    let evict = activity.evict.clone();
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
            () = evict.cancelled() => {
                tracing::debug!("connection waiting for a request closed for a newcomer at the cap");
                return;
            }
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

/// When a connection last moved a byte, whether a request is being
/// handled on it, and whether it may be closed for a newcomer.
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened`.
    last: AtomicU64,
    /// Requests in a handler (0 or 1 on HTTP/1).
    handling: AtomicU64,
    /// Requests from their headers to the end of their answer.
    answering: AtomicU64,
    /// Since when it has waited for a request: milliseconds after the
    /// registry's epoch (its opening, or the end of its last answer).
    waiting_since: AtomicU64,
    /// Upgraded to a WebSocket: never evicted.
    upgraded: AtomicBool,
    /// The socket, to look at what waits unread in it (weak: the
    /// connection owns it, and closes it when it ends).
    socket: std::sync::OnceLock<std::sync::Weak<TcpStream>>,
    /// Told to close for a newcomer (and already out of the registry).
    evicted: AtomicBool,
    evict: CancellationToken,
    epoch: Instant,
}

/// A request in its handler: the connection is busy, not idle.
struct Handling(Arc<Activity>);

impl Handling {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.handling.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

/// A request from its headers to the end of its answer.
struct Answering(Arc<Activity>);

impl Answering {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.answering.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        // Waiting for the next request from now on (keep-alive).
        self.0.start_waiting();
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body, with the request counted busy until it is dropped.
struct Answered {
    body: axum::body::Body,
    _answering: Answering,
}

impl hyper::body::Body for Answered {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
    fn new(epoch: Instant) -> Self {
        let activity = Self {
            opened: Instant::now(),
            last: AtomicU64::new(0),
            handling: AtomicU64::new(0),
            answering: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
            socket: std::sync::OnceLock::new(),
            evicted: AtomicBool::new(false),
            evict: CancellationToken::new(),
            epoch,
        };
        activity.start_waiting();
        activity
    }

    fn start_waiting(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.waiting_since.store(now, Ordering::Relaxed);
    }

    /// Waiting for a request: no request being answered, not a WebSocket.
    fn evictable(&self) -> bool {
        self.answering.load(Ordering::Relaxed) == 0 && !self.upgraded.load(Ordering::Relaxed)
    }

    /// Whether the end of a request's headers waits unread in the socket
    /// (in its first 2 KiB: a health check's or a small call's). Peeking
    /// takes nothing from the socket.
    fn request_waiting(&self) -> bool {
        let Some(tcp) = self.socket.get().and_then(std::sync::Weak::upgrade) else {
            return false;
        };
        let mut unread = [0u8; 2048];
        match rustix::net::recv(
            &*tcp,
            &mut unread[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((n, _)) => unread
                .get(..n)
                .is_some_and(|bytes| bytes.windows(4).any(|w| w == b"\r\n\r\n")),
            Err(_) => false,
        }
    }

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
/// is dropped — after an upgrade, when the WebSocket ends. The socket is
/// shared (weakly) with the registry, which may peek at it.
struct Watched {
    tcp: Arc<TcpStream>,
    activity: Arc<Activity>,
    _slot: Slot,
}

impl Watched {
    fn new(tcp: TcpStream, slot: Slot) -> Self {
        let tcp = Arc::new(tcp);
        let _ = slot.activity.socket.set(Arc::downgrade(&tcp));
        Self {
            tcp,
            activity: slot.activity.clone(),
            _slot: slot,
        }
    }
}

/// A place under the cap (given back when dropped), counted in
/// `loom_http_connections`.
struct Slot {
    registry: Arc<Registry>,
    id: u64,
    activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.registry.lock();
        if self.activity.evicted.load(Ordering::Relaxed) {
            // Out of the map since its eviction; now closed.
            open.closing = open.closing.saturating_sub(1);
        } else {
            open.connections.remove(&self.id);
        }
        drop(open);
        metrics::gauge!("loom_http_connections").decrement(1.0);
    }
}

impl Watched {
    /// What tokio's `TcpStream` does for `AsyncRead`/`AsyncWrite`, on a
    /// shared socket: wait for readiness (`write` picks which), then try
    /// without blocking; bytes that moved count as activity.
    fn poll_io(
        &mut self,
        cx: &mut Context<'_>,
        write: bool,
        mut attempt: impl FnMut(&TcpStream) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        loop {
            if write {
                std::task::ready!(self.tcp.poll_write_ready(cx))?;
            } else {
                std::task::ready!(self.tcp.poll_read_ready(cx))?;
            }
            match attempt(&self.tcp) {
                Ok(n) => {
                    if n > 0 {
                        self.activity.touch();
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let read = std::task::ready!(self
            .get_mut()
            .poll_io(cx, false, |tcp| tcp.try_read(buf.initialize_unfilled())))?;
        buf.advance(read);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().poll_io(cx, true, |tcp| tcp.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().poll_io(cx, true, |tcp| tcp.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Nothing is buffered here: a write is in the kernel once done.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.tcp).shutdown(std::net::Shutdown::Write))
    }
}
