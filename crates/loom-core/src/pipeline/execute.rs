//! Stage 5 for one call: run the tool under its timeout and the run's cancel
//! token, catching panics; then turn the outcome into a result.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value;

use crate::message::ToolCall;
use crate::tool::{OutputSink, RegisteredTool, ToolContext, ToolError, ToolOutput};
use crate::tool_result::{ErrorKind, ToolResult, ToolStatus};

use super::stages::error;
use super::stream_output::StreamedOutput;
use super::{BatchEnv, Redactor};

enum Failure {
    Tool(ToolError),
    Panic(String),
    Cancelled,
    TimedOut(Duration),
}

/// Runs one call and returns its (unformatted) result.
pub(crate) async fn execute(
    call: &ToolCall,
    registered: &RegisteredTool,
    args: Value,
    timeout: Option<Duration>,
    redactor: &Redactor,
    env: &BatchEnv<'_>,
) -> ToolResult {
    let cancel = env.ctx.cancel_token();
    if cancel.is_cancelled() {
        return super::ToolPipeline::cancelled(call);
    }
    // A child token: cancelling the call never cancels the run, and
    // cancelling the run always reaches the call.
    let token = cancel.child_token();
    let (sink, mut output) = OutputSink::channel();
    let ctx = ToolContext {
        call_id: call.id.clone(),
        run_id: env.ctx.run_id_arc(),
        workspace: env.workspace.clone(),
        cancel: token.clone(),
        protected: env.protected.clone(),
        read_only: env.read_only.clone(),
        sub_agents: env.sub_agents.clone(),
        output: Some(sink),
    };
    // Streamed output becomes events while the call runs, and all of it
    // before the call's result (the sink is dropped with the call).
    let mut streamed = StreamedOutput::new(&call.id, redactor, env.events, env.turn);
    let call_future = registered.tool.call_json(args, ctx);
    let running = AssertUnwindSafe(async {
        tokio::pin!(call_future);
        let outcome = loop {
            tokio::select! {
                biased;
                Some((stream, text)) = output.recv() => streamed.push(stream, text),
                outcome = &mut call_future => break outcome,
            }
        };
        output.close();
        while let Some((stream, text)) = output.try_recv() {
            streamed.push(stream, text);
        }
        streamed.finish();
        outcome
    })
    .catch_unwind();
    tokio::pin!(running);
    let deadline = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        biased;
        outcome = &mut running => match outcome {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(ToolError::Cancelled)) => Err(Failure::Cancelled),
            Ok(Err(err)) => Err(Failure::Tool(err)),
            Err(panic) => Err(Failure::Panic(panic_message(panic.as_ref()))),
        },
        _ = cancel.cancelled() => {
            token.cancel();
            // Give the tool a moment to see its token and clean up; then drop it.
            let _ = tokio::time::timeout(env.ctx.limits().cancel_grace, &mut running).await;
            Err(Failure::Cancelled)
        }
        _ = deadline => {
            // The call's own limit: stop it now and drop its future.
            token.cancel();
            Err(Failure::TimedOut(timeout.unwrap_or_default()))
        }
    };
    into_result(call, outcome)
}

fn into_result(call: &ToolCall, executed: Result<ToolOutput, Failure>) -> ToolResult {
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
        .with_error_kind(ErrorKind::EmptyOutput),
        Ok(output) => ToolResult::new(&call.id, &call.name, ToolStatus::Success, output.content),
        Err(Failure::Tool(ToolError::InvalidArguments(message))) => error(
            call,
            ErrorKind::InvalidArguments,
            format!("Error: invalid arguments for '{}': {message}", call.name),
        ),
        Err(Failure::Tool(err)) => error(call, ErrorKind::ToolError, format!("Error: {err}")),
        Err(Failure::Panic(message)) => error(
            call,
            ErrorKind::Panic,
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
        .with_error_kind(ErrorKind::Cancelled),
        Err(Failure::TimedOut(limit)) => ToolResult::new(
            &call.id,
            &call.name,
            ToolStatus::Timeout,
            format!(
                "Tool '{}' did not finish within {:.1} s and was stopped. Try a smaller piece of work or different arguments.",
                call.name,
                limit.as_secs_f64()
            ),
        )
        .with_error_kind(ErrorKind::Timeout),
    }
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
