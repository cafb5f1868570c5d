//! The driver: calls `tt` until a base case, appending each turn's messages,
//! and closes the run with its final events. Depth uses no stack.

use crate::event::{EventKind, TurnIds};
use crate::handle::RunOutcome;
use crate::memory::{Memory, Unsaved};
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::status::RunStatus;
use crate::store::{Checkpoint, RunRecord, RunSnapshot};
use crate::turn_state::TurnState;

use super::turn::{StopReason, TimeoutKind, TurnOutcome};
use super::Run;

enum End {
    Answer(String),
    Stopped(StopReason),
}

impl Run {
    /// Runs `prompt` to its end and returns the outcome. `lifecycle.end` is
    /// always the last event, whatever ends the run. `history` is the
    /// conversation so far (a continued session), placed between the system
    /// prompt and the request.
    pub(crate) async fn drive(mut self, prompt: String, history: Option<Vec<Message>>) -> RunOutcome {
        let ctx = self.ctx.clone();
        self.status_tx.send_replace(RunStatus::Running);
        let state = TurnState::initial(ctx.limits().max_steps);
        self.emit_start(&state, &prompt, false);

        let mut memory = Memory::new(self.engine.context.counter.clone());
        let opened = match self.earlier_conversation(history, &ctx).await {
            Ok(history) => self.open_record(&prompt, &ctx).await.map(|()| history),
            Err(reason) => Err(reason),
        };
        let (end, state) = match opened {
            Err(reason) => (End::Stopped(reason), state),
            Ok(history) => {
                self.start_history(&mut memory, &state, history, prompt).await;
                self.turns(&mut memory, state, None).await
            }
        };
        self.close(memory, state, end).await
    }

    /// Continues a stored run whose process died, from its last checkpoint.
    /// The store already shows it `RUNNING` under this process.
    pub(crate) async fn drive_resumed(mut self, snapshot: RunSnapshot) -> RunOutcome {
        let ctx = self.ctx.clone();
        self.status_tx.send_replace(RunStatus::Running);
        let prompt = snapshot.run.prompt.clone();
        let state = snapshot
            .next_turn
            .clone()
            .unwrap_or_else(|| TurnState::initial(ctx.limits().max_steps));
        self.emit_start(&state, &prompt, true);
        self.metrics = snapshot.run.metrics.clone();

        let mut memory = Memory::new(self.engine.context.counter.clone());
        if snapshot.messages.is_empty() {
            // The process died before the first checkpoint: start over.
            let history = match self.earlier_conversation(None, &ctx).await {
                Ok(history) => history,
                Err(reason) => return self.close(memory, state, End::Stopped(reason)).await,
            };
            self.start_history(&mut memory, &state, history, prompt).await;
            let (end, state) = self.turns(&mut memory, state, None).await;
            return self.close(memory, state, end).await;
        }
        self.remember_call_ids(&snapshot.messages);
        memory.extend(snapshot.messages);
        memory.mark_saved();
        let dangling = crate::resume::dangling_calls(memory.messages());
        self.steps = memory
            .messages()
            .iter()
            .filter(|message| !message.tool_calls().is_empty())
            .count()
            .saturating_sub(usize::from(!dangling.is_empty())) as u32;

        let first = if !dangling.is_empty() {
            Some(
                self.resume_tool_turn(&mut memory, &state, &ctx, &snapshot.journal)
                    .await,
            )
        } else {
            match memory.messages().last() {
                // The answer was checkpointed; only the end was not recorded.
                Some(Message::Assistant { content, tool_calls })
                    if tool_calls.is_empty() && !content.trim().is_empty() =>
                {
                    Some(TurnOutcome::Finish {
                        content: content.clone(),
                        new_messages: Vec::new(),
                    })
                }
                _ => None,
            }
        };
        let (end, state) = self.turns(&mut memory, state, first).await;
        self.close(memory, state, end).await
    }

    fn emit_start(&self, state: &TurnState, prompt: &str, resumed: bool) {
        self.events.emit(
            &TurnIds::of(state),
            EventKind::LifecycleStart {
                prompt: prompt.to_string(),
                model: self.engine.llm.model_name().to_string(),
                max_steps: self.ctx.limits().max_steps,
                resumed,
            },
        );
    }

    /// The conversation a run continues: the given history, or — with a
    /// store — the session's earlier runs.
    async fn earlier_conversation(
        &self,
        history: Option<Vec<Message>>,
        ctx: &crate::context::RunContext,
    ) -> Result<Vec<Message>, StopReason> {
        if let Some(history) = history {
            return Ok(history);
        }
        let Some(store) = self.engine.store.as_deref() else {
            return Ok(Vec::new());
        };
        crate::store::session_history(store, ctx.session_id())
            .await
            .map_err(|err| StopReason::Error {
                code: "STORE".to_string(),
                message: format!("cannot load the session's conversation: {err}"),
            })
    }

    async fn start_history(&mut self, memory: &mut Memory, state: &TurnState, history: Vec<Message>, prompt: String) {
        let system = self.system_prompt(&prompt, &TurnIds::of(state), memory).await;
        memory.push(Message::system(system));
        self.remember_call_ids(&history);
        memory.extend(history);
        memory.push(Message::user(prompt));
    }

