//! Tools: the typed `Tool` trait a developer implements, the object-safe
//! `DynTool` the engine runs, and the `ToolRegistry` that holds them.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::llm::ToolSpec;

/// What a tool gets besides its arguments.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call being executed.
    pub call_id: String,
    /// The run it belongs to.
    pub run_id: Arc<str>,
    /// The directory tools are confined to.
    pub workspace: Arc<Path>,
    /// Cancelled when the run is cancelled or the call times out. A tool
    /// doing long work should watch it and return early.
    pub cancel: CancellationToken,
    /// Loom's own state — the run database wherever it lives, the web
    /// page's session key, the user's trust records — as canonical paths:
    /// tools must neither read nor change anything at or under them.
    pub protected: Arc<[std::path::PathBuf]>,
    /// Files tools may read but never change — the configuration Loom
    /// reads (loom.toml, a workspace's `.loom/` project files) — as
    /// canonical paths, each covering what is under it.
    pub read_only: Arc<[std::path::PathBuf]>,
    /// Starts sub-agents of the calling run (the `task` tool); `None`
    /// outside a run, or where the nesting limit allows no more.
    pub sub_agents: Option<Arc<dyn crate::delegate::SubAgents>>,
    /// Where a tool streams output while it runs (`tool.output` events);
    /// `None` outside a run.
    pub output: Option<OutputSink>,
}

impl ToolContext {
    /// A context with nothing protected (see [`ToolContext::protected`]).
    pub fn new(call_id: impl Into<String>, run_id: Arc<str>, workspace: Arc<Path>, cancel: CancellationToken) -> Self {
        Self {
            call_id: call_id.into(),
            run_id,
            workspace,
            cancel,
            protected: Arc::from(Vec::new()),
            read_only: Arc::from(Vec::new()),
            sub_agents: None,
            output: None,
        }
    }

    /// Streams `text` from `stream` as a `tool.output` event, when the call
    /// runs inside a run.
    pub fn stream_output(&self, stream: OutputStream, text: impl Into<String>) {
        if let Some(sink) = &self.output {
            sink.send(stream, text.into());
        }
    }

    /// Whether `path` (canonical) is Loom's own state.
    pub fn is_protected(&self, path: &Path) -> bool {
        is_protected(&self.protected, path)
    }

    /// Whether `path` (canonical) may be read but not changed.
    pub fn is_read_only(&self, path: &Path) -> bool {
        is_protected(&self.read_only, path)
    }
}

/// Whether `path` (canonical) is, or is under, one of `protected`.
pub fn is_protected(protected: &[std::path::PathBuf], path: &Path) -> bool {
    protected.iter().any(|protected| path.starts_with(protected))
}

crate::wire::wire_enum! {
    /// Which of a process's output streams a `tool.output` event carries.
    pub enum OutputStream {
        /// Standard output.
        Stdout = "stdout",
        /// Standard error.
        Stderr = "stderr",
    }
}

/// Output a call streams while it runs; the pipeline turns each piece into
/// a `tool.output` event (redacted) before the call's `tool.result`.
///
/// Streaming is for the person watching, so it is capped: after
/// [`OutputSink::MAX_BYTES`] of one call a single notice says the rest is
/// not streamed (the tool's result is unaffected).
///
/// Every call gets one and most never send: a queue that allocates nothing
/// until the first piece, rather than a channel (whose first block of slots
/// and padded state cost each call a large allocation).
#[derive(Debug, Clone)]
pub struct OutputSink {
    shared: Arc<OutputShared>,
}

