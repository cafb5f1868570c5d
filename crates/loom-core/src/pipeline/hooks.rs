//! The lifecycle hooks of a tool call (docs/extending.md): what they are
//! told about the call, and what `post_tool_use` hooks add to its result.
//! `pre_tool_use` hooks decide in the authorize stage (`authorize.rs`).

use crate::hooks::{HookEvent, HookInput, HookRun, HookScope};
use crate::message::ToolCall;
use crate::tool_result::ToolResult;

use super::{BatchEnv, ToolPipeline};

impl ToolPipeline {
    /// Asks the `post_tool_use` hooks about a call that ran; what they add
    /// follows the result, for the model.
    pub(super) async fn post_tool_use(
        &self,
        call: &ToolCall,
        args: &serde_json::Value,
        result: &mut ToolResult,
        env: &BatchEnv<'_>,
    ) {
        let Some(run) = self
            .tool_event_hooks(HookEvent::PostToolUse, call, args, Some(result), env)
            .await
        else {
            return;
        };
        let added: Vec<String> = [
            run.answer
                .reason
                .map(|reason| format!("A hook objected to this result: {reason}")),
            run.answer.context,
        ]
        .into_iter()
        .flatten()
        .collect();
        if !added.is_empty() {
            result.content = format!("{}\n\n[from a hook]\n{}", result.content, added.join("\n"));
        }
    }

    /// Runs the lifecycle hooks of a tool event about `call` (with `args`,
    /// and after the call its `result`, redacted) and reports them; `None`
    /// when no hook wants this call.
    pub(crate) async fn tool_event_hooks(
        &self,
        event: HookEvent,
        call: &ToolCall,
        args: &serde_json::Value,
        result: Option<&ToolResult>,
        env: &BatchEnv<'_>,
    ) -> Option<HookRun> {
        let hooks = self
            .lifecycle
            .as_ref()
            .filter(|hooks| hooks.wants(event, Some(&call.name)))?;
        let ctx = env.ctx;
        let mut input = HookInput::new(event, ctx.run_id(), ctx.session_id(), env.workspace, ctx.depth());
        input.tool_name = Some(call.name.clone());
        input.tool_call_id = Some(call.id.clone());
        input.tool_input = Some(args.clone());
        if let Some(result) = result {
            input.tool_result = Some(self.redactor.redact(&result.content).into_owned());
            input.tool_status = Some(result.status);
        }
        let scope = HookScope {
            cancel: ctx.cancel_token(),
            protected: env.protected,
            read_only: env.read_only,
        };
        let run = hooks.run(&input, scope).await;
        crate::hooks::report(env.events, env.turn, event, Some(&call.id), &run.reports);
        Some(run)
    }
}
