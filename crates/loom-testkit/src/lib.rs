//! Test doubles for Loom's tests. The remote model is the one thing Loom's
//! tests replace: [`FakeServer`] is a real HTTP/1.1 server on 127.0.0.1
//! that answers with bytes the test chooses — recorded SSE streams, error
//! statuses with `Retry-After`, streams cut short, connections reset — and
//! keeps every request it received so tests can check what Loom sent.
//!
//! It runs on plain threads, so both async tests and tests that drive the
//! `loom` binary can use it.

// Test support only: a fake server that cannot bind fails the test that uses it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_thread;
pub mod mcp_servers;
mod model_server;
mod noop;
pub mod otlp_receiver;
pub mod redaction;
pub mod redis_server;
pub mod store_conformance;
pub mod symlink_race;
pub use model_server::{Fault, FaultPlan, PromptModel, PromptModelOptions};
pub use noop::{NoArgs, NoopTool};

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// A recorded stream from `fixtures/` (e.g. `openai-chat-stream/plain_text.sse`).
pub fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("fixture {}: {err}", path.display()))
}

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `200 text/event-stream` with these bytes, then the connection closes.
    Sse(Vec<u8>),
    /// Like `Sse`, but waits `delay` before each event (`\n\n`-separated).
    SlowSse {
        /// The stream.
        body: Vec<u8>,
        /// Wait before each event.
        delay: Duration,
    },
    /// The first `bytes` of an SSE stream, then a TCP reset.
    Reset(Vec<u8>),
    /// Any status with a body and extra headers.
    Status {
        /// HTTP status.
        status: u16,
        /// Extra headers, e.g. `("Retry-After", "1")`.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
    },
    /// `200 application/json` with this body.
    Json(Value),
}

