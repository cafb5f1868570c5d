//! Stage 3: whether a call runs — the one place it is decided.
//!
//! The order (docs/extending.md, "Who decides"):
//!
//! 1. `pre_tool_use` lifecycle hooks (the binary's command hooks), in
//!    order: they may rewrite the arguments (validated again) and decide
//!    allow, deny or ask; the first deny ends the hooks.
//! 2. Library [`ToolHook`](crate::hooks::ToolHook)s, in registration order,
//!    unless a lifecycle hook decided: the same choices.
//! 3. The permission policy on the final arguments. An explicit `deny`
//!    rule refuses the call whatever a hook or the mode said.
//! 4. A hook's decision, if one decided; otherwise the policy's: a rule,
//!    else the mode, else the default.
//! 5. `ask` goes to a person, unless the session already has their
//!    "always" for it.
//!
//! The call's `tool.result` says which of them decided (`decidedBy`).

use serde_json::Value;

use crate::codes::WarningCode;
use crate::event::EventKind;
use crate::hooks::{HookCall, HookDecision, HookEvent, HookVerdict};
use crate::message::ToolCall;
use crate::permission::{Ask, AskOutcome, Decision, SessionGrant, Verdict};
use crate::tool::RegisteredTool;
use crate::tool_result::{Authority, ErrorKind, ToolResult, ToolStatus};

use super::stages::validate;
use super::{BatchEnv, ToolPipeline};

/// What the hooks decided, if any did.
enum HookChoice {
    Allow,
    Deny(String),
    Ask {
        grant: SessionGrant,
        reason: Option<String>,
    },
}

/// The arguments to run with and who let the call run, or the result that
/// settles the call.
pub(crate) async fn authorize(
    pipeline: &ToolPipeline,
    call: &ToolCall,
    tool: &RegisteredTool,
    mut args: Value,
    env: &BatchEnv<'_>,
) -> Result<(Value, Authority), ToolResult> {
    let mut choice = lifecycle_hooks(pipeline, call, tool, &mut args, env).await?;
    if choice.is_none() {
        choice = tool_hooks(pipeline, call, tool, &mut args, env).await?;
    }
    let verdict = pipeline.policy.evaluate(&call.name, &args, env.workspace);
    if verdict.decision == Decision::Deny && verdict.rule.is_some() {
        return Err(denied(call, policy_refusal(call, &verdict), Authority::Rule));
    }
    match choice {
        Some(HookChoice::Allow) => Ok((args, Authority::Hook)),
        Some(HookChoice::Deny(reason)) => Err(denied(call, reason, Authority::Hook)),
        Some(HookChoice::Ask { grant, reason }) => ask(call, args, grant, reason, env).await,
        None => {
            let authority = match (&verdict.rule, verdict.by_mode) {
                (Some(_), _) => Authority::Rule,
                (None, true) => Authority::Mode,
                (None, false) => Authority::Default,
            };
            match verdict.decision {
                Decision::Allow => Ok((args, authority)),
                Decision::Deny => Err(denied(call, policy_refusal(call, &verdict), authority)),
                Decision::Ask => {
                    // "always" grants the rule that asked when it constrains
                    // arguments, otherwise the whole tool.
                    let grant = match (&verdict.rule, verdict.rule_has_arguments) {
                        (Some(rule), true) => SessionGrant::Rule(rule.clone()),
                        _ => SessionGrant::Tool(call.name.clone()),
                    };
                    ask(call, args, grant, verdict.rule, env).await
                }
            }
        }
    }
}

