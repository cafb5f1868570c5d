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
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::error::{ApiError, Code};
use crate::protocol::{PermissionListParams, RespondParams, RunIdParams, StartRun, SteerParams, SubscribeParams};
use crate::service::Next;
use crate::App;

/// Frames queued for the writer of one connection.
const OUTBOUND: usize = 256;
/// Requests of one connection in progress at once.
const IN_FLIGHT: usize = 64;
/// How long the writer waits for the socket to take one frame.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Close codes: going away (shutdown), policy (no pong), try again later
/// (a subscriber fell behind), too big (over the transport's hard limit).
const GOING_AWAY: u16 = 1001;
const POLICY: u16 = 1008;
const TRY_AGAIN_LATER: u16 = 1013;

pub(crate) async fn upgrade(State(app): State<Arc<App>>, principal: Principal, ws: WebSocketUpgrade) -> Response {
    let limit = app.service.config().max_frame_bytes;
    // Small buffers: a gateway holds many connections, and tungstenite's
    // defaults allocate about 128 KiB for each. Frames up to four times
    // the limit are read, so that one over it gets PAYLOAD_TOO_LARGE and
    // the connection stays usable; beyond that the transport closes it.
    ws.read_buffer_size(4 * 1024)
        .write_buffer_size(0)
        .max_write_buffer_size(4 * 1024 * 1024)
        .max_message_size(limit.saturating_mul(4))
        .max_frame_size(limit.saturating_mul(4))
        .on_upgrade(move |socket| connection(app, principal, socket))
}

/// One connection's shared parts.
#[derive(Clone)]
struct Conn {
    app: Arc<App>,
    principal: Principal,
    /// Frames for the writer.
    out: mpsc::Sender<String>,
    /// Cancelled when the connection ends: its subscriptions stop.
    closed: CancellationToken,
    /// The close frame to end with, when the server ends the connection.
    close_with: Arc<std::sync::Mutex<Option<(u16, String)>>>,
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

async fn connection(app: Arc<App>, principal: Principal, socket: WebSocket) {
    metrics::gauge!("loom_ws_connections").increment(1.0);
    let (mut sink, mut stream) = socket.split();
    let (out, mut outbound) = mpsc::channel::<String>(OUTBOUND);
    let closed = CancellationToken::new();
    let conn = Conn {
        app: app.clone(),
        principal,
        out,
        closed: closed.clone(),
        close_with: Arc::default(),
    };
    let ping_every = app.service.config().ping_interval;

    let writer_conn = conn.clone();
    let shutdown = app.closing.clone();
    let writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        loop {
            let message = tokio::select! {
                biased;
                _ = writer_conn.closed.cancelled() => break,
                _ = shutdown.cancelled() => {
                    writer_conn.close(GOING_AWAY, "the server is shutting down; reconnect and resubscribe after your last seq".into());
                    break;
                }
                _ = ping.tick() => Message::Ping(Default::default()),
                out = outbound.recv() => match out {
                    Some(text) => Message::Text(Utf8Bytes::from(text)),
                    None => break,
                },
            };
            match tokio::time::timeout(WRITE_TIMEOUT, sink.send(message)).await {
                Ok(Ok(())) => {}
                _ => {
                    writer_conn.closed.cancel();
                    return;
                }
            }
        }
        let reason = writer_conn.close_with.lock().ok().and_then(|mut slot| slot.take());
        if let Some((code, reason)) = reason {
            // A client that fell behind reads its backlog first: the close
            // waits for it as long as any frame would.
            let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.send(close(code, reason))).await;
        }
        let _ = sink.close().await;
    });

    let requests = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    let (sub_tx, mut sub_rx) = mpsc::unbounded_channel::<(String, Option<JoinHandle<()>>)>();
    loop {
        // A connection silent for two ping intervals is gone.
        let frame = tokio::select! {
            frame = tokio::time::timeout(ping_every * 2, stream.next()) => frame,
            change = sub_rx.recv() => {
                if let Some((run_id, task)) = change {
                    match task {
                        Some(task) => {
                            if let Some(old) = subscriptions.insert(run_id, task) {
                                old.abort();
                            }
                        }
                        None => {
                            if let Some(old) = subscriptions.remove(&run_id) {
                                old.abort();
                            }
                        }
                    }
                }
                continue;
            }
            _ = closed.cancelled() => break,
        };
        let message = match frame {
            Err(_) => {
                conn.close(POLICY, "no answer to ping".into());
                break;
            }
            Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(message))) => message,
        };
        match message {
            Message::Text(text) => {
                let Ok(permit) = requests.clone().try_acquire_owned() else {
                    conn.respond(
                        Value::Null,
                        Err(
                            ApiError::new(Code::Overloaded, "too many requests in progress on this connection")
                                .retry_after(Duration::from_millis(100)),
                        ),
                    )
                    .await;
                    continue;
                };
                let conn = conn.clone();
                let sub_tx = sub_tx.clone();
                tokio::spawn(async move {
                    conn.request(text.as_str(), &sub_tx).await;
                    drop(permit);
                });
            }
            Message::Binary(_) => {
                conn.respond(
                    Value::Null,
                    Err(ApiError::new(Code::InvalidRequest, "frames are JSON text")),
                )
                .await;
            }
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) => {}
        }
    }
    conn.closed.cancel();
    for (_, task) in subscriptions {
        task.abort();
    }
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
    let _ = tokio::time::timeout(WRITE_TIMEOUT + Duration::from_secs(5), async {
        let (_, ()) = tokio::join!(writer, drain);
    })
    .await;
    metrics::gauge!("loom_ws_connections").decrement(1.0);
}