impl Reply {
    /// An error status with a JSON body.
    pub fn status(status: u16, body: Value) -> Self {
        Self::Status {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    /// `429` with `Retry-After: secs`.
    pub fn rate_limited(secs: u32) -> Self {
        Self::Status {
            status: 429,
            headers: vec![("Retry-After".into(), secs.to_string())],
            body: json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}).to_string(),
        }
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST`, …
    pub method: String,
    /// The path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Headers, names in lower case.
    pub headers: HashMap<String, String>,
    /// The body as JSON (`Null` when it was not JSON).
    pub body: Value,
}

/// A fake model server on 127.0.0.1 that plays a list of replies in order.
pub struct FakeServer {
    port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    count: Arc<AtomicUsize>,
}

/// What the server keeps of the requests it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Every request, for [`FakeServer::requests`].
    All,
    /// Only how many came (each body is still parsed, so the server does the
    /// same work): for long benchmarks, whose request bodies grow with the
    /// history and would otherwise pile up in memory.
    Count,
}

impl FakeServer {
    /// Starts serving `replies`, one per request, in order. Requests past the
    /// end get a 500 saying the script ran out.
    pub fn start(replies: Vec<Reply>) -> Self {
        Self::serve(replies, Keep::All)
    }

    /// Like [`FakeServer::start`], but keeps only the number of requests
    /// ([`FakeServer::request_count`]); [`FakeServer::requests`] stays empty.
    pub fn start_counting(replies: Vec<Reply>) -> Self {
        Self::serve(replies, Keep::Count)
    }

    fn serve(replies: Vec<Reply>, keep: Keep) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let seen = Seen {
            requests: requests.clone(),
            count: count.clone(),
            keep,
        };
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                let replies = replies.clone();
                thread::spawn(move || serve(stream, &seen, &replies));
            }
        });
        Self { port, requests, count }
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Where a connection's thread records what it received.
#[derive(Clone)]
struct Seen {
    requests: Arc<Mutex<Vec<Request>>>,
    count: Arc<AtomicUsize>,
    keep: Keep,
}

fn serve(stream: TcpStream, seen: &Seen, replies: &Mutex<std::vec::IntoIter<Reply>>) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    loop {
        let Some(request) = read_request(&mut reader) else {
            return;
        };
        seen.count.fetch_add(1, Ordering::SeqCst);
        if seen.keep == Keep::All {
            if let Ok(mut requests) = seen.requests.lock() {
                requests.push(request);
            }
        }
        let reply = replies.lock().ok().and_then(|mut r| r.next());
        let keep_open = match reply {
            Some(reply) => answer(&mut stream, reply),
            None => {
                let body = json!({"error": {"message": "the fake server has no reply left", "type": "server_error"}});
                answer(&mut stream, Reply::status(500, body))
            }
        };
        if !keep_open {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// An OpenAI stream that carries no choices at all (only usage), as some
/// servers send when the model produced nothing.
pub fn openai_no_choices() -> Vec<u8> {
    openai_sse(&[openai_usage(20, 0)])
}

/// Writes a reply; returns whether the connection can serve another request.
fn answer(stream: &mut TcpStream, reply: Reply) -> bool {
    const SSE_HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    match reply {
        Reply::Sse(body) => {
            let _ = stream.write_all(SSE_HEAD.as_bytes());
            let _ = stream.write_all(&body);
            let _ = stream.flush();
            false
        }
        Reply::SlowSse { body, delay } => {
            let _ = stream.write_all(SSE_HEAD.as_bytes());
            let text = String::from_utf8_lossy(&body).into_owned();
            for event in text.split_inclusive("\n\n") {
                thread::sleep(delay);
                if stream.write_all(event.as_bytes()).and_then(|_| stream.flush()).is_err() {
                    break;
                }
            }
            false
        }
        Reply::Reset(partial) => {
            let _ = stream.write_all(SSE_HEAD.as_bytes());
            let _ = stream.write_all(&partial);
            let _ = stream.flush();
            thread::sleep(Duration::from_millis(50));
            let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
            let _ = stream.shutdown(std::net::Shutdown::Read);
            false
        }
        Reply::Status { status, headers, body } => {
            let mut head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                reason(status),
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).is_ok() && stream.write_all(body.as_bytes()).is_ok()
        }
        Reply::Json(value) => {
            let body = value.to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).is_ok() && stream.write_all(body.as_bytes()).is_ok()
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// An OpenAI chat completions stream from chunk objects, ending in `[DONE]`.
pub fn openai_sse(chunks: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for chunk in chunks {
        out.push_str(&format!("data: {chunk}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn openai_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1727346178, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
}

fn openai_usage(prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1727346178, "model": "fake",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    })
}

/// An OpenAI stream answering `text` in pieces of about `piece` characters.
pub fn openai_text(text: &str, piece: usize) -> Vec<u8> {
    openai_text_ending(text, piece, "stop")
}

/// One text chunk of an OpenAI stream, as its `data:` line.
pub fn openai_text_piece(text: &str) -> Vec<u8> {
    format!("data: {}\n\n", openai_chunk(json!({"content": text}), None)).into_bytes()
}

/// The end of an OpenAI text stream: finish reason `stop`, usage, `[DONE]`.
pub fn openai_text_tail(text: &str) -> Vec<u8> {
    openai_sse(&[
        openai_chunk(json!({}), Some("stop")),
        openai_usage(20, text.len() as u64 / 4 + 1),
    ])
}

/// Like [`openai_text`], ending with `finish_reason` (`length`, `content_filter`, …).
pub fn openai_text_ending(text: &str, piece: usize, finish_reason: &str) -> Vec<u8> {
    let mut chunks = vec![openai_chunk(json!({"role": "assistant", "content": ""}), None)];
    let chars: Vec<char> = text.chars().collect();
    for part in chars.chunks(piece.max(1)) {
        chunks.push(openai_chunk(json!({"content": part.iter().collect::<String>()}), None));
    }
    chunks.push(openai_chunk(json!({}), Some(finish_reason)));
    chunks.push(openai_usage(20, chars.len() as u64 / 4 + 1));
    openai_sse(&chunks)
}

/// An OpenAI stream calling tools `(id, name, arguments text)`, the
/// argument text of every call split in pieces and the calls interleaved.
pub fn openai_tool_calls(calls: &[(&str, &str, &str)]) -> Vec<u8> {
    openai_tool_calls_with_usage(calls, 50, 20)
}

/// Like [`openai_tool_calls`], reporting `prompt` and `completion` tokens.
pub fn openai_tool_calls_with_usage(calls: &[(&str, &str, &str)], prompt: u64, completion: u64) -> Vec<u8> {
    let mut chunks = vec![openai_chunk(json!({"role": "assistant", "content": null}), None)];
    for (index, (id, name, _)) in calls.iter().enumerate() {
        chunks.push(openai_chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
    }
    let pieces: Vec<Vec<String>> = calls
        .iter()
        .map(|(_, _, args)| {
            let chars: Vec<char> = args.chars().collect();
            chars.chunks(5).map(|c| c.iter().collect()).collect()
        })
        .collect();
    let longest = pieces.iter().map(Vec::len).max().unwrap_or(0);
    for step in 0..longest {
        for (index, parts) in pieces.iter().enumerate() {
            if let Some(part) = parts.get(step) {
                chunks.push(openai_chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": part}}]}),
                    None,
                ));
            }
        }
    }
    chunks.push(openai_chunk(json!({}), Some("tool_calls")));
    chunks.push(openai_usage(prompt, completion));
    openai_sse(&chunks)
}

fn anthropic_event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn anthropic_open(out: &mut String) {
    out.push_str(&anthropic_event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-fake", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 42, "output_tokens": 1}}}),
    ));
    out.push_str(&anthropic_event("ping", json!({"type": "ping"})));
}

fn anthropic_close(out: &mut String, stop_reason: &str) {
    out.push_str(&anthropic_event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 17}}),
    ));
    out.push_str(&anthropic_event("message_stop", json!({"type": "message_stop"})));
}

/// An Anthropic stream answering `text`.
pub fn anthropic_text(text: &str) -> Vec<u8> {
    anthropic_text_ending(text, "end_turn")
}

/// Like [`anthropic_text`], ending with `stop_reason` (`max_tokens`, `refusal`, …);
/// an empty `text` sends no content block at all.
pub fn anthropic_text_ending(text: &str, stop_reason: &str) -> Vec<u8> {
    let mut out = String::new();
    if text.is_empty() {
        anthropic_open(&mut out);
        anthropic_close(&mut out, stop_reason);
        return out.into_bytes();
    }
    anthropic_open(&mut out);
    out.push_str(&anthropic_event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ));
    for word in text.split_inclusive(' ') {
        out.push_str(&anthropic_event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
        ));
    }
    out.push_str(&anthropic_event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    anthropic_close(&mut out, stop_reason);
    out.into_bytes()
}

/// An Anthropic stream with some text, then `tool_use` blocks `(id, name,
/// input JSON text)` whose input arrives as `input_json_delta` pieces.
pub fn anthropic_tool_use(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut out = String::new();
    anthropic_open(&mut out);
    let mut index = 0;
    if !text.is_empty() {
        out.push_str(&anthropic_event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ));
        out.push_str(&anthropic_event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ));
        out.push_str(&anthropic_event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        index = 1;
    }
    for (id, name, input) in calls {
        out.push_str(&anthropic_event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        ));
        let chars: Vec<char> = input.chars().collect();
        for part in chars.chunks(6) {
            out.push_str(&anthropic_event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": part.iter().collect::<String>()}}),
            ));
        }
        out.push_str(&anthropic_event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    anthropic_close(&mut out, "tool_use");
    out.into_bytes()
}

/// Events as JSON without what differs between two runs by nature — ids,
/// times, the model's name, durations, metrics — so a live run and its
/// replay can be compared.
pub fn comparable_events(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .map(|event| {
            let mut event = event.clone();
            if let Some(object) = event.as_object_mut() {
                for key in [
                    "runId",
                    "turnId",
                    "parentTurnId",
                    "ts",
                    "model",
                    "durationMs",
                    "stages",
                    "metrics",
                    "elapsedSeconds",
                ] {
                    object.remove(key);
                }
            }
            event
        })
        .collect()
}
