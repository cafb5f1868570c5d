//! The driver: calls `tt` until a base case, appending each turn's messages,
//! and closes the run with its final events. Depth uses no stack.

use crate::event::{EventKind, TurnIds};
use crate::handle::RunOutcome;
use crate::memory::{Memory, Unsaved};
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::status::RunStatus;
use crate::store::{Checkpoint, RunRecord};
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
        let end = match self.open_record(&prompt, &ctx).await {
            Err(reason) => End::Stopped(reason),
            Ok(()) => {
                let system = self.system_prompt(&prompt, &TurnIds::of(&state), &memory).await;
                memory.push(Message::system(system));
                memory.push(Message::user(prompt));
                loop {
                    let outcome = self.tt(&mut memory, &state, &ctx).await;
                    let (next, end) = match outcome {
                        TurnOutcome::Recurse { next, new_messages } => {
                            memory.extend(new_messages);
                            (next, None)
                        }
                        TurnOutcome::Finish { content, new_messages } => {
                            memory.extend(new_messages);
                            (state.clone(), Some(End::Answer(content)))
                        }
                        TurnOutcome::Stop { reason, new_messages } => {
                            memory.extend(new_messages);
                            (state.clone(), Some(End::Stopped(reason)))
                        }
                    };
                    // Checkpoint before the tail call (DESIGN 2.1, step 5).
                    if let Err(reason) = self.checkpoint(&mut memory, &next).await {
                        break End::Stopped(reason);
                    }
                    state = next;
                    if let Some(end) = end {
                        break end;
                    }
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
        if let Some(store) = self.engine.store.clone() {
            let events = self.events.take_log();
            if let Err(err) = store
                .finish_run(ctx.run_id(), status, content.as_deref(), &self.metrics, &events)
                .await
            {
                tracing::error!(run_id = ctx.run_id(), error = %err, "could not record the end of the run");
            }
        }
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

    /// Records the run in the store (if any) and marks it running.
    async fn open_record(&mut self, prompt: &str, ctx: &crate::context::RunContext) -> Result<(), StopReason> {
        let Some(store) = self.engine.store.clone() else {
            return Ok(());
        };
        let record = RunRecord {
            run_id: ctx.run_id().to_string(),
            session_id: ctx.session_id().to_string(),
            prompt: prompt.to_string(),
            model: self.engine.llm.model_name().to_string(),
            status: RunStatus::Queued,
            owner: self.engine.owner.clone(),
            started_ms: ctx
                .started_at()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ended_ms: None,
            content: None,
            metrics: RunMetrics::default(),
        };
        let opened = match store.create_run(&record).await {
            Ok(()) => store.set_status(ctx.run_id(), RunStatus::Running).await,
            Err(err) => Err(err),
        };
        opened.map_err(|err| StopReason::Error {
            code: "STORE".to_string(),
            message: format!("cannot record the run: {err}"),
        })
    }

    /// Writes the turn's messages, events and the next state to the store.
    pub(crate) async fn checkpoint(&mut self, memory: &mut Memory, next: &TurnState) -> Result<(), StopReason> {
        let Some(store) = self.engine.store.clone() else {
            return Ok(());
        };
        let events = self.events.take_log();
        let (new_messages, replaced_history) = match memory.unsaved() {
            Unsaved::Tail(tail) => (tail, None),
            Unsaved::Whole(all) => (&[][..], Some(all)),
        };
        self.metrics.duration_ms = self.ctx.elapsed().as_millis() as u64;
        let written = store
            .checkpoint(&Checkpoint {
                run_id: self.ctx.run_id(),
                next,
                new_messages,
                replaced_history,
                events: &events,
                metrics: &self.metrics,
            })
            .await;
        match written {
            Ok(()) => {
                memory.mark_saved();
                Ok(())
            }
            Err(err) => Err(StopReason::Error {
                code: "STORE".to_string(),
                message: format!("cannot write the checkpoint: {err}"),
            }),
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
