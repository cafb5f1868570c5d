//! The tool pipeline: discover → validate → execute → format, for one call.
//!
//! Every failure in any stage becomes a `ToolResult` the model reads on its
//! next turn, worded so it can correct itself; a tool never brings the run
//! down. (Authorization and parallel scheduling join in Step 2.)

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::message::ToolCall;
use crate::tool::{RegisteredTool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use crate::tool_result::{StageTimings, ToolResult, ToolStatus};

/// How many schema violations to list in one error result.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// Runs tool calls through the pipeline stages.
#[derive(Debug, Clone)]
pub struct ToolPipeline {
    registry: Arc<ToolRegistry>,
}

/// What a call needs from its run.
#[derive(Debug, Clone)]
pub struct CallEnv<'a> {
    /// The run's id.
    pub run_id: &'a Arc<str>,
    /// The tools' jail.
    pub workspace: &'a Arc<Path>,
    /// Cancelled when the call must stop.
    pub cancel: &'a CancellationToken,
    /// How long a cancelled tool may take to return before it is dropped.
    pub cancel_grace: Duration,
}

impl ToolPipeline {
    /// A pipeline over `registry`.
    pub fn new(registry: Arc<ToolRegistry>) -> Self {
        Self { registry }
    }

    /// The registry the pipeline runs.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// Runs one call through every stage and returns its result, with timings.
    pub async fn run(&self, call: &ToolCall, env: CallEnv<'_>) -> ToolResult {
        let started = Instant::now();
        let mut stages = StageTimings::default();
        let mut result = self.run_stages(call, &env, &mut stages).await;
        result.metadata.stages = stages;
        result.metadata.duration_ms = started.elapsed().as_millis() as u64;
        result
    }

    /// A `cancelled` result for a call that never got to run.
    pub fn cancelled(call: &ToolCall) -> ToolResult {
        ToolResult::new(
            &call.id,
            &call.name,
            ToolStatus::Cancelled,
            "The run was cancelled before this tool call could run.",
        )
        .with_error_kind("cancelled")
    }

    async fn run_stages(
        &self,
        call: &ToolCall,
        env: &CallEnv<'_>,
        stages: &mut StageTimings,
    ) -> ToolResult {
        if env.cancel.is_cancelled() {
            return Self::cancelled(call);
        }

        let t = Instant::now();
        let discovered = self.discover(call);
        stages.discover_us = micros(t);
        let registered = match discovered {
            Ok(registered) => registered,
            Err(rejection) => return rejection.into_result(call),
        };

        let t = Instant::now();
        let validated = validate(call, registered);
        stages.validate_us = micros(t);
        let args = match validated {
            Ok(args) => args,
            Err(rejection) => return rejection.into_result(call),
        };

        let t = Instant::now();
        let executed = execute(call, registered, args, env).await;
        stages.execute_us = micros(t);

        let t = Instant::now();
        let result = format(call, executed);
        stages.format_us = micros(t);
        result
    }

    fn discover(&self, call: &ToolCall) -> Result<&RegisteredTool, Rejection> {
        let Some(registered) = self.registry.get(&call.name) else {
            let available: Vec<&str> = self.registry.names().collect();
            let list = if available.is_empty() {
                "none (answer without tools)".to_string()
            } else {
                available.join(", ")
            };
            return Err(Rejection::new(
                "unknown_tool",
                format!(
                    "Error: there is no tool named '{}'. Available tools: {list}. Call one of them by its exact name.",
                    call.name
                ),
            ));
        };
        if let Err(reason) = registered.tool.check_available() {
            return Err(Rejection::new(
                "unavailable",
                format!(
                    "Error: tool '{}' is not available right now: {reason}. Try another way.",
                    call.name
                ),
            ));
        }
        Ok(registered)
    }
}

