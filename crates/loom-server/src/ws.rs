//! `/ws`: JSON-RPC over WebSocket (docs/server.md). One reader reads
//! frames and starts one task per request; one writer owns the socket,
//! sends what the tasks and subscriptions queue, and pings; each
//! subscription forwards its run's events. A bad frame gets an error
//! response and the connection stays open.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::IntoResponse as _;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, Code};
use crate::protocol::{Answer, FrameEnvelope, FrameId, FrameType, Request, RequestFrame, ResponseFrame};
use crate::requests;
use crate::requests::Caller;
use crate::service::{Next, Subscription};
use crate::App;
use loom_core::Event;
use std::sync::atomic::{AtomicU64, Ordering};

/// Frames queued for the writer of one connection.
const OUTBOUND: usize = 256;
/// Requests of one connection in progress at once.
const IN_FLIGHT: usize = 64;
/// How long the writer waits for the socket to take one frame.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection closed for answering no ping is kept for its
/// close frame to leave.
const SILENT_PEER_PATIENCE: Duration = Duration::from_secs(1);

/// Close codes: going away (shutdown), policy (no pong), try again later
/// (a subscriber fell behind), too big (over the transport's hard limit).
const GOING_AWAY: u16 = 1001;
const PROTOCOL_ERROR: u16 = 1002;
const INVALID_DATA: u16 = 1007;
const TOO_BIG: u16 = 1009;
const POLICY: u16 = 1008;
const TRY_AGAIN_LATER: u16 = 1013;

pub(crate) async fn upgrade(
    State(app): State<Arc<App>>,
    caller: Caller,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    // A request that is not an upgrade gets the protocol's JSON error, as
    // every other refusal does (found by the fuzzer: axum's is plain text).
    let ws = match ws {
        Ok(ws) => ws,
        Err(refused) => {
            return ApiError::new(
                Code::InvalidRequest,
                format!("/ws takes a WebSocket upgrade: {}", refused.body_text()),
            )
            .into_response()
        }
    };
    let limit = app.service.config().max_frame_bytes;
    // Small buffers: a gateway holds many connections, and tungstenite's
    // defaults allocate about 128 KiB for each. Frames up to four times
    // the limit are read, so that one over it gets PAYLOAD_TOO_LARGE and
    // the connection stays usable; beyond that the transport closes it.
    // The write buffer gathers the frames the writer feeds together into
    // one write (events are a few hundred bytes); 8 KiB keeps it small
    // for connections that are busy only now and then.
    ws.read_buffer_size(4 * 1024)
        .write_buffer_size(8 * 1024)
        .max_write_buffer_size(4 * 1024 * 1024)
        .max_message_size(limit.saturating_mul(4))
        .max_frame_size(limit.saturating_mul(4))
        .on_upgrade(move |socket| {
            let tracker = app.connections.clone();
            tracker.track_future(connection(app, caller, socket))
        })
}

/// One connection's shared parts.
#[derive(Clone)]
struct Conn {
    app: Arc<App>,
    /// Who opened it, and from where.
    caller: Caller,
    /// Frames for the writer.
    out: mpsc::Sender<String>,
    /// Cancelled when the connection ends: its subscriptions stop.
    closed: CancellationToken,
    /// The close frame to end with, when the server ends the connection.
    close_with: Arc<std::sync::Mutex<Option<(u16, String)>>>,
    /// The runs this connection follows. Held (an async lock) from
    /// stopping a run's old forwarder through the answer to starting the
    /// new one, so two subscriptions to a run never forward at once.
    subscriptions: Arc<tokio::sync::Mutex<Subscriptions>>,
}

impl Conn {
    /// Ends the connection with a close frame saying why (the first
    /// reason given wins); it goes out ahead of any queued frame.
    fn close(&self, code: u16, reason: String) {
        if let Ok(mut slot) = self.close_with.lock() {
            slot.get_or_insert((code, reason));
        }
        self.closed.cancel();
    }
}