    /// Trampolines `tt` from `state` until a base case. `first` is the
    /// outcome of a turn already handled (a resumed turn).
    async fn turns(
        &mut self,
        memory: &mut Memory,
        mut state: TurnState,
        mut first: Option<TurnOutcome>,
    ) -> (End, TurnState) {
        let ctx = self.ctx.clone();
        loop {
            let outcome = match first.take() {
                Some(outcome) => outcome,
                None => self.tt(memory, &state, &ctx).await,
            };
            let (next, end) = match outcome {
                TurnOutcome::Recurse { next, new_messages } => {
                    memory.extend(new_messages);
                    (next, None)
                }
                TurnOutcome::Finish { content, new_messages } => {
                    memory.extend(new_messages);
                    (state.clone(), Some(End::Answer(content)))
                }
                // An interrupted turn leaves its calls as a crash would:
                // the resumed run settles them from the journal (a call that
                // never started runs then), so nothing is lost or repeated.
                TurnOutcome::Stop {
                    reason: reason @ StopReason::Interrupted(_),
                    ..
                } => (state.clone(), Some(End::Stopped(reason))),
                TurnOutcome::Stop { reason, new_messages } => {
                    memory.extend(new_messages);
                    (state.clone(), Some(End::Stopped(reason)))
                }
            };
            // Checkpoint before the tail call (DESIGN 2.1, step 5).
            if let Err(reason) = self.checkpoint(memory, &next).await {
                return (End::Stopped(reason), state);
            }
            state = next;
            if let Some(end) = end {
                return (end, state);
            }
        }
    }

    /// Emits the final events, records the end and builds the outcome.
    async fn close(mut self, memory: Memory, state: TurnState, end: End) -> RunOutcome {
        let ctx = self.ctx.clone();
        let turn = TurnIds::of(&state);
        let turns = state.turn_counter() + 1;
        self.metrics.duration_ms = ctx.elapsed().as_millis() as u64;
        if let End::Stopped(StopReason::Interrupted(why)) = end {
            return self.suspend(memory, state, why).await;
        }
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
        // `lifecycle.end` goes out only once the end is recorded, so whoever
        // sees it finds the run ended in the store too.
        let last = self.events.stamp(
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
        self.events.send(last);
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

    /// Leaves an interrupted run resumable: its last events and checkpoint
    /// recorded, its status `INTERRUPTED`, and no `lifecycle.end` (it is not
    /// over: `Agent::resume` continues it from here).
    async fn suspend(mut self, mut memory: Memory, state: TurnState, why: String) -> RunOutcome {
        let ctx = self.ctx.clone();
        let turn = TurnIds::of(&state);
        self.events.emit(
            &turn,
            EventKind::Warning {
                code: "INTERRUPTED".to_string(),
                message: format!("{why}: the run stopped and can be resumed from its last checkpoint"),
            },
        );
        if let Some(store) = self.engine.store.clone() {
            let recorded = match self.checkpoint(&mut memory, &state).await {
                Ok(()) => store
                    .mark_interrupted(ctx.run_id(), &self.engine.owner)
                    .await
                    .map_err(|err| err.to_string()),
                Err(reason) => Err(format!("{reason:?}")),
            };
            if let Err(err) = recorded {
                tracing::error!(run_id = ctx.run_id(), error = %err, "could not record the interrupted run");
            }
        }
        self.status_tx.send_replace(RunStatus::Interrupted);
        RunOutcome {
            run_id: ctx.run_id().to_string(),
            status: RunStatus::Interrupted,
            content: None,
            stop_reason: Some(StopReason::Interrupted(why)),
            turns: state.turn_counter() + 1,
            metrics: self.metrics,
            messages: memory.into_messages(),
        }
    }

    /// Records the run in the store (if any), already `RUNNING`: one write,
    /// so no crash can leave it `QUEUED` behind a process that was running it.
    async fn open_record(&mut self, prompt: &str, ctx: &crate::context::RunContext) -> Result<(), StopReason> {
        let Some(store) = self.engine.store.clone() else {
            return Ok(());
        };
        let record = RunRecord {
            run_id: ctx.run_id().to_string(),
            session_id: ctx.session_id().to_string(),
            prompt: prompt.to_string(),
            model: self.engine.llm.model_name().to_string(),
            status: RunStatus::Running,
            owner: self.engine.owner.clone(),
            started_ms: ctx
                .started_at()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ended_ms: None,
            content: None,
            metrics: RunMetrics::default(),
            workspace: Some(self.workspace.display().to_string()),
        };
        store.create_run(&record).await.map_err(|err| StopReason::Error {
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
            StopReason::Monitor(verdict) => (
                RunStatus::Error,
                "MONITOR_STOPPED",
                format!(
                    "the recursion monitor ended the tool phase after {} of {} steps ({}: {}) and the model gave no final answer",
                    self.steps,
                    self.ctx.limits().max_steps,
                    verdict.termination.reason(),
                    verdict.detail
                ),
            ),
            // Suspended runs do not get here (see `suspend`).
            StopReason::Interrupted(why) => (RunStatus::Interrupted, "INTERRUPTED", why.clone()),
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