/// What the call's sink and the pipeline's receiver share.
#[derive(Debug, Default)]
struct OutputShared {
    pieces: std::sync::Mutex<OutputPieces>,
    /// Woken on each piece and on close (a permit is kept for a receiver
    /// not yet waiting, so no piece is missed).
    ready: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct OutputPieces {
    queue: std::collections::VecDeque<(OutputStream, String)>,
    /// Bytes offered so far, streamed or not.
    sent: usize,
    closed: bool,
}

impl OutputShared {
    fn pieces(&self) -> std::sync::MutexGuard<'_, OutputPieces> {
        // A panic while holding the lock cannot leave the queue half-changed.
        self.pieces.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl OutputSink {
    /// Bytes of one call streamed at most.
    pub const MAX_BYTES: usize = 1 << 20;

    /// A sink and the receiver the pipeline drains.
    pub fn channel() -> (Self, OutputReceiver) {
        let shared = Arc::new(OutputShared::default());
        (
            Self {
                shared: Arc::clone(&shared),
            },
            OutputReceiver { shared },
        )
    }

    /// Streams one piece of output (dropped once the cap is reached or the
    /// receiver has closed).
    pub fn send(&self, stream: OutputStream, text: String) {
        if text.is_empty() {
            return;
        }
        {
            let mut pieces = self.shared.pieces();
            let before = pieces.sent;
            pieces.sent = before.saturating_add(text.len());
            if before >= Self::MAX_BYTES || pieces.closed {
                return;
            }
            let past_the_cap = pieces.sent >= Self::MAX_BYTES;
            pieces.queue.push_back((stream, text));
            if past_the_cap {
                let notice = format!(
                    "\n[loom: output past {} KiB is not streamed; the result keeps its head and tail]\n",
                    Self::MAX_BYTES / 1024
                );
                pieces.queue.push_back((stream, notice));
            }
        }
        self.shared.ready.notify_one();
    }
}

/// The pipeline's end of an [`OutputSink`].
#[derive(Debug)]
pub struct OutputReceiver {
    shared: Arc<OutputShared>,
}

impl OutputReceiver {
    /// The next piece, waiting for one; `None` once closed and drained.
    /// Unlike a channel's, it does not end when the sinks are dropped: the
    /// call's own end is what the pipeline waits for beside it.
    pub async fn recv(&mut self) -> Option<(OutputStream, String)> {
        loop {
            {
                let mut pieces = self.shared.pieces();
                if let Some(piece) = pieces.queue.pop_front() {
                    return Some(piece);
                }
                if pieces.closed {
                    return None;
                }
            }
            self.shared.ready.notified().await;
        }
    }

    /// The next piece if one is there.
    pub fn try_recv(&mut self) -> Option<(OutputStream, String)> {
        self.shared.pieces().queue.pop_front()
    }

    /// Refuses further pieces; those already sent can still be taken.
    pub fn close(&mut self) {
        self.shared.pieces().closed = true;
        self.shared.ready.notify_one();
    }
}

impl Drop for OutputReceiver {
    /// Nobody reads any more (the call timed out or was cancelled): a tool
    /// that kept a sink sends into nothing rather than into a queue.
    fn drop(&mut self) {
        let mut pieces = self.shared.pieces();
        pieces.closed = true;
        pieces.queue.clear();
    }
}

/// A tool's successful output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOutput {
    /// The text the model reads.
    pub content: String,
}

impl From<String> for ToolOutput {
    fn from(content: String) -> Self {
        Self { content }
    }
}

impl From<&str> for ToolOutput {
    fn from(content: &str) -> Self {
        Self {
            content: content.to_string(),
        }
    }
}

/// Why a tool call failed. The message is shown to the model, so it should
/// say what to do differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The arguments parsed but make no sense (e.g. a path outside the workspace).
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool tried and failed.
    #[error("{0}")]
    Failed(String),
    /// The tool stopped because its token was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// A tool written as a plain Rust type, with its arguments as a struct whose
/// JSON Schema is derived by `schemars`.
///
/// ```
/// use loom_core::tool::{Tool, ToolContext, ToolError, ToolOutput};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArgs { a: i64, b: i64 }
///
/// struct Add;
///
/// impl Tool for Add {
///     type Args = AddArgs;
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> &str { "Adds two integers." }
///     fn concurrency_safe(&self) -> bool { true }
///     fn read_only(&self) -> bool { true }
///     async fn call(&self, args: AddArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
///         Ok((args.a + args.b).to_string().into())
///     }
/// }
/// ```
pub trait Tool: Send + Sync + 'static {
    /// The arguments; their schema is what the model sees.
    type Args: DeserializeOwned + JsonSchema + Send;

    /// The name the model calls the tool by.
    fn name(&self) -> &str;

    /// What the tool does, for the model.
    fn description(&self) -> &str;

    /// Whether calls may run in parallel with other concurrency-safe calls.
    /// Scheduling only: a concurrency-safe tool may still write (to its own
    /// file, say); say so with [`Tool::read_only`].
    fn concurrency_safe(&self) -> bool {
        false
    }

    /// Whether a call has no side effects, so running it twice is harmless.
    /// Calls of a tool that is not read-only are journaled before they run,
    /// and a resumed run never repeats one that may have taken effect (see
    /// docs/architecture.md). Default false: when in doubt, journal.
    fn read_only(&self) -> bool {
        false
    }

