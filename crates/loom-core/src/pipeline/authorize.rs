//! Stage 3: hooks and the permission policy decide; `ask` waits for a person.

use serde_json::Value;

use crate::hooks::{HookCall, HookDecision};
use crate::message::ToolCall;
use crate::permission::{AskOutcome, AskRequest};
use crate::tool::RegisteredTool;
use crate::tool_result::{ErrorKind, ToolResult, ToolStatus};

use super::stages::validate;
use super::{BatchEnv, ToolPipeline};

/// The arguments to run with, or the result that settles the call.
pub(crate) async fn authorize(
    pipeline: &ToolPipeline,
    call: &ToolCall,
    tool: &RegisteredTool,
    mut args: Value,
    env: &BatchEnv<'_>,
) -> Result<Value, ToolResult> {
    for hook in &pipeline.hooks {
        let view = HookCall {
            call,
            args: &args,
            run_id: env.ctx.run_id(),
            workspace: env.workspace,
        };
        match hook.before_tool(view).await {
            HookDecision::Continue => {}
            HookDecision::Allow => return Ok(args),
            HookDecision::Deny(reason) => return Err(denied(call, reason)),
            HookDecision::Rewrite(rewritten) => {
                args = validate(call, tool, &rewritten).map_err(|rejection| rejection.into_result(call))?;
            }
            HookDecision::Ask { grant_key, reason } => {
                if env.gate.is_granted(&grant_key) {
                    return Ok(args);
                }
                let request = AskRequest {
                    call_id: &call.id,
                    tool: &call.name,
                    args: &args,
                    grant_key,
                    reason,
                };
                return match env.gate.ask(request, env.events, env.turn, env.ctx).await {
                    AskOutcome::Allowed => Ok(args),
                    AskOutcome::Denied(reason) => Err(denied(call, reason)),
                    AskOutcome::Cancelled => Err(ToolPipeline::cancelled(call)),
                };
            }
        }
    }
    Ok(args)
}

fn denied(call: &ToolCall, reason: String) -> ToolResult {
    ToolResult::new(&call.id, &call.name, ToolStatus::Denied, reason).with_error_kind(ErrorKind::Denied)
}