fn validate(call: &ToolCall, registered: &RegisteredTool) -> Result<Value, Rejection> {
    let args = match &call.arguments {
        Value::Null => Value::Object(Default::default()),
        // Arguments that arrived as text the model could not make valid JSON.
        Value::String(raw) => serde_json::from_str::<Value>(raw).map_err(|err| {
            Rejection::new(
                "invalid_arguments",
                format!(
                    "Error: the arguments for '{}' are not valid JSON ({err}). Send the arguments as one JSON object matching the tool's schema.",
                    call.name
                ),
            )
        })?,
        other => other.clone(),
    };
    let violations: Vec<String> = registered
        .validator
        .iter_errors(&args)
        .take(MAX_REPORTED_VIOLATIONS)
        .map(|violation| {
            let at = violation.instance_path().to_string();
            if at.is_empty() {
                violation.to_string()
            } else {
                format!("at {at}: {violation}")
            }
        })
        .collect();
    if violations.is_empty() {
        return Ok(args);
    }
    Err(Rejection::new(
        "invalid_arguments",
        format!(
            "Error: invalid arguments for '{}': {}. Expected arguments matching this JSON Schema: {}",
            call.name,
            violations.join("; "),
            registered.spec.parameters
        ),
    ))
}

async fn execute(
    call: &ToolCall,
    registered: &RegisteredTool,
    args: Value,
    env: &CallEnv<'_>,
) -> Result<ToolOutput, Failure> {
    // The tool gets a child token: cancelling it never cancels the run, and
    // cancelling the run always reaches it.
    let token = env.cancel.child_token();
    let ctx = ToolContext {
        call_id: call.id.clone(),
        run_id: env.run_id.clone(),
        workspace: env.workspace.clone(),
        cancel: token.clone(),
    };
    let running = AssertUnwindSafe(registered.tool.call_json(args, ctx)).catch_unwind();
    tokio::pin!(running);
    let outcome = tokio::select! {
        biased;
        outcome = &mut running => outcome,
        _ = env.cancel.cancelled() => {
            token.cancel();
            // Give the tool a moment to see its token and clean up; then drop it.
            let _ = tokio::time::timeout(env.cancel_grace, &mut running).await;
            return Err(Failure::Cancelled);
        }
    };
    match outcome {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(ToolError::Cancelled)) => Err(Failure::Cancelled),
        Ok(Err(err)) => Err(Failure::Tool(err)),
        Err(panic) => Err(Failure::Panic(panic_message(panic.as_ref()))),
    }
}

/// A call refused before it ran (unknown tool, invalid arguments).
struct Rejection {
    kind: &'static str,
    message: String,
}

impl Rejection {
    fn new(kind: &'static str, message: String) -> Self {
        Self { kind, message }
    }

    fn into_result(self, call: &ToolCall) -> ToolResult {
        error(call, self.kind, self.message)
    }
}

enum Failure {
    Tool(ToolError),
    Panic(String),
    Cancelled,
}

fn format(call: &ToolCall, executed: Result<ToolOutput, Failure>) -> ToolResult {
    match executed {
        Ok(output) if output.content.trim().is_empty() => ToolResult::new(
            &call.id,
            &call.name,
            ToolStatus::Warning,
            format!(
                "Tool '{}' finished without output. If you expected output, check the arguments; otherwise continue.",
                call.name
            ),
        )
        .with_error_kind("empty_output"),
        Ok(output) => ToolResult::new(&call.id, &call.name, ToolStatus::Success, output.content),
        Err(Failure::Tool(ToolError::InvalidArguments(message))) => error(
            call,
            "invalid_arguments",
            format!("Error: invalid arguments for '{}': {message}", call.name),
        ),
        Err(Failure::Tool(err)) => error(call, "tool_error", format!("Error: {err}")),
        Err(Failure::Panic(message)) => error(
            call,
            "panic",
            format!(
                "Error: tool '{}' crashed ({message}). This is a fault in the tool, not in your call; try another approach.",
                call.name
            ),
        ),
        Err(Failure::Cancelled) => ToolResult::new(
            &call.id,
            &call.name,
            ToolStatus::Cancelled,
            "The tool call was cancelled before it finished.",
        )
        .with_error_kind("cancelled"),
    }
}

fn error(call: &ToolCall, kind: &str, content: String) -> ToolResult {
    ToolResult::new(&call.id, &call.name, ToolStatus::Error, content).with_error_kind(kind)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        format!("panic: {text}")
    } else if let Some(text) = panic.downcast_ref::<String>() {
        format!("panic: {text}")
    } else {
        "panic".to_string()
    }
}

fn micros(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}