fn close(code: u16, reason: String) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    }))
}

fn params<T: DeserializeOwned>(payload: Value) -> Result<T, ApiError> {
    let payload = if payload.is_null() { json!({}) } else { payload };
    serde_json::from_value(payload).map_err(|err| ApiError::new(Code::InvalidParams, err.to_string()))
}

type SubChanges = mpsc::UnboundedSender<(String, Option<JoinHandle<()>>)>;

impl Conn {
    async fn respond(&self, id: Value, result: Result<Value, ApiError>) {
        let frame = match result {
            Ok(payload) => json!({"type": "response", "id": id, "ok": true, "payload": payload}),
            Err(error) => json!({"type": "response", "id": id, "ok": false, "error": error}),
        };
        let _ = self.out.send(frame.to_string()).await;
    }

    async fn request(&self, text: &str, subs: &SubChanges) {
        let limit = self.app.service.config().max_frame_bytes;
        if text.len() > limit {
            let error = ApiError::new(
                Code::PayloadTooLarge,
                format!("the frame has {} bytes; the limit is {limit}", text.len()),
            );
            return self.respond(Value::Null, Err(error)).await;
        }
        let frame: Value = match serde_json::from_str(text) {
            Ok(frame) => frame,
            Err(err) => {
                return self
                    .respond(
                        Value::Null,
                        Err(ApiError::new(Code::ParseError, format!("not JSON: {err}"))),
                    )
                    .await
            }
        };
        let id = frame.get("id").cloned().unwrap_or(Value::Null);
        let valid_id = matches!(id, Value::String(_) | Value::Number(_));
        let (Some("request"), Some(method), true) = (
            frame.get("type").and_then(Value::as_str),
            frame.get("method").and_then(Value::as_str),
            valid_id,
        ) else {
            let error = ApiError::new(
                Code::InvalidRequest,
                "a request is {\"type\":\"request\",\"id\":…,\"method\":…,\"payload\":{…}}",
            );
            return self.respond(id, Err(error)).await;
        };
        if let Err(error) = self.app.service.admit_request(&self.principal) {
            return self.respond(id, Err(error)).await;
        }
        let payload = frame.get("payload").cloned().unwrap_or(Value::Null);
        let method = method.to_string();
        let result = self.call(&method, payload, subs).await;
        let subscribe_to = match (&method[..], &result) {
            ("agent.run", Ok(accepted)) if accepted.get("steered").is_none() => {
                accepted.get("runId").and_then(Value::as_str).map(str::to_string)
            }
            _ => None,
        };
        self.respond(id, result).await;
        // The run's events follow its answer on this connection.
        if let Some(run_id) = subscribe_to {
            if let Ok(subscription) = self.app.service.subscribe(&self.principal, &run_id, 0).await {
                self.follow(run_id, subscription, subs);
            }
        }
    }

