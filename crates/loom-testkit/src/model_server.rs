//! [`PromptModel`]: a fake OpenAI-compatible model server on 127.0.0.1 that
//! answers from directives in the prompt, so many concurrent runs (the
//! gateway's tests and its load harness) can each get their own script.
//!
//! The prompt's words `key=value` are the directives (the last user
//! message holding one counts, so a steered or continued conversation
//! keeps its script):
//!
//! - `steps=N` — call a tool in the first N answers, then answer in text
//!   (default 0: answer at once; a request that offers no tools is
//!   answered in text, as a final-answer call must be);
//! - `tool=NAME` — the tool to call (default `list_dir`); `write_file`
//!   writes `out_K.txt`, `task` starts a sub-agent whose prompt is
//!   `child=…` with `:` read as `=` and `+` as a space (`child=steps:1+tool:write_file`
//!   gives the child `steps=1 tool=write_file`) and whose tools are that
//!   tool, `bash` runs `echo step K` (or the `bash=` command), every other
//!   tool gets `{"path": "."}`;
//! - `bash=COMMAND` — what `bash` runs, with `+` read as a space and `STEP`
//!   as the step's number (`bash=echo+STEP+>>+effects.txt;sleep+2`);
//! - `delay_ms=N` — wait before answering (default: the server's delay);
//! - `chunk_ms=N` — wait before each chunk of the stream (default 0);
//! - `answer=TEXT` — the final answer (one word; default `done`);
//! - `long=N` — answer with N text chunks of 64 characters (a flood of
//!   `llm.delta` events);
//! - `stamp=1` — each text chunk holds the time it was sent,
//!   `t=MICROS_SINCE_EPOCH;`, to measure how late a client sees it.
//!
//! It runs on its own thread with its own tokio runtime: async and sync
//! tests can use it, and a load harness can drive tens of thousands of
//! waiting requests without a thread each.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

/// How the server answers unless the prompt says otherwise.
#[derive(Debug, Clone, Default)]
pub struct PromptModelOptions {
    /// Wait before every answer.
    pub delay: Duration,
    /// Keep every request body for [`PromptModel::bodies`] (off for load:
    /// bodies grow with each run's history).
    pub keep_bodies: bool,
    /// Faults to inject from the start ([`PromptModel::set_faults`]).
    pub faults: Option<FaultPlan>,
}

/// A fault the server injects instead of a clean answer (the fault
/// campaign, bench/faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `500` with a JSON error.
    ServerError,
    /// `429` with `Retry-After: 1`.
    RateLimited,
    /// Half the stream, then the connection is reset.
    ResetMidStream,
    /// Half the stream, then a clean end: no finish, no `[DONE]`.
    Truncated,
    /// A `data:` line that is not JSON, then the end.
    Garbage,
    /// Nothing for [`FaultPlan::stall`], then the answer.
    Stall,
}

/// Which requests get a fault: every `every`-th, the next kind of `kinds`
/// in turn.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    /// One request in this many (1: every request).
    pub every: usize,
    /// The faults, in turn.
    pub kinds: Vec<Fault>,
    /// How long a [`Fault::Stall`] waits.
    pub stall: Duration,
}

/// A running fake model. Dropping it leaves the server running until the
/// process ends (tests are short; a harness keeps it for its whole life).
pub struct PromptModel {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    requests: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
    options: PromptModelOptions,
    faults: Mutex<Option<FaultPlan>>,
    injected: AtomicUsize,
}

impl PromptModel {
    /// Starts the server on 127.0.0.1 with `options`.
    pub fn start(options: PromptModelOptions) -> Self {
        let shared = Arc::new(Shared {
            faults: Mutex::new(options.faults.clone()),
            options,
            ..Shared::default()
        });
        let port = crate::http_thread::serve(
            Router::new()
                .route("/v1/chat/completions", post(answer))
                .route("/chat/completions", post(answer))
                .with_state(shared.clone()),
        );
        Self { port, shared }
    }

