//! Spans made from a run's events, without IO (docs/telemetry.md): a run
//! is an `invoke_agent` span, each model call a `chat` span and each tool
//! call an `execute_tool` span beneath it; a sub-agent's `invoke_agent`
//! span hangs beneath the `execute_tool task` span that started it; a
//! compression and a person's wait are spans of their own.
//!
//! Ids are derived from Loom's ids, so any process that sees a run's
//! events — the one that started it, the one that resumed it after a
//! crash, the worker that took it over — makes the same ones: the trace
//! of a run tree is its root run's, and a span's parent is found without
//! asking anyone.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loom_core::{Event, EventKind, RunStatus, ToolStatus, TraceParent};
use sha2::{Digest, Sha256};

use crate::content::{message_json, Content, Kept};
use crate::conventions as attr;

/// A value of an attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Text(String),
    /// An integer.
    Int(i64),
    /// A number.
    Float(f64),
    /// A flag.
    Bool(bool),
    /// Strings.
    Texts(Vec<String>),
}

/// What a span says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Work inside Loom.
    Internal,
    /// A call to another service (the model).
    Client,
}

/// A finished span, ready to export.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSpan {
    /// Its name (`invoke_agent loom`, `chat gpt-4o`, `execute_tool bash`).
    pub name: String,
    /// Its trace: its root run's.
    pub trace_id: [u8; 16],
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent's id, if any.
    pub parent: Option<[u8; 8]>,
    /// Its parent is a client's span (a `traceparent` given with the run),
    /// not one of Loom's.
    pub parent_is_remote: bool,
    /// The client's sampling decision for the trace, when a client gave
    /// the trace context: it is followed, whatever the ratio.
    pub sampled_by_client: Option<bool>,
    /// What it is.
    pub kind: Kind,
    /// When it began.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// The error it ended in (`None`: it did not fail).
    pub error: Option<String>,
}

/// The trace of a run tree: derived from its root run's id (a sub-agent's
/// id is its root's followed by `.`), so every process makes the same.
pub fn trace_id_of(run_id: &str) -> [u8; 16] {
    let root = run_id.split('.').next().unwrap_or(run_id);
    let digest = Sha256::digest(format!("loom-trace:{root}").as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    if id == [0u8; 16] {
        id[15] = 1;
    }
    id
}

/// A span id derived from `parts`.
fn span_id(parts: &[&str]) -> [u8; 8] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0u8; 8] {
        id[7] = 1;
    }
    id
}

/// The span of a run.
pub fn run_span_id(run_id: &str) -> [u8; 8] {
    span_id(&["run", run_id])
}

/// The span of a tool call of a run.
fn tool_span_id(run_id: &str, call_id: &str) -> [u8; 8] {
    span_id(&["tool", run_id, call_id])
}

/// `2026-11-27T04:55:54.550Z` (Loom's event times) as a time.
pub fn parse_ts(ts: &str) -> Option<SystemTime> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    let millis: u64 = format!("{fraction:0<3}").get(..3)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = u64::try_from(days * 86_400 + hour * 3_600 + minute * 60 + second).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(seconds) + Duration::from_millis(millis))
}

/// A model call under way.
struct OpenChat {
    start: SystemTime,
    model: String,
    /// Its `llm.start`'s seq: its span's id (a seq goes on across a resume).
    seq: u64,
    first_chunk: Option<SystemTime>,
}

/// A person's wait under way.
struct OpenWait {
    start: SystemTime,
    tool: String,
}

/// What is open of one run in this process.
struct OpenRun {
    /// When this process saw it begin (or resume).
    start: SystemTime,
    /// When it was last heard of here: a run is forgotten a day after
    /// that, not after its start (a run waiting on a person for a day
    /// keeps its trace).
    seen: SystemTime,
    model: String,
    depth: u32,
    session_id: String,
    /// The client's trace context the run tree was started with.
    trace_parent: Option<TraceParent>,
    /// The agent defined in a file the run is, if any.
    agent: Option<String>,
    /// Its prompt, when contents are captured.
    prompt: Option<String>,
    chat: Option<OpenChat>,
    /// Tool calls under way: when each began, and its arguments when
    /// contents are captured.
    tools: HashMap<String, (SystemTime, Option<String>)>,
    /// Questions under way, by request id.
    waits: HashMap<String, OpenWait>,
}

/// Makes spans of the events of the runs it is shown, as they come. What
/// a run leaves open goes with its `lifecycle.end`; what never ends here
/// (a run interrupted in this process and resumed elsewhere) is forgotten
/// a day after it began.
#[derive(Default)]
pub struct SpanAssembler {
    runs: HashMap<String, OpenRun>,
    content: Content,
    /// Events seen since the last sweep of what never ended here.
    since_sweep: u32,
}