async fn connection(app: Arc<App>, caller: Caller, socket: WebSocket) {
    metrics::gauge!("loom_ws_connections").increment(1.0);
    let (sink, mut stream) = socket.split();
    let (out, outbound) = mpsc::channel::<String>(OUTBOUND);
    let closed = CancellationToken::new();
    let conn = Conn {
        app: app.clone(),
        caller,
        out,
        closed: closed.clone(),
        close_with: Arc::default(),
        subscriptions: Arc::default(),
    };
    let ping_every = app.service.config().ping_interval;
    let mut writer = tokio::spawn(write_frames(conn.clone(), sink, outbound, ping_every));

    let requests = Arc::new(Semaphore::new(IN_FLIGHT));
    let limit = app.service.config().max_frame_bytes;
    // Set when the peer answered no ping: it is gone, so its answer to the
    // close is not waited for.
    let mut silent = false;
    loop {
        // A connection silent for two ping intervals is gone.
        let frame = tokio::select! {
            frame = tokio::time::timeout(ping_every * 2, stream.next()) => frame,
            _ = closed.cancelled() => break,
        };
        let message = match frame {
            Err(_) => {
                conn.close(POLICY, "no answer to ping".into());
                silent = true;
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                // Not a frame Loom can read: the close says why (a JSON
                // frame that does not parse gets an answer instead).
                let (code, reason) = unreadable(&err);
                conn.close(code, reason);
                break;
            }
            Ok(Some(Ok(message))) => message,
        };
        match message {
            Message::Text(text) => {
                let Ok(permit) = requests.clone().try_acquire_owned() else {
                    // Each refused request is answered under its own id, so
                    // a client waiting for it hears that it must try again.
                    let busy = ApiError::new(Code::Overloaded, "too many requests in progress on this connection")
                        .retry_after(Duration::from_millis(100));
                    conn.respond(RequestFrame::id_of(text.as_str(), limit), Err(busy)).await;
                    continue;
                };
                let conn = conn.clone();
                tokio::spawn(async move {
                    conn.request(text.as_str()).await;
                    drop(permit);
                });
            }
            Message::Binary(_) => {
                conn.respond(None, Err(ApiError::new(Code::InvalidRequest, "frames are JSON text")))
                    .await;
            }
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) => {}
        }
    }
    conn.closed.cancel();
    conn.subscriptions.lock().await.abort_all();
    // Keep reading until the client answers the close (or leaves): a
    // socket closed with unread input is reset, and the reset would destroy
    // the frames the client has not read yet — the close frame among them.
    let drain = async {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    let patience = if silent {
        // A peer silent for two ping intervals does not answer a close
        // either: the close frame gets a moment to leave, then the
        // connection (and its place under max_connections) is freed.
        SILENT_PEER_PATIENCE
    } else if app.closing.is_cancelled() {
        app.close_patience()
    } else {
        WRITE_TIMEOUT + Duration::from_secs(5)
    };
    let finished = tokio::time::timeout(patience, async {
        let (_, ()) = tokio::join!(&mut writer, drain);
    })
    .await;
    if finished.is_err() {
        writer.abort();
    }
    metrics::gauge!("loom_ws_connections").decrement(1.0);
}

/// The writer: the only owner of the socket's sending half. Frames that
/// are ready together go out in one write; pings keep the connection
/// checked; the close frame, when the server ends the connection, goes
/// out ahead of anything still queued.
async fn write_frames(
    conn: Conn,
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut outbound: mpsc::Receiver<String>,
    ping_every: Duration,
) {
    let mut ping = tokio::time::interval(ping_every);
    ping.tick().await;
    let shutdown = conn.app.closing.clone();
    loop {
        let first = tokio::select! {
            biased;
            _ = conn.closed.cancelled() => break,
            _ = shutdown.cancelled() => {
                conn.close(GOING_AWAY, "the server is shutting down; reconnect and resubscribe after your last seq".into());
                break;
            }
            _ = ping.tick() => Message::Ping(Default::default()),
            out = outbound.recv() => match out {
                Some(text) => Message::Text(Utf8Bytes::from(text)),
                None => break,
            },
        };
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            sink.feed(first).await?;
            // Whatever else is ready joins the same write.
            for _ in 0..OUTBOUND {
                match outbound.try_recv() {
                    Ok(text) => sink.feed(Message::Text(Utf8Bytes::from(text))).await?,
                    Err(_) => break,
                }
            }
            sink.flush().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            conn.closed.cancel();
            return;
        }
    }
    let reason = conn.close_with.lock().ok().and_then(|mut slot| slot.take());
    if let Some((code, reason)) = reason {
        // A client that fell behind reads its backlog first: the close
        // waits for it as long as any frame would (a peer closed for
        // answering no ping gets SILENT_PEER_PATIENCE in all).
        let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.send(close(code, reason))).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}