    /// The base URL to give Loom (`--base-url`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// How many requests came.
    pub fn request_count(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Injects `faults` from now on (`None`: answers cleanly again).
    pub fn set_faults(&self, faults: Option<FaultPlan>) {
        if let Ok(mut slot) = self.shared.faults.lock() {
            *slot = faults;
        }
    }

    /// How many faults were injected.
    pub fn faults_injected(&self) -> usize {
        self.shared.injected.load(Ordering::SeqCst)
    }

    /// The request bodies, when kept.
    pub fn bodies(&self) -> Vec<Value> {
        self.shared.bodies.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

/// The directives of a prompt.
#[derive(Debug, Clone, PartialEq)]
struct Directives {
    steps: usize,
    tool: String,
    delay: Option<Duration>,
    chunk: Duration,
    answer: String,
    stamp: bool,
    long: usize,
    /// A sub-agent's directives (`tool=task`).
    child: String,
    /// What `bash` runs (`STEP` for the step's number).
    bash: String,
}

impl Directives {
    fn parse(text: &str) -> Option<Self> {
        let mut found = false;
        let mut directives = Self {
            steps: 0,
            tool: "list_dir".into(),
            delay: None,
            chunk: Duration::ZERO,
            answer: "done".into(),
            stamp: false,
            long: 0,
            child: "steps=0".into(),
            bash: "echo step STEP".into(),
        };
        for word in text.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            let number = value.parse::<u64>().ok();
            match (key, number) {
                ("steps", Some(n)) => directives.steps = n as usize,
                ("tool", _) => directives.tool = value.to_string(),
                ("delay_ms", Some(n)) => directives.delay = Some(Duration::from_millis(n)),
                ("chunk_ms", Some(n)) => directives.chunk = Duration::from_millis(n),
                ("answer", _) => directives.answer = value.to_string(),
                ("stamp", Some(n)) => directives.stamp = n != 0,
                ("long", Some(n)) => directives.long = n as usize,
                ("child", _) => directives.child = value.replace(':', "=").replace('+', " "),
                ("bash", _) => directives.bash = value.replace('+', " "),
                _ => continue,
            }
            found = true;
        }
        found.then_some(directives)
    }
}

/// The parts of a chat request the fake reads. Typed and borrowing, so a
/// load of tens of thousands of requests does not build a map of every
/// tool schema and message (the fake must never be the bottleneck).
#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(default, borrow)]
    messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    tools: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize)]
struct ChatMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default)]
    content: Value,
}

impl ChatRequest<'_> {
    fn offers_tools(&self) -> bool {
        self.tools.as_ref().is_some_and(|tools| !tools.is_empty())
    }

    /// The script of the conversation, and how many tool results came
    /// after it.
    fn script(&self) -> (Option<Directives>, usize) {
        for (index, message) in self.messages.iter().enumerate().rev() {
            if message.role != "user" {
                continue;
            }
            let text = match &message.content {
                Value::String(text) => text.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => continue,
            };
            if let Some(directives) = Directives::parse(&text) {
                let results = self.messages[index..].iter().filter(|m| m.role == "tool").count();
                return (Some(directives), results);
            }
        }
        (None, 0)
    }
}

fn now_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The fault request number `n` (from 1) gets, if any.
fn fault_for(shared: &Shared, n: usize) -> Option<(Fault, Duration)> {
    let plan = shared.faults.lock().ok()?.clone()?;
    if plan.every == 0 || plan.kinds.is_empty() || n % plan.every != 0 {
        return None;
    }
    shared.injected.fetch_add(1, Ordering::SeqCst);
    Some((plan.kinds[(n / plan.every) % plan.kinds.len()], plan.stall))
}