/// What is left open longer than this is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Events between two sweeps.
const SWEEP_EVERY: u32 = 4096;

/// `provider:model` split (`openai`, `gpt-4o`).
fn provider_and_model(model: &str) -> (&str, &str) {
    model.split_once(':').unwrap_or(("", model))
}

/// The span of the `task` call that starts the sub-agent `child_run_id`:
/// derived from the child's id (itself derived from the parent's run and
/// call), so the child finds its parent's span with nothing else known.
fn task_span_id(child_run_id: &str) -> [u8; 8] {
    span_id(&["sub-agent", child_run_id])
}

/// Whether an event can open or close a span (the rest — text deltas,
/// tool output, phases — is passed over without taking any lock).
pub fn makes_spans(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::LifecycleStart { .. }
            | EventKind::LifecycleEnd { .. }
            | EventKind::LlmStart { .. }
            | EventKind::LlmDelta { .. }
            | EventKind::LlmFinish { .. }
            | EventKind::Error { .. }
            | EventKind::ToolCallsStart { .. }
            | EventKind::ToolResult { .. }
            | EventKind::PermissionRequest { .. }
            | EventKind::PermissionResolved { .. }
            | EventKind::CompressionApplied { .. }
            | EventKind::SnapshotRecorded { .. }
    )
}

impl SpanAssembler {
    /// An assembler that records contents as `content` says.
    pub fn new(content: Content) -> Self {
        Self {
            content,
            ..Self::default()
        }
    }

    /// Takes `event` of a run of session `session_id`; the spans it ends.
    /// Its contents are redacted here (see [`Self::observe_kept`]).
    pub fn observe(&mut self, session_id: &str, event: &Event) -> Vec<FinishedSpan> {
        let kept = self.content.kept(&event.kind);
        self.observe_kept(session_id, event, kept)
    }

