//! The lifecycle hooks the driver asks (docs/extending.md): at a run's
//! start (`session_start`, `user_prompt_submit`) and before it ends with an
//! answer (`stop`, `sub_agent_stop`). Tool calls' hooks are the pipeline's.

use crate::codes::ErrorCode;
use crate::event::TurnIds;
use crate::hooks::{HookEvent, HookInput, HookRun, HookScope, HookVerdict};
use crate::machine::TurnMachine;
use crate::outcome::StopReason;

use super::Driver;

impl Driver {
    /// Runs the hooks of `event`, if any are configured for it, and
    /// reports them; `None` when none ran.
    async fn ask_hooks(&self, turn: &TurnIds, input: HookInput) -> Option<HookRun> {
        let hooks = self
            .engine
            .lifecycle_hooks
            .as_ref()
            .filter(|hooks| hooks.wants(input.event, None))?;
        let scope = HookScope {
            cancel: self.ctx.cancel_token(),
            protected: &self.engine.protected,
            read_only: &self.engine.read_only,
        };
        let run = hooks.run(&input, scope).await;
        crate::hooks::report(&self.events, turn, input.event, None, &run.reports);
        Some(run)
    }

    fn hook_input(&self, event: HookEvent) -> HookInput {
        HookInput::new(
            event,
            self.ctx.run_id(),
            self.ctx.session_id(),
            &self.workspace,
            self.ctx.depth(),
        )
    }

    /// `session_start` (a new session) and `user_prompt_submit`, for a
    /// top-level run's prompt: the context they add (to follow the prompt),
    /// or why the prompt is blocked.
    pub(super) async fn prompt_hooks(
        &self,
        turn: &TurnIds,
        prompt: &str,
        new_session: bool,
    ) -> Result<Vec<String>, StopReason> {
        let mut context = Vec::new();
        if self.parent.is_some() {
            return Ok(context);
        }
        if new_session {
            let mut input = self.hook_input(HookEvent::SessionStart);
            input.prompt = Some(prompt.to_string());
            // A session's start cannot be refused: only its context counts.
            if let Some(run) = self.ask_hooks(turn, input).await {
                context.extend(run.answer.context);
            }
        }
        let mut input = self.hook_input(HookEvent::UserPromptSubmit);
        input.prompt = Some(prompt.to_string());
        let asked = self.ask_hooks(turn, input).await;
        // Stopped while they ran (a cancel, an interrupt): the prompt was
        // not judged, so it goes no further.
        if let Some(reason) = self.stop_reason() {
            return Err(reason);
        }
        if let Some(run) = asked {
            if run.answer.verdict == Some(HookVerdict::Deny) {
                let why = run.answer.reason.unwrap_or_else(|| "no reason given".to_string());
                return Err(StopReason::error(
                    ErrorCode::PromptBlocked,
                    format!("a user_prompt_submit hook blocked the prompt: {why}"),
                ));
            }
            context.extend(run.answer.context);
        }
        Ok(context)
    }

    /// `stop` (`sub_agent_stop` for a sub-agent) before the run ends with
    /// `answer`: the message that sends it back for another turn, when a
    /// hook refuses the ending and the run may still be sent back.
    pub(super) async fn stop_hooks(&self, machine: &mut TurnMachine, answer: &str) -> Option<String> {
        let turn = &machine.ids().clone();
        let event = if self.parent.is_some() {
            HookEvent::SubAgentStop
        } else {
            HookEvent::Stop
        };
        let mut input = self.hook_input(event);
        input.answer = Some(answer.to_string());
        input.stop_hook_active = Some(machine.stop_refusals() > 0);
        let run = self.ask_hooks(turn, input).await?;
        if run.answer.verdict != Some(HookVerdict::Deny) || machine.stop_refusals() >= self.engine.stop_refusals {
            return None;
        }
        machine.count_stop_refusal();
        let why = run.answer.reason.unwrap_or_else(|| "it gave no reason".to_string());
        Some(format!(
            "Do not finish yet: a {event} hook refused to let the run end with this answer. Its reason: {why}"
        ))
    }
}
