//! The driver: calls `tt` until a base case, appending each turn's messages,
//! and closes the run with its final events. Depth uses no stack.

use crate::event::{EventKind, TurnIds};
use crate::handle::RunOutcome;
use crate::memory::Memory;
use crate::message::Message;
use crate::status::RunStatus;
use crate::turn_state::TurnState;

use super::turn::{StopReason, TimeoutKind, TurnOutcome};
use super::Run;

enum End {
    Answer(String),
    Stopped(StopReason),
}

impl Run {
    /// Runs `prompt` to its end and returns the outcome. `lifecycle.end` is
    /// always the last event, whatever ends the run.
    pub(crate) async fn drive(mut self, prompt: String) -> RunOutcome {
        let ctx = self.ctx.clone();
        self.status_tx.send_replace(RunStatus::Running);
        let mut state = TurnState::initial(ctx.limits().max_steps);
        self.events.emit(
            &TurnIds::of(&state),
            EventKind::LifecycleStart {
                prompt: prompt.clone(),
                model: self.engine.llm.model_name().to_string(),
                max_steps: ctx.limits().max_steps,
            },
        );

        let mut memory = Memory::new(self.engine.context.counter.clone());
        let system = self.system_prompt(&prompt, &TurnIds::of(&state), &memory).await;
        memory.push(Message::system(system));
        memory.push(Message::user(prompt));
        let end = loop {
            match self.tt(&mut memory, &state, &ctx).await {
                TurnOutcome::Recurse { next, new_messages } => {
                    memory.extend(new_messages);
                    state = next;
                }
                TurnOutcome::Finish { content, new_messages } => {
                    memory.extend(new_messages);
                    break End::Answer(content);
                }
                TurnOutcome::Stop { reason, new_messages } => {
                    memory.extend(new_messages);
                    break End::Stopped(reason);
                }
            }
        };

        let turn = TurnIds::of(&state);
        let turns = state.turn_counter() + 1;
        self.metrics.duration_ms = ctx.elapsed().as_millis() as u64;
        let (status, content, stop_reason) = match end {
            End::Answer(content) => {
                self.events.emit(
                    &turn,
                    EventKind::AgentFinish {
                        content: content.clone(),
                        turns,
                        metrics: self.metrics.clone(),
                    },
                );
                (RunStatus::Done, Some(content), None)
            }
            End::Stopped(reason) => {
                let status = self.report_stop(&turn, &reason);
                (status, None, Some(reason))
            }
        };
        self.events.emit(
            &turn,
            EventKind::LifecycleEnd {
                status,
                content: content.clone(),
                metrics: self.metrics.clone(),
            },
        );
        self.status_tx.send_replace(status);
        RunOutcome {
            run_id: ctx.run_id().to_string(),
            status,
            content,
            stop_reason,
            turns,
            metrics: self.metrics,
            messages: memory.into_messages(),
        }
    }

    /// Emits the events that explain a stop and returns the final status.
    fn report_stop(&self, turn: &TurnIds, reason: &StopReason) -> RunStatus {
        let (status, code, message) = match reason {
            StopReason::Cancelled(why) => {
                self.events
                    .emit(turn, EventKind::ExecutionCancelled { reason: why.clone() });
                return RunStatus::Canceled;
            }
            StopReason::Timeout(TimeoutKind::Run) => (
                RunStatus::Timeout,
                "RUN_TIMEOUT",
                "the run took longer than its time limit".to_string(),
            ),
            StopReason::Timeout(TimeoutKind::Step) => (
                RunStatus::Timeout,
                "STEP_TIMEOUT",
                "one step (model call and tools) took longer than its time limit".to_string(),
            ),
            StopReason::MaxStepsWithoutAnswer => (
                RunStatus::Error,
                "MAX_STEPS_NO_ANSWER",
                "the step limit was reached and the model gave no final answer".to_string(),
            ),
            StopReason::Error { code, message } => (RunStatus::Error, code.as_str(), message.clone()),
        };
        self.events.emit(
            turn,
            EventKind::Error {
                code: code.to_string(),
                message,
                recoverable: false,
            },
        );
        status
    }
}