    /// [`Self::observe`] with `event`'s contents already redacted, as
    /// [`Content::kept`] made them (outside any lock).
    pub fn observe_kept(&mut self, session_id: &str, event: &Event, kept: Kept) -> Vec<FinishedSpan> {
        if !makes_spans(&event.kind) {
            return Vec::new();
        }
        let run_id = event.run_id.as_ref();
        let Some(at) = parse_ts(&event.ts) else {
            return Vec::new();
        };
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.since_sweep = 0;
            self.forget_before(at.checked_sub(FORGET_AFTER).unwrap_or(UNIX_EPOCH));
        }
        if let EventKind::LifecycleStart {
            model,
            trace_parent,
            agent,
            ..
        } = &event.kind
        {
            self.runs.insert(
                run_id.to_string(),
                OpenRun {
                    start: at,
                    seen: at,
                    model: model.clone(),
                    depth: event.depth,
                    session_id: session_id.to_string(),
                    trace_parent: *trace_parent,
                    agent: agent.clone(),
                    prompt: kept.prompt,
                    chat: None,
                    tools: HashMap::new(),
                    waits: HashMap::new(),
                },
            );
            return Vec::new();
        }
        // A run first seen by its later events began in another process:
        // its spans still get the same ids and parents.
        let run = self.runs.entry(run_id.to_string()).or_insert_with(|| OpenRun {
            start: at,
            seen: at,
            model: String::new(),
            depth: event.depth,
            session_id: session_id.to_string(),
            trace_parent: None,
            agent: None,
            prompt: None,
            chat: None,
            tools: HashMap::new(),
            waits: HashMap::new(),
        });
        run.seen = at;
        // A client's trace context puts the tree in the client's trace.
        let trace_id = run
            .trace_parent
            .map_or_else(|| trace_id_of(run_id), |given| given.trace_id);
        let sampled_by_client = run.trace_parent.map(|given| given.sampled());
        let span =
            |name: String, span_id: [u8; 8], parent: Option<[u8; 8]>, kind: Kind, start: SystemTime| FinishedSpan {
                name,
                trace_id,
                span_id,
                parent,
                parent_is_remote: false,
                sampled_by_client,
                kind,
                start,
                end: at,
                attributes: Vec::new(),
                error: None,
            };
        let mut finished = Vec::new();
        match &event.kind {
            EventKind::LlmStart { model, .. } => {
                // A call still open was given up (retried with a shorter context).
                if let Some(chat) = run.chat.take() {
                    finished.push(chat_span(&span, run_id, chat, None, None, Some("retried")));
                }
                run.chat = Some(OpenChat {
                    start: at,
                    model: model.clone(),
                    seq: event.seq,
                    first_chunk: None,
                });
            }
            EventKind::LlmDelta { .. } => {
                if let Some(chat) = run.chat.as_mut() {
                    chat.first_chunk.get_or_insert(at);
                }
            }
            EventKind::LlmFinish {
                usage,
                finish_reason,
                response_model,
                ..
            } => {
                if let Some(chat) = run.chat.take() {
                    let mut call = chat_span(&span, run_id, chat, usage.as_ref(), finish_reason.as_deref(), None);
                    if let Some(model) = response_model {
                        call.attributes.push((attr::RESPONSE_MODEL, Value::Text(model.clone())));
                    }
                    if let Some(text) = &kept.answer {
                        let output = message_json("assistant", text, finish_reason.as_deref());
                        call.attributes.push((attr::OUTPUT_MESSAGES, Value::Text(output)));
                    }
                    finished.push(call);
                }
            }
            EventKind::Error { .. } => {
                if let Some(chat) = run.chat.take() {
                    finished.push(chat_span(&span, run_id, chat, None, None, Some("error")));
                }
            }
            EventKind::ToolCallsStart { calls } => {
                let mut arguments: HashMap<String, String> = kept.arguments.into_iter().collect();
                for call in calls {
                    run.tools
                        .insert(call.call_id.clone(), (at, arguments.remove(&call.call_id)));
                }
            }
            EventKind::ToolResult {
                call_id, name, status, ..
            } => {
                let (start, arguments) = run.tools.remove(call_id).unwrap_or((at, None));
                let failed = !matches!(status, ToolStatus::Success | ToolStatus::Warning);
                let id = if name == "task" {
                    task_span_id(&loom_core::delegate::child_run_id(run_id, call_id))
                } else {
                    tool_span_id(run_id, call_id)
                };
                // As the spans show them: redacted (a model may make a name up).
                let shown_name = kept.tool.unwrap_or_else(|| name.clone());
                let shown_call = kept.call_id.unwrap_or_else(|| call_id.clone());
                let mut tool = span(
                    format!("execute_tool {shown_name}"),
                    id,
                    Some(run_span_id(run_id)),
                    Kind::Internal,
                    start,
                );
                tool.attributes = vec![
                    (attr::OPERATION_NAME, Value::Text("execute_tool".into())),
                    (attr::TOOL_NAME, Value::Text(shown_name)),
                    (attr::TOOL_CALL_ID, Value::Text(shown_call)),
                    (attr::TOOL_TYPE, Value::Text(tool_type(name).into())),
                    (attr::TOOL_STATUS, Value::Text(status.as_str().into())),
                ];
                if failed {
                    tool.attributes
                        .push((attr::ERROR_TYPE, Value::Text(status.as_str().into())));
                    tool.error = Some(status.as_str().to_string());
                }
                if let Some(arguments) = arguments {
                    tool.attributes
                        .push((attr::TOOL_CALL_ARGUMENTS, Value::Text(arguments)));
                }
                if let Some(output) = kept.result {
                    tool.attributes.push((attr::TOOL_CALL_RESULT, Value::Text(output)));
                }
                finished.push(tool);
            }
            EventKind::PermissionRequest { request_id, tool, .. } => {
                run.waits.insert(
                    request_id.clone(),
                    OpenWait {
                        start: at,
                        tool: kept.tool.unwrap_or_else(|| tool.clone()),
                    },
                );
            }
            EventKind::PermissionResolved {
                request_id, decision, ..
            } => {
                if let Some(wait) = run.waits.remove(request_id) {
                    let mut waited = span(
                        "wait_for_person".into(),
                        span_id(&["wait", run_id, request_id]),
                        Some(run_span_id(run_id)),
                        Kind::Internal,
                        wait.start,
                    );
                    waited.attributes = vec![
                        (attr::PERMISSION_TOOL, Value::Text(wait.tool)),
                        (attr::PERMISSION_DECISION, Value::Text(decision.as_str().into())),
                    ];
                    finished.push(waited);
                }
            }
            EventKind::CompressionApplied {
                messages_before,
                messages_after,
                method,
                ..
            } => {
                let mut compressed = span(
                    "compress_context".into(),
                    span_id(&["compression", run_id, &event.seq.to_string()]),
                    Some(run_span_id(run_id)),
                    Kind::Internal,
                    at,
                );
                compressed.attributes = vec![
                    (
                        attr::COMPRESSION_MESSAGES_BEFORE,
                        Value::Int(saturate(*messages_before as u64)),
                    ),
                    (
                        attr::COMPRESSION_MESSAGES_AFTER,
                        Value::Int(saturate(*messages_after as u64)),
                    ),
                    (attr::COMPRESSION_METHOD, Value::Text(method.as_str().into())),
                ];
                finished.push(compressed);
            }
            EventKind::SnapshotRecorded {
                step,
                changed,
                removed,
                skipped,
                duration_ms,
            } => {
                let began = at.checked_sub(Duration::from_millis(*duration_ms)).unwrap_or(at);
                let mut checkpoint = span(
                    "checkpoint".into(),
                    // By seq: a step recorded again after a crash is another span.
                    span_id(&["checkpoint", run_id, &event.seq.to_string()]),
                    Some(run_span_id(run_id)),
                    Kind::Internal,
                    began,
                );
                checkpoint.attributes = vec![
                    (attr::CHECKPOINT_STEP, Value::Int(i64::from(*step))),
                    (
                        attr::CHECKPOINT_FILES_CHANGED,
                        Value::Int(saturate(changed.len() as u64)),
                    ),
                    (
                        attr::CHECKPOINT_FILES_REMOVED,
                        Value::Int(saturate(removed.len() as u64)),
                    ),
                    (
                        attr::CHECKPOINT_FILES_SKIPPED,
                        Value::Int(saturate(skipped.len() as u64)),
                    ),
                ];
                finished.push(checkpoint);
            }
            EventKind::LifecycleEnd { status, metrics, .. } => {
                let Some(mut run) = self.runs.remove(run_id) else {
                    return finished;
                };
                // A model call the run ended in (cancelled, timed out).
                if let Some(chat) = run.chat.take() {
                    finished.push(chat_span(&span, run_id, chat, None, None, Some(status.as_str())));
                }
                // A sub-agent hangs beneath its `task` call; a top-level run
                // beneath the client's span, when a client gave one.
                let (parent, remote) = match (&event.parent_run_id, run.trace_parent) {
                    (Some(_), _) => (Some(task_span_id(run_id)), false),
                    (None, Some(given)) => (Some(given.parent_id), true),
                    (None, None) => (None, false),
                };
                let name = run.agent.take().unwrap_or_else(|| "loom".to_string());
                let mut agent = span(
                    format!("invoke_agent {name}"),
                    run_span_id(run_id),
                    parent,
                    Kind::Internal,
                    run.start,
                );
                agent.parent_is_remote = remote;
                let (provider, model) = provider_and_model(&run.model);
                let failed = matches!(status, RunStatus::Error | RunStatus::Timeout);
                agent.attributes = vec![
                    (attr::OPERATION_NAME, Value::Text("invoke_agent".into())),
                    (attr::AGENT_NAME, Value::Text(name)),
                    (attr::AGENT_ID, Value::Text(run_id.into())),
                    (attr::CONVERSATION_ID, Value::Text(run.session_id)),
                    (attr::USAGE_INPUT_TOKENS, Value::Int(saturate(metrics.input_tokens))),
                    (attr::USAGE_OUTPUT_TOKENS, Value::Int(saturate(metrics.output_tokens))),
                    (attr::RUN_STATUS, Value::Text(status.as_str().into())),
                    (attr::RUN_DEPTH, Value::Int(i64::from(run.depth))),
                ];
                if !model.is_empty() {
                    agent
                        .attributes
                        .push((attr::PROVIDER_NAME, Value::Text(provider.into())));
                    agent.attributes.push((attr::REQUEST_MODEL, Value::Text(model.into())));
                }
                if failed {
                    agent
                        .attributes
                        .push((attr::ERROR_TYPE, Value::Text(status.as_str().into())));
                    agent.error = Some(status.as_str().to_string());
                }
                if let Some(prompt) = run.prompt.take() {
                    agent
                        .attributes
                        .push((attr::INPUT_MESSAGES, Value::Text(message_json("user", &prompt, None))));
                }
                if let Some(text) = &kept.answer {
                    agent.attributes.push((
                        attr::OUTPUT_MESSAGES,
                        Value::Text(message_json("assistant", text, None)),
                    ));
                }
                finished.push(agent);
            }
            _ => {}
        }
        finished
    }

    /// Forgets what was last heard of before `cutoff` and never closed here: a
    /// run interrupted in this process (its end is another's), a call of a
    /// run that stopped, a question nobody answered here.
    fn forget_before(&mut self, cutoff: SystemTime) {
        self.runs.retain(|_, run| run.seen >= cutoff);
    }

    /// How many runs are open here: what a sweep bounds.
    pub fn open(&self) -> usize {
        self.runs.len()
    }
}