/// Step 1: the `pre_tool_use` lifecycle hooks.
async fn lifecycle_hooks(
    pipeline: &ToolPipeline,
    call: &ToolCall,
    tool: &RegisteredTool,
    args: &mut Value,
    env: &BatchEnv<'_>,
) -> Result<Option<HookChoice>, ToolResult> {
    let Some(run) = pipeline
        .tool_event_hooks(HookEvent::PreToolUse, call, args, None, env)
        .await
    else {
        return Ok(None);
    };
    if let Some(rewritten) = run.answer.arguments {
        match validate(call, tool, &rewritten) {
            Ok(valid) => *args = valid,
            // A hook's mistake, not the model's: the call goes on as the
            // model made it, and the hook is reported as failed.
            Err(rejection) => env.events.emit(
                env.turn,
                EventKind::Warning {
                    code: WarningCode::HookFailed,
                    message: format!(
                        "a pre_tool_use hook rewrote the arguments of '{}' into ones the tool refuses, so they were not used: {}",
                        call.name,
                        rejection.into_result(call).content
                    ),
                },
            ),
        }
    }
    let reason = run.answer.reason;
    Ok(run.answer.verdict.map(|verdict| match verdict {
        HookVerdict::Allow => HookChoice::Allow,
        HookVerdict::Deny => HookChoice::Deny(match reason {
            Some(reason) => format!("A hook refused this call of '{}': {reason}", call.name),
            None => format!("A hook refused this call of '{}'.", call.name),
        }),
        // "always" covers this tool when the hook asks for the same reason.
        HookVerdict::Ask => HookChoice::Ask {
            grant: SessionGrant::Hook {
                tool: call.name.clone(),
                reason: reason.clone(),
            },
            reason,
        },
    }))
}

/// Step 2: the library's `ToolHook`s.
async fn tool_hooks(
    pipeline: &ToolPipeline,
    call: &ToolCall,
    tool: &RegisteredTool,
    args: &mut Value,
    env: &BatchEnv<'_>,
) -> Result<Option<HookChoice>, ToolResult> {
    for hook in &pipeline.hooks {
        let view = HookCall {
            call,
            args,
            run_id: env.ctx.run_id(),
            workspace: env.workspace,
        };
        match hook.before_tool(view).await {
            HookDecision::Continue => {}
            HookDecision::Allow => return Ok(Some(HookChoice::Allow)),
            HookDecision::Deny(reason) => return Ok(Some(HookChoice::Deny(reason))),
            HookDecision::Rewrite(rewritten) => {
                *args = validate(call, tool, &rewritten).map_err(|rejection| rejection.into_result(call))?;
            }
            HookDecision::Ask { grant, reason } => return Ok(Some(HookChoice::Ask { grant, reason })),
        }
    }
    Ok(None)
}

/// Step 5: a person decides, unless the session already said "always".
async fn ask(
    call: &ToolCall,
    args: Value,
    grant: SessionGrant,
    reason: Option<String>,
    env: &BatchEnv<'_>,
) -> Result<(Value, Authority), ToolResult> {
    if env.gate.is_granted(&grant) {
        return Ok((args, Authority::Session));
    }
    let request = Ask {
        call_id: &call.id,
        tool: &call.name,
        args: &args,
        grant,
        reason,
    };
    match env.gate.ask(request, env.events, env.turn, env.ctx).await {
        AskOutcome::Allowed => Ok((args, Authority::Person)),
        AskOutcome::Denied(reason) => Err(denied(call, reason, Authority::Person)),
        AskOutcome::Cancelled => Err(ToolPipeline::cancelled(call)),
    }
}

/// What the model reads when the policy refuses a call.
fn policy_refusal(call: &ToolCall, verdict: &Verdict) -> String {
    match &verdict.rule {
        Some(rule) => format!(
            "Permission denied: the rule '{rule}' forbids this call of '{}'. Do not retry it; find another way or tell the user what you need.",
            call.name
        ),
        None => format!(
            "Permission denied: '{}' is not allowed in this session. Do not retry it; find another way or tell the user what you need.",
            call.name
        ),
    }
}

fn denied(call: &ToolCall, reason: String, by: Authority) -> ToolResult {
    let mut result =
        ToolResult::new(&call.id, &call.name, ToolStatus::Denied, reason).with_error_kind(ErrorKind::Denied);
    result.metadata.decided_by = Some(by);
    result
}