    /// Runs a method; `run.subscribe` also starts the forwarding.
    async fn call(&self, method: &str, payload: Value, subs: &SubChanges) -> Result<Value, ApiError> {
        let service = &self.app.service;
        let who = &self.principal;
        let value = match method {
            "agent.run" => to_value(service.start(who, params::<StartRun>(payload)?).await?),
            "agent.cancel" => {
                let p: RunIdParams = params(payload)?;
                to_value(service.cancel(who, &p.run_id).await?)
            }
            "agent.steer" => {
                let p: SteerParams = params(payload)?;
                service.steer(who, &p.run_id, p.message).await?;
                json!({"runId": p.run_id, "accepted": true})
            }
            "permission.respond" => {
                let p: RespondParams = params(payload)?;
                service.respond(who, &p.run_id, &p.request_id, p.decision).await?;
                json!({"runId": p.run_id, "requestId": p.request_id, "decision": p.decision})
            }
            "permission.list" => {
                let p: PermissionListParams = params(payload)?;
                json!({"asks": service.pending(who, p.run_id.as_deref()).await?})
            }
            "run.get" => {
                let p: RunIdParams = params(payload)?;
                to_value(service.get(who, &p.run_id).await?)
            }
            "run.list" => to_value(service.list(who, params(payload)?).await?),
            "run.subscribe" => {
                let p: SubscribeParams = params(payload)?;
                let subscription = service.subscribe(who, &p.run_id, p.after_seq).await?;
                self.follow(p.run_id.clone(), subscription, subs);
                json!({"runId": p.run_id, "afterSeq": p.after_seq})
            }
            "run.unsubscribe" => {
                let p: RunIdParams = params(payload)?;
                let _ = subs.send((p.run_id.clone(), None));
                json!({"runId": p.run_id, "unsubscribed": true})
            }
            other => return Err(ApiError::new(Code::MethodNotFound, format!("no method '{other}'"))),
        };
        Ok(value)
    }

    /// Forwards a subscription's events to this connection until the run
    /// ends; a subscriber that fell behind closes the connection with a
    /// reason (the client resubscribes after its last seq).
    fn follow(&self, run_id: String, mut subscription: crate::service::Subscription, subs: &SubChanges) {
        let conn = self.clone();
        let id = run_id.clone();
        let task = tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = subscription.next() => next,
                    _ = conn.closed.cancelled() => return,
                };
                match next {
                    Next::Event(event) => {
                        let frame = json!({
                            "type": "event",
                            "event": event.kind.name(),
                            "runId": &*event.run_id,
                            "seq": event.seq,
                            "payload": &*event,
                        });
                        if conn.out.send(frame.to_string()).await.is_err() {
                            return;
                        }
                    }
                    Next::End => return,
                    Next::Lagged => {
                        metrics::counter!("loom_subscribers_dropped_total").increment(1);
                        let reason = format!("too slow for run {id}: resubscribe after your last seq");
                        // The queue is full: this close jumps it.
                        conn.close(TRY_AGAIN_LATER, reason);
                        return;
                    }
                }
            }
        });
        let _ = subs.send((run_id, Some(task)));
    }
}

fn to_value(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}