/// A model call's span: ended by its `llm.finish` (with the usage and the
/// finish reason), or given up (`failed`: why).
fn chat_span(
    span: &impl Fn(String, [u8; 8], Option<[u8; 8]>, Kind, SystemTime) -> FinishedSpan,
    run_id: &str,
    chat: OpenChat,
    usage: Option<&loom_core::Usage>,
    finish_reason: Option<&str>,
    failed: Option<&str>,
) -> FinishedSpan {
    let (provider, model) = provider_and_model(&chat.model);
    let mut finished = span(
        format!("chat {model}"),
        span_id(&["chat", run_id, &chat.seq.to_string()]),
        Some(run_span_id(run_id)),
        Kind::Client,
        chat.start,
    );
    finished.attributes = vec![
        (attr::OPERATION_NAME, Value::Text("chat".into())),
        (attr::PROVIDER_NAME, Value::Text(provider.into())),
        (attr::REQUEST_MODEL, Value::Text(model.into())),
    ];
    if let Some(reason) = finish_reason {
        finished
            .attributes
            .push((attr::RESPONSE_FINISH_REASONS, Value::Texts(vec![reason.to_string()])));
    }
    if let Some(usage) = usage {
        finished.attributes.push((
            attr::USAGE_INPUT_TOKENS,
            Value::Int(saturate(input_tokens(provider, usage))),
        ));
        finished
            .attributes
            .push((attr::USAGE_OUTPUT_TOKENS, Value::Int(saturate(usage.output_tokens))));
        // Told only when the provider counted any.
        if usage.cache_read_input_tokens > 0 {
            finished.attributes.push((
                attr::USAGE_CACHE_READ_INPUT_TOKENS,
                Value::Int(saturate(usage.cache_read_input_tokens)),
            ));
        }
        if usage.cache_creation_input_tokens > 0 {
            finished.attributes.push((
                attr::USAGE_CACHE_CREATION_INPUT_TOKENS,
                Value::Int(saturate(usage.cache_creation_input_tokens)),
            ));
        }
    }
    if let Some(first) = chat.first_chunk {
        let seconds = first.duration_since(chat.start).unwrap_or_default().as_secs_f64();
        finished
            .attributes
            .push((attr::RESPONSE_TIME_TO_FIRST_CHUNK, Value::Float(seconds)));
    }
    if let Some(why) = failed {
        finished
            .attributes
            .push((attr::ERROR_TYPE, Value::Text(why.to_string())));
        finished.error = Some(why.to_string());
    }
    finished
}