/// The forwarders of one connection, one per run; a newer subscription to
/// a run replaces the older.
#[derive(Default)]
struct Subscriptions {
    running: HashMap<String, (u64, JoinHandle<()>)>,
}

impl Subscriptions {
    /// Stops the run's forwarder and waits until it has: nothing of the
    /// old stream is queued after this returns (a frame it was waiting to
    /// queue is dropped; the new stream starts where the client asked).
    async fn stop(&mut self, run_id: &str) {
        if let Some((_, task)) = self.running.remove(run_id) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Forgets a forwarder that ended by itself (unless a newer one
    /// replaced it meanwhile).
    fn ended(&mut self, run_id: &str, generation: u64) {
        if self.running.get(run_id).is_some_and(|(known, _)| *known == generation) {
            self.running.remove(run_id);
        }
    }

    fn abort_all(&mut self) {
        for (_, (_, task)) in self.running.drain() {
            task.abort();
        }
    }
}

/// The close code and reason for a frame the WebSocket layer could not
/// read (RFC 6455, 7.4.1): text that is not UTF-8, a message past the
/// size limit, or any other breach of the protocol.
fn unreadable(err: &axum::Error) -> (u16, String) {
    let text = err.to_string();
    let lowered = text.to_ascii_lowercase();
    let code = if lowered.contains("utf-8") || lowered.contains("utf8") {
        INVALID_DATA
    } else if lowered.contains("control frame") {
        // A ping or close of more than 125 bytes breaks the protocol
        // (RFC 6455, 5.5); it is no message too big to take.
        PROTOCOL_ERROR
    } else if lowered.contains("space limit") || lowered.contains("too long") || lowered.contains("too big") {
        TOO_BIG
    } else {
        PROTOCOL_ERROR
    };
    // A close reason holds at most 123 bytes.
    let mut reason = text;
    while reason.len() > 123 {
        reason.pop();
    }
    (code, reason)
}

fn close(code: u16, reason: String) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    }))
}

impl Conn {
    async fn respond(&self, id: Option<FrameId>, result: Result<Answer, ApiError>) {
        let frame = match result {
            Ok(payload) => ResponseFrame::Ok {
                r#type: FrameType::Response,
                id,
                ok: true,
                payload,
            },
            Err(error) => ResponseFrame::Failed {
                r#type: FrameType::Response,
                id,
                ok: false,
                error,
            },
        };
        let text = serde_json::to_string(&frame).unwrap_or_else(|err| {
            let error = ApiError::internal("an answer could not be written", err);
            format!(
                r#"{{"type":"response","id":null,"ok":false,"error":{}}}"#,
                serde_json::to_string(&error).unwrap_or_else(|_| "null".into())
            )
        });
        // Nothing more leaves a closed connection (its writer has stopped),
        // so a full queue is not waited on.
        tokio::select! {
            _ = self.out.send(text) => {}
            _ = self.closed.cancelled() => {}
        }
    }

    async fn request(&self, text: &str) {
        let limit = self.app.service.config().max_frame_bytes;
        if text.len() > limit {
            let error = ApiError::new(
                Code::PayloadTooLarge,
                format!("the frame has {} bytes; the limit is {limit}", text.len()),
            );
            return self.respond(None, Err(error)).await;
        }
        let FrameEnvelope {
            id,
            method,
            payload,
            repeated_key,
        } = match RequestFrame::read(text) {
            Ok(envelope) => envelope,
            Err((id, error)) => return self.respond(id, Err(error)).await,
        };
        let id = Some(id);
        if let Err(error) = self.app.service.admit_request(&self.caller.principal) {
            return self.respond(id, Err(error)).await;
        }
        // Refused as a bad payload is, once it has paid the rate.
        if let Some(why) = repeated_key {
            return self.respond(id, Err(ApiError::new(Code::InvalidParams, why))).await;
        }
        let (result, follow) = match self.call(&method, payload).await {
            Ok((answer, follow)) => (Ok(answer), follow),
            Err(error) => (Err(error), None),
        };
        let changed = match (&result, &follow) {
            (Ok(Answer::Unsubscribed(gone)), _) => Some(gone.run_id.clone()),
            (_, Some((run_id, _))) => Some(run_id.clone()),
            _ => None,
        };
        let Some(run_id) = changed else {
            return self.respond(id, result).await;
        };
        // The old stream of the run stops before the answer, and the
        // events the answer promised follow it: after the answer a client
        // gets each event of the run once, in order.
        let mut subscriptions = self.subscriptions.lock().await;
        subscriptions.stop(&run_id).await;
        self.respond(id, result).await;
        if let Some((run_id, subscription)) = follow {
            let (generation, task) = self.follow(run_id.clone(), subscription);
            subscriptions.running.insert(run_id, (generation, task));
        }
    }