    /// Whether a call that a crash cut short (journaled, no result) may be
    /// made again with the same call id after a resume, because the tool
    /// then continues the work it began instead of repeating it (the `task`
    /// tool resumes its sub-agent). Default false: such a call gets an
    /// "interrupted, effect unknown" result.
    fn resumable(&self) -> bool {
        false
    }

    /// Whether the tool bounds its own time (a sub-agent runs under its own
    /// time limit, never more than its parent has left): the default
    /// per-call timeout does not apply to it; a timeout set for the tool by
    /// name still does. Default false.
    fn bounds_own_time(&self) -> bool {
        false
    }

    /// Whether the tool can be used now; `Err` says why not.
    fn check_available(&self) -> Result<(), String> {
        Ok(())
    }

    /// Runs the tool.
    fn call(&self, args: Self::Args, ctx: ToolContext) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;
}

/// The object-safe form of a tool that the engine runs. Every `Tool` is a
/// `DynTool`; implement it directly for tools whose schema is only known at
/// run time (e.g. MCP tools).
pub trait DynTool: Send + Sync + 'static {
    /// The name the model calls the tool by.
    fn name(&self) -> &str;
    /// What the tool does, for the model.
    fn description(&self) -> &str;
    /// JSON Schema of the arguments.
    fn parameters_schema(&self) -> Value;
    /// See [`Tool::concurrency_safe`].
    fn concurrency_safe(&self) -> bool;
    /// See [`Tool::read_only`].
    fn read_only(&self) -> bool;
    /// See [`Tool::check_available`].
    fn check_available(&self) -> Result<(), String>;
    /// See [`Tool::resumable`].
    fn resumable(&self) -> bool {
        false
    }
    /// See [`Tool::bounds_own_time`].
    fn bounds_own_time(&self) -> bool {
        false
    }
    /// Runs the tool with arguments already validated against the schema.
    fn call_json(&self, args: Value, ctx: ToolContext) -> BoxFuture<'_, Result<ToolOutput, ToolError>>;
}

impl<T: Tool> DynTool for T {
    fn name(&self) -> &str {
        Tool::name(self)
    }

    fn description(&self) -> &str {
        Tool::description(self)
    }

    fn parameters_schema(&self) -> Value {
        let mut schema = schemars::schema_for!(T::Args).to_value();
        if let Some(object) = schema.as_object_mut() {
            // Providers do not need the meta-schema URI or the Rust type name.
            object.remove("$schema");
            object.remove("title");
        }
        schema
    }

    fn concurrency_safe(&self) -> bool {
        Tool::concurrency_safe(self)
    }

    fn read_only(&self) -> bool {
        Tool::read_only(self)
    }

    fn resumable(&self) -> bool {
        Tool::resumable(self)
    }

    fn bounds_own_time(&self) -> bool {
        Tool::bounds_own_time(self)
    }

    fn check_available(&self) -> Result<(), String> {
        Tool::check_available(self)
    }

    fn call_json(&self, args: Value, ctx: ToolContext) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let args: T::Args =
                serde_json::from_value(args).map_err(|err| ToolError::InvalidArguments(err.to_string()))?;
            self.call(args, ctx).await
        })
    }
}

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools share a name.
    #[error("a tool named '{0}' is already registered")]
    Duplicate(String),
    /// The name is not what providers accept.
    #[error("tool name '{0}' is invalid: use 1-64 letters, digits, '_' or '-'")]
    InvalidName(String),
    /// The argument schema is not a valid JSON Schema.
    #[error("tool '{name}' has an invalid argument schema: {message}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What the validator said.
        message: String,
    },
}

/// A registered tool with its compiled argument validator.
pub struct RegisteredTool {
    /// The tool.
    pub tool: Arc<dyn DynTool>,
    /// How it is offered to the model.
    pub spec: ToolSpec,
    /// The compiled JSON Schema of its arguments.
    pub validator: jsonschema::Validator,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool").field("spec", &self.spec).finish()
    }
}