/// A call's prompt tokens as the conventions count them, cached ones
/// included: OpenAI's already are; Anthropic tells its cache reads and
/// writes apart from `input_tokens`.
fn input_tokens(provider: &str, usage: &loom_core::Usage) -> u64 {
    if provider == "anthropic" {
        usage
            .input_tokens
            .saturating_add(usage.cache_read_input_tokens)
            .saturating_add(usage.cache_creation_input_tokens)
    } else {
        usage.input_tokens
    }
}

/// Tools run by Loom are functions; an MCP server's (`server__tool`) are
/// extensions.
fn tool_type(name: &str) -> &'static str {
    if name.contains("__") {
        "extension"
    } else {
        "function"
    }
}

fn saturate(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::{CallSummary, RunMetrics, Usage};

    fn event(run_id: &str, parent: Option<&str>, seq: u64, millis: u64, kind: EventKind) -> Event {
        Event {
            run_id: run_id.into(),
            turn_id: "t".into(),
            parent_turn_id: None,
            depth: u32::from(parent.is_some()),
            parent_run_id: parent.map(Into::into),
            seq,
            ts: format!("2026-11-27T10:00:{:02}.{:03}Z", millis / 1000, millis % 1000),
            kind,
        }
    }

    fn call(id: &str, name: &str) -> CallSummary {
        CallSummary {
            call_id: id.into(),
            name: name.into(),
            args: serde_json::Value::Null,
        }
    }

    fn result(id: &str, name: &str, status: ToolStatus) -> EventKind {
        EventKind::ToolResult {
            call_id: id.into(),
            name: name.into(),
            status,
            content: "the output".into(),
            duration_ms: 5,
            stages: Default::default(),
            decided_by: None,
        }
    }

    fn start(model: &str) -> EventKind {
        EventKind::LifecycleStart {
            prompt: "secret prompt".into(),
            model: model.into(),
            max_steps: 10,
            resumed: false,
            forked_from: None,
            trace_parent: None,
            agent: None,
        }
    }

    fn traced_start(trace_parent: &str) -> EventKind {
        EventKind::LifecycleStart {
            prompt: "fix it with sk-proj-abcdefghijklmnopqrstuvwxyz0123".into(),
            model: "openai:gpt-4o".into(),
            max_steps: 10,
            resumed: false,
            forked_from: None,
            trace_parent: trace_parent.parse().ok(),
            agent: None,
        }
    }

    /// A run whose tool call starts a sub-agent, with the events that
    /// carry contents: its spans.
    fn run_with_a_sub_agent(assembler: &mut SpanAssembler, first: EventKind) -> Vec<FinishedSpan> {
        let child = loom_core::delegate::child_run_id("root", "c1");
        let mut spans = Vec::new();
        let mut see = |event: Event| spans.extend(assembler.observe("s1", &event));
        let child_start = match &first {
            EventKind::LifecycleStart { trace_parent, .. } => EventKind::LifecycleStart {
                prompt: "look".into(),
                model: "openai:gpt-4o".into(),
                max_steps: 3,
                resumed: false,
                forked_from: None,
                trace_parent: *trace_parent,
                agent: Some("reviewer".into()),
            },
            _ => unreachable!(),
        };
        see(event("root", None, 1, 0, first));
        let llm_start = EventKind::LlmStart {
            model: "openai:gpt-4o".into(),
            message_count: 2,
            tools_offered: true,
            final_answer: None,
        };
        see(event("root", None, 2, 10, llm_start));
        see(event(
            "root",
            None,
            3,
            90,
            EventKind::LlmFinish {
                content: "I will look; the token is ghp_abcdefghijklmnopqrstuvwxyz0123456789".into(),
                usage: None,
                finish_reason: Some("tool_calls".into()),
                cost_usd: None,
                tool_call_count: 1,
                response_model: Some("gpt-4o-2024-08-06".into()),
            },
        ));
        let task = CallSummary {
            call_id: "c1".into(),
            name: "task".into(),
            args: serde_json::json!({"prompt": "look", "password": "hunter2-correct-horse"}),
        };
        see(event(
            "root",
            None,
            4,
            100,
            EventKind::ToolCallsStart { calls: vec![task] },
        ));
        see(event(&child, Some("root"), 1, 110, child_start));
        see(event(&child, Some("root"), 2, 200, end(RunStatus::Done)));
        see(event("root", None, 5, 210, result("c1", "task", ToolStatus::Success)));
        see(event(
            "root",
            None,
            6,
            260,
            EventKind::SnapshotRecorded {
                step: 1,
                changed: vec!["a.txt".into(), "b.txt".into()],
                removed: vec!["c.txt".into()],
                skipped: Vec::new(),
                duration_ms: 40,
            },
        ));
        see(event("root", None, 7, 300, end(RunStatus::Done)));
        spans
    }

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_client_trace_context_is_the_parent_of_the_whole_tree() {
        let spans = run_with_a_sub_agent(&mut SpanAssembler::default(), traced_start(GIVEN));
        let given: TraceParent = GIVEN.parse().unwrap();
        assert_eq!(spans.len(), 5, "{spans:?}");
        assert!(spans.iter().all(|span| span.trace_id == given.trace_id));
        assert!(spans.iter().all(|span| span.sampled_by_client == Some(true)));
        let root = spans.iter().find(|span| span.span_id == run_span_id("root")).unwrap();
        assert_eq!(root.parent, Some(given.parent_id));
        assert!(root.parent_is_remote);
        // Only the root hangs beneath the client's span.
        let child = loom_core::delegate::child_run_id("root", "c1");
        let sub = spans.iter().find(|span| span.span_id == run_span_id(&child)).unwrap();
        // A sub-agent defined in a file is named after it.
        assert_eq!(sub.name, "invoke_agent reviewer");
        assert!(sub
            .attributes
            .contains(&(attr::AGENT_NAME, Value::Text("reviewer".into()))));
        assert_eq!(sub.parent, Some(task_span_id(&child)));
        assert!(!sub.parent_is_remote);
        assert!(spans
            .iter()
            .filter(|span| span.span_id != root.span_id)
            .all(|span| span.parent != Some(given.parent_id) && !span.parent_is_remote));

        // A client that did not sample the trace: nothing is exported.
        let unsampled = GIVEN.replace("-01", "-00");
        let spans = run_with_a_sub_agent(&mut SpanAssembler::default(), traced_start(&unsampled));
        assert!(spans.iter().all(|span| span.sampled_by_client == Some(false)));
    }

    #[test]
    fn a_checkpoint_is_a_span_that_lasted_its_recording() {
        let spans = run_with_a_sub_agent(&mut SpanAssembler::default(), start("openai:gpt-4o"));
        let checkpoint = spans.iter().find(|span| span.name == "checkpoint").unwrap();
        assert_eq!(checkpoint.parent, Some(run_span_id("root")));
        assert_eq!(
            checkpoint.end.duration_since(checkpoint.start).unwrap(),
            Duration::from_millis(40)
        );
        assert!(checkpoint.attributes.contains(&(attr::CHECKPOINT_STEP, Value::Int(1))));
        assert!(checkpoint
            .attributes
            .contains(&(attr::CHECKPOINT_FILES_CHANGED, Value::Int(2))));
        assert!(checkpoint
            .attributes
            .contains(&(attr::CHECKPOINT_FILES_REMOVED, Value::Int(1))));
    }

    fn texts(spans: &[FinishedSpan]) -> String {
        format!("{:?}", spans.iter().map(|span| &span.attributes).collect::<Vec<_>>())
    }

    #[test]
    fn contents_are_left_out_unless_captured_and_then_redacted() {
        let left = run_with_a_sub_agent(&mut SpanAssembler::default(), traced_start(GIVEN));
        let left = texts(&left);
        for text in ["fix it", "I will look", "hunter2", "the output", "the answer"] {
            assert!(!left.contains(text), "{text} in {left}");
        }

        let mut captured = SpanAssembler::new(Content::captured(loom_core::Redactor::default()));
        let spans = run_with_a_sub_agent(&mut captured, traced_start(GIVEN));
        let attribute = |name: &str, key: &str| -> String {
            let span = spans.iter().find(|span| span.name == name).unwrap();
            match span.attributes.iter().find(|(k, _)| *k == key) {
                Some((_, Value::Text(text))) => text.clone(),
                other => panic!("{name} {key}: {other:?}"),
            }
        };
        let root = spans.iter().find(|span| span.span_id == run_span_id("root")).unwrap();
        let input = root
            .attributes
            .iter()
            .find_map(|(k, v)| (*k == attr::INPUT_MESSAGES).then_some(v))
            .unwrap();
        let Value::Text(input) = input else { panic!() };
        let input: serde_json::Value = serde_json::from_str(input).unwrap();
        assert_eq!(input[0]["role"], "user");
        let prompt = input[0]["parts"][0]["content"].as_str().unwrap();
        assert!(
            prompt.starts_with("fix it with ") && !prompt.contains("sk-proj"),
            "{prompt}"
        );
        assert_eq!(attribute("chat gpt-4o", attr::RESPONSE_MODEL), "gpt-4o-2024-08-06");
        let output = attribute("chat gpt-4o", attr::OUTPUT_MESSAGES);
        assert!(output.contains("I will look") && !output.contains("ghp_"), "{output}");
        assert!(output.contains("\"finish_reason\":\"tool_calls\""), "{output}");
        let arguments = attribute("execute_tool task", attr::TOOL_CALL_ARGUMENTS);
        assert!(
            arguments.contains("look") && !arguments.contains("hunter2"),
            "{arguments}"
        );
        assert_eq!(attribute("execute_tool task", attr::TOOL_CALL_RESULT), "the output");
    }

    fn end(status: RunStatus) -> EventKind {
        EventKind::LifecycleEnd {
            status,
            content: Some("the answer".into()),
            metrics: RunMetrics {
                input_tokens: 30,
                output_tokens: 7,
                ..RunMetrics::default()
            },
        }
    }

    #[test]
    fn a_run_with_tools_and_a_sub_agent_makes_one_tree_in_one_trace() {
        let mut spans = Vec::new();
        let mut assembler = SpanAssembler::default();
        let child = loom_core::delegate::child_run_id("root", "c3");
        let mut see = |event: Event| spans.extend(assembler.observe("s1", &event));
        see(event("root", None, 1, 0, start("openai:gpt-4o")));
        see(event(
            "root",
            None,
            2,
            10,
            EventKind::LlmStart {
                model: "openai:gpt-4o".into(),
                message_count: 2,
                tools_offered: true,
                final_answer: None,
            },
        ));
        see(event("root", None, 3, 40, EventKind::LlmDelta { text: "x".into() }));
        see(event(
            "root",
            None,
            4,
            90,
            EventKind::LlmFinish {
                content: String::new(),
                usage: Some(Usage {
                    input_tokens: 30,
                    output_tokens: 7,
                    ..Usage::default()
                }),
                finish_reason: Some("tool_calls".into()),
                cost_usd: None,
                tool_call_count: 3,
                response_model: None,
            },
        ));
        see(event(
            "root",
            None,
            5,
            100,
            EventKind::ToolCallsStart {
                calls: vec![call("c1", "bash"), call("c2", "github__search"), call("c3", "task")],
            },
        ));
        see(event("root", None, 6, 150, result("c1", "bash", ToolStatus::Success)));
        see(event(
            "root",
            None,
            7,
            160,
            result("c2", "github__search", ToolStatus::Error),
        ));
        see(event(&child, Some("root"), 1, 170, start("openai:gpt-4o")));
        see(event(&child, Some("root"), 2, 300, end(RunStatus::Done)));
        see(event("root", None, 8, 310, result("c3", "task", ToolStatus::Success)));
        see(event("root", None, 9, 400, end(RunStatus::Done)));

        let named = |name: &str| {
            spans
                .iter()
                .find(|span| span.name == name)
                .unwrap_or_else(|| panic!("{name}: {spans:?}"))
        };
        let agent = |id: &str| {
            spans
                .iter()
                .find(|span| span.attributes.contains(&(attr::AGENT_ID, Value::Text(id.into()))))
                .unwrap()
        };
        let root = agent("root");
        assert_eq!(root.parent, None);
        assert!(spans.iter().all(|span| span.trace_id == trace_id_of("root")));
        let chat = named("chat gpt-4o");
        assert_eq!(chat.parent, Some(root.span_id));
        assert!(chat
            .attributes
            .contains(&(attr::RESPONSE_TIME_TO_FIRST_CHUNK, Value::Float(0.03))));
        assert!(chat.attributes.contains(&(attr::USAGE_INPUT_TOKENS, Value::Int(30))));
        assert!(chat
            .attributes
            .contains(&(attr::PROVIDER_NAME, Value::Text("openai".into()))));
        let failed = named("execute_tool github__search");
        assert_eq!(failed.error.as_deref(), Some("error"));
        assert!(failed
            .attributes
            .contains(&(attr::TOOL_TYPE, Value::Text("extension".into()))));
        let task = named("execute_tool task");
        let sub = agent(&child);
        assert_eq!(
            sub.parent,
            Some(task.span_id),
            "the sub-agent hangs beneath its task call"
        );
        assert!(
            spans
                .iter()
                .all(|span| !format!("{:?}", span.attributes).contains("secret prompt")
                    && !format!("{:?}", span.attributes).contains("the output")),
            "no content"
        );
        assert_eq!(spans.len(), 6);
    }

    #[test]
    fn a_resumed_run_makes_the_same_ids_in_another_process() {
        let mut first = SpanAssembler::default();
        first.observe("s", &event("r", None, 1, 0, start("openai:m")));
        // The process dies; another resumes the run and ends it.
        let mut second = SpanAssembler::default();
        second.observe("s", &event("r", None, 5, 500, start("openai:m")));
        let ended = second.observe("s", &event("r", None, 6, 900, end(RunStatus::Done)));
        assert_eq!(ended[0].span_id, run_span_id("r"));
        assert_eq!(ended[0].trace_id, trace_id_of("r"));
    }

    #[test]
    fn what_never_ends_here_is_forgotten_a_day_later() {
        let mut assembler = SpanAssembler::default();
        assembler.observe("s", &event("gone", None, 1, 0, start("openai:m")));
        assembler.observe(
            "s",
            &event(
                "gone",
                None,
                2,
                10,
                EventKind::ToolCallsStart {
                    calls: vec![call("c", "task")],
                },
            ),
        );
        assert_eq!(assembler.open(), 1, "the run, with its call");
        assembler.forget_before(parse_ts("2026-11-28T10:00:00.000Z").unwrap());
        assert_eq!(assembler.open(), 0);
    }

    #[test]
    fn cached_prompt_tokens_count_as_input_tokens_as_the_conventions_ask() {
        let usage = Usage {
            input_tokens: 25,
            output_tokens: 8,
            cache_read_input_tokens: 5,
            cache_creation_input_tokens: 10,
        };
        assert_eq!(input_tokens("anthropic", &usage), 40, "Anthropic tells them apart");
        assert_eq!(input_tokens("openai", &usage), 25, "OpenAI counts them in already");
    }

    #[test]
    fn event_times_parse() {
        let at = parse_ts("1970-01-02T00:00:01.250Z").unwrap();
        assert_eq!(
            at.duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_millis(86_401_250)
        );
        let at = parse_ts("2026-11-27T04:55:54.550Z").unwrap();
        assert_eq!(at.duration_since(UNIX_EPOCH).unwrap().as_millis(), 1_795_755_354_550);
        assert_eq!(parse_ts("yesterday"), None);
    }
}