    /// Runs a request. A started run and `run.subscribe` also return the
    /// subscription to follow once the answer is out.
    async fn call(&self, method: &str, payload: Value) -> Result<(Answer, Option<(String, Subscription)>), ApiError> {
        let (service, who) = (&self.app.service, &self.caller.principal);
        let request = Request::parse(method, payload)?;
        let (answer, subscription) = requests::answer(service, &self.caller, request).await?;
        let follow = match (&answer, subscription) {
            (Answer::Subscribed(subscribed), Some(subscription)) => Some((subscribed.run_id.clone(), subscription)),
            // The run's events follow on this connection (not for a
            // prompt that joined another run).
            (Answer::Accepted(accepted), _) if !accepted.steered => {
                let subscription = service.subscribe(who, &accepted.run_id, 0).await?;
                Some((accepted.run_id.clone(), subscription))
            }
            // A fork's prompt: its run's events, as for `agent.run`.
            (Answer::Forked(forked), _) => match &forked.started {
                Some(accepted) if !accepted.steered => {
                    let subscription = service.subscribe(who, &accepted.run_id, 0).await?;
                    Some((accepted.run_id.clone(), subscription))
                }
                _ => None,
            },
            _ => None,
        };
        Ok((answer, follow))
    }

    /// Forwards a subscription's events to this connection until the run
    /// ends; a subscriber that fell behind closes the connection with a
    /// reason (the client resubscribes after its last seq).
    fn follow(&self, run_id: String, mut subscription: Subscription) -> (u64, JoinHandle<()>) {
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let conn = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = subscription.next() => next,
                    _ = conn.closed.cancelled() => return,
                };
                match next {
                    Next::Event(event) => {
                        if conn.out.send(event_frame(&event)).await.is_err() {
                            return;
                        }
                    }
                    Next::End => break,
                    Next::Lagged => {
                        metrics::counter!("loom_subscribers_dropped_total").increment(1);
                        let reason = format!("too slow for run {run_id}: resubscribe after your last seq");
                        conn.close(TRY_AGAIN_LATER, reason);
                        return;
                    }
                }
            }
            conn.subscriptions.lock().await.ended(&run_id, generation);
        });
        (generation, task)
    }
}

/// `{"type":"event","event":NAME,"runId":…,"seq":N,"payload":EVENT}`,
/// written directly (the event is serialized once, not through a `Value`).
fn event_frame(event: &Event) -> String {
    let payload = serde_json::to_string(event).unwrap_or_else(|_| "null".into());
    let run_id = serde_json::to_string(&*event.run_id).unwrap_or_else(|_| "null".into());
    format!(
        r#"{{"type":"event","event":"{}","runId":{run_id},"seq":{},"payload":{payload}}}"#,
        event.kind.name(),
        event.seq
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_that_cannot_be_read_is_closed_with_the_code_of_its_fault() {
        let code = |text: &str| unreadable(&axum::Error::new(std::io::Error::other(text.to_string()))).0;
        // tungstenite's words for each fault.
        assert_eq!(
            code("Control frame too big (payload must be 125 bytes or less)"),
            PROTOCOL_ERROR
        );
        assert_eq!(code("Space limit exceeded: Message too long: 70000 > 65536"), TOO_BIG);
        assert_eq!(code("UTF-8 encoding error"), INVALID_DATA);
        assert_eq!(code("Reserved bits are non-zero"), PROTOCOL_ERROR);
    }
}