/// The tools of an agent, by name, in registration order.
#[derive(Debug, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<RegisteredTool>>,
    by_name: HashMap<String, usize>,
    specs: Vec<ToolSpec>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool; its schema is compiled once here.
    pub fn register(&mut self, tool: Arc<dyn DynTool>) -> Result<(), RegistryError> {
        let name = tool.name().to_string();
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(RegistryError::InvalidName(name));
        }
        if self.by_name.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        let parameters = tool.parameters_schema();
        let validator = jsonschema::validator_for(&parameters).map_err(|err| RegistryError::InvalidSchema {
            name: name.clone(),
            message: err.to_string(),
        })?;
        // The model is offered the schema without `null` types (chat
        // templates choke on them); the validator keeps the schema as
        // written, so an explicit `null` for an optional parameter passes.
        let spec = ToolSpec {
            name: name.clone(),
            description: tool.description().to_string(),
            parameters: crate::tool_schema::offered(&parameters),
        };
        self.by_name.insert(name, self.tools.len());
        self.specs.push(spec.clone());
        self.tools.push(Arc::new(RegisteredTool { tool, spec, validator }));
        Ok(())
    }

    /// The tools `keep` accepts, in the same order (nothing is compiled again).
    pub fn subset(&self, mut keep: impl FnMut(&RegisteredTool) -> bool) -> ToolRegistry {
        let mut subset = ToolRegistry::new();
        for registered in self.tools.iter().filter(|registered| keep(registered)) {
            subset.by_name.insert(registered.spec.name.clone(), subset.tools.len());
            subset.specs.push(registered.spec.clone());
            subset.tools.push(registered.clone());
        }
        subset
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.by_name.get(name).map(|&index| &*self.tools[index])
    }

    /// Every tool as offered to the model.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// Tool names in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.spec.name.as_str())
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn output_arrives_in_order_and_stops_at_the_cap_and_at_close() {
        let (sink, mut output) = OutputSink::channel();
        let waiting = tokio::spawn(async move {
            let first = output.recv().await;
            (first, output)
        });
        tokio::task::yield_now().await;
        sink.send(OutputStream::Stdout, "one\n".into());
        sink.send(OutputStream::Stderr, String::new());
        sink.send(OutputStream::Stderr, "two\n".into());
        let (first, mut output) = waiting.await.expect("the receiver");
        assert_eq!(first, Some((OutputStream::Stdout, "one\n".to_string())));
        assert_eq!(output.recv().await, Some((OutputStream::Stderr, "two\n".to_string())));
        assert_eq!(output.try_recv(), None);
        // Past the cap: the piece that crosses it, one notice, then nothing.
        sink.send(OutputStream::Stdout, "x".repeat(OutputSink::MAX_BYTES));
        sink.send(OutputStream::Stdout, "dropped".into());
        let crossing = output.recv().await.expect("the crossing piece");
        assert_eq!(crossing.1.len(), OutputSink::MAX_BYTES);
        let notice = output.recv().await.expect("the notice");
        assert!(notice.1.contains("not streamed"), "{notice:?}");
        output.close();
        assert_eq!(output.recv().await, None);
        let (sink, mut output) = OutputSink::channel();
        sink.clone().send(OutputStream::Stdout, "kept".into());
        output.close();
        sink.send(OutputStream::Stdout, "after close".into());
        assert_eq!(output.recv().await, Some((OutputStream::Stdout, "kept".to_string())));
        assert_eq!(output.recv().await, None);
    }

    /// A tool whose arguments are derived, as the built-in tools' are.
    struct Reads;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)] // only the schema is used
    struct ReadArgs {
        path: String,
        limit: Option<u32>,
        globs: Option<Vec<String>>,
    }

    impl DynTool for Reads {
        fn name(&self) -> &str {
            "reads"
        }
        fn description(&self) -> &str {
            "Reads."
        }
        fn parameters_schema(&self) -> Value {
            schemars::schema_for!(ReadArgs).to_value()
        }
        fn concurrency_safe(&self) -> bool {
            true
        }
        fn read_only(&self) -> bool {
            true
        }
        fn check_available(&self) -> Result<(), String> {
            Ok(())
        }
        fn call_json(&self, _args: Value, _ctx: ToolContext) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
            Box::pin(async { Ok(ToolOutput::from("")) })
        }
    }

    #[test]
    fn a_registered_tool_is_offered_without_null_and_still_accepts_one() {
        let mut registry = ToolRegistry::new();
        registry.register(std::sync::Arc::new(Reads)).unwrap();
        let offered = registry.specs()[0].parameters.to_string();
        assert!(!offered.contains("null"), "{offered}");
        assert!(offered.contains(r#""limit":{"#), "{offered}");
        let validator = &registry.get("reads").unwrap().validator;
        assert!(validator.is_valid(&json!({"path": "a", "limit": null, "globs": null})));
        assert!(validator.is_valid(&json!({"path": "a", "limit": 3, "globs": ["*.rs"]})));
        assert!(!validator.is_valid(&json!({"path": "a", "limit": "three"})));
        assert!(!validator.is_valid(&json!({"limit": 3})), "path stays required");
    }
}