async fn answer(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let n = shared.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let fault = fault_for(&shared, n);
    match fault {
        Some((Fault::ServerError, _)) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "application/json")],
                r#"{"error":{"message":"injected fault","type":"server_error"}}"#,
            )
                .into_response()
        }
        Some((Fault::RateLimited, _)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::CONTENT_TYPE, "application/json"), (header::RETRY_AFTER, "1")],
                r#"{"error":{"message":"injected rate limit","type":"rate_limit_exceeded"}}"#,
            )
                .into_response()
        }
        Some((Fault::Stall, stall)) => tokio::time::sleep(stall).await,
        _ => {}
    }
    let request: ChatRequest<'_> = serde_json::from_slice(&body).unwrap_or(ChatRequest {
        messages: Vec::new(),
        tools: None,
    });
    let (directives, done) = request.script();
    // A request without tools (a final-answer call) gets the answer.
    let tools_offered = request.offers_tools();
    if shared.options.keep_bodies {
        if let Ok(mut bodies) = shared.bodies.lock() {
            bodies.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
        }
    }
    let directives = directives.unwrap_or_else(|| Directives::parse("steps=0").expect("a directive"));
    let delay = directives.delay.unwrap_or(shared.options.delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let stream = if done < directives.steps && tools_offered {
        let step = done + 1;
        // Nine letters and digits, as the servers of Mistral models give
        // ids (their chat templates refuse any other shape).
        let id = format!("c{step:04}{:04x}", fastrand::u16(..));
        let args = match directives.tool.as_str() {
            "write_file" => format!(r#"{{"path":"out_{step}.txt","content":"step {step}"}}"#),
            "task" => {
                let child = Directives::parse(&directives.child);
                let tools = child.map_or_else(|| "list_dir".to_string(), |child| child.tool);
                serde_json::json!({
                    "description": format!("part {step}"),
                    "prompt": format!("sub-task {}", directives.child),
                    "tools": [tools],
                })
                .to_string()
            }
            "bash" => serde_json::json!({"command": directives.bash.replace("STEP", &step.to_string())}).to_string(),
            _ => r#"{"path":"."}"#.to_string(),
        };
        crate::openai_tool_calls(&[(id.as_str(), directives.tool.as_str(), args.as_str())])
    } else if directives.stamp {
        // Stamped later, chunk by chunk, as it is sent.
        Vec::new()
    } else if directives.long > 0 {
        let filler: String = "lorem ipsum dolor sit amet "
            .chars()
            .cycle()
            .take(directives.long * 64)
            .collect();
        crate::openai_text(&filler, 64)
    } else {
        crate::openai_text(&directives.answer, 8)
    };
    let chunk = directives.chunk;
    let stamp = directives.stamp && (done >= directives.steps || !tools_offered);
    let answer_text = directives.answer.clone();
    let events = futures_stream(stream, chunk, stamp, answer_text);
    let events = match fault {
        Some((kind @ (Fault::ResetMidStream | Fault::Truncated | Fault::Garbage), _)) => {
            futures_util::StreamExt::boxed(cut_short(events, kind))
        }
        _ => futures_util::StreamExt::boxed(events),
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(events),
    )
        .into_response()
}

/// `events` broken as `kind` says: half of them, then a reset or a clean
/// end; or a line of garbage instead.
fn cut_short(
    events: impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    kind: Fault,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    use futures_util::StreamExt;
    let garbage = futures_util::stream::once(async { Ok(Bytes::from_static(b"data: {\"choices\": [garb\n\n")) });
    match kind {
        Fault::Garbage => garbage.boxed(),
        _ => {
            let reset = kind == Fault::ResetMidStream;
            events
                .take(2)
                .chain(futures_util::stream::once(async move {
                    if reset {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "injected reset",
                        ))
                    } else {
                        Ok(Bytes::new())
                    }
                }))
                .boxed()
        }
    }
}

/// The stream's events one by one, `chunk` apart; stamped text chunks are
/// written when they are sent.
fn futures_stream(
    stream: Vec<u8>,
    chunk: Duration,
    stamp: bool,
    answer: String,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let events: Vec<Option<Vec<u8>>> = if stamp {
        // Placeholders: each is one stamped text chunk.
        let mut events: Vec<Option<Vec<u8>>> = vec![None; 4];
        events.push(Some(crate::openai_text_tail(&answer)));
        events
    } else {
        let text = String::from_utf8_lossy(&stream).into_owned();
        text.split_inclusive("\n\n")
            .map(|e| Some(e.as_bytes().to_vec()))
            .collect()
    };
    futures_util::stream::unfold((events.into_iter(), chunk), |(mut rest, chunk)| async move {
        let next = rest.next()?;
        if !chunk.is_zero() {
            tokio::time::sleep(chunk).await;
        }
        let bytes = next.unwrap_or_else(|| crate::openai_text_piece(&format!("t={};", now_micros())));
        Some((Ok(Bytes::from(bytes)), (rest, chunk)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_come_from_the_last_user_message_that_has_them() {
        let body = serde_json::json!({"messages": [
            {"role": "system", "content": "x"},
            {"role": "user", "content": "do it steps=2 tool=write_file delay_ms=5"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "content": "ok"},
            {"role": "user", "content": "a steer without directives"},
        ], "tools": [{"type": "function"}]})
        .to_string();
        let request: ChatRequest<'_> = serde_json::from_str(&body).unwrap();
        assert!(request.offers_tools());
        let (directives, done) = request.script();
        let directives = directives.unwrap();
        assert_eq!((directives.steps, directives.tool.as_str(), done), (2, "write_file", 1));
        assert_eq!(directives.delay, Some(Duration::from_millis(5)));
        assert_eq!(Directives::parse("no directives here"), None);
    }
}
