//! The driver's loop: the machine says what to do, the driver does it and
//! reports back, until the run is over; then the final events and the
//! store's record of the end. New and resumed runs take the same loop.

use std::collections::HashMap;

use crate::budget::WARN_AT;
use crate::context::{Deadline, RunContext, StopCause};
use crate::event::{EventKind, Phase, TurnIds};
use crate::machine::{Ending, Next, RunState, TurnEnd, TurnMachine, TurnPhase};
use crate::memory::{Memory, Unsaved};
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::outcome::{ErrorCode, RunOutcome, StopReason, TimeoutKind, WarningCode};
use crate::status::RunStatus;
use crate::store::{Checkpoint, RunRecord, RunSnapshot};
use crate::tool_result::ToolStatus;
use crate::trace_context::TraceParent;
use crate::turn_state::TurnState;

use super::{named_files, Driver};

/// How a run starts.
pub(crate) enum Start {
    /// A new run of `prompt`, after `history` (a continued session; `None`:
    /// the session's earlier runs in the store, if any).
    New {
        prompt: String,
        history: Option<Vec<Message>>,
        /// Who the run belongs to (a server's token name), as recorded.
        principal: Option<String>,
        /// The run it was forked from, told in `lifecycle.start`.
        forked_from: Option<crate::event::ForkLink>,
        /// The client's trace context (a sub-agent: its root's).
        trace_parent: Option<TraceParent>,
    },
    /// A stored run whose process died, from its last checkpoint. The
    /// store already shows it `RUNNING` under this process.
    Resumed(Box<RunSnapshot>),
}

/// How long a run that ends waits for its sub-agents to stop.
const CHILDREN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The deadlines of the current turn.
#[derive(Default)]
struct Deadlines {
    run: Option<Deadline>,
    step: Option<Deadline>,
}

impl Driver {
    /// Runs to the end and returns the outcome. `lifecycle.end` is always
    /// the last event, whatever ends the run (an interrupted run, which is
    /// not over, has none).
    pub(crate) async fn drive(mut self, start: Start) -> RunOutcome {
        self.controls.show(RunStatus::Running);
        // Held until the run ends: no restore of the workspace meanwhile.
        let _workspace = self.hold_workspace().await;
        let mut machine = match start {
            Start::New {
                prompt,
                history,
                principal,
                forked_from,
                trace_parent,
            } => {
                self.trace_parent = trace_parent;
                self.begin(prompt, history, principal, forked_from).await
            }
            Start::Resumed(snapshot) => self.reenter(*snapshot).await,
        };
        let ending = self.run(&mut machine).await;
        self.close(machine, ending).await
    }

    /// A new run: its record, its history, its first turn.
    async fn begin(
        &mut self,
        prompt: String,
        history: Option<Vec<Message>>,
        principal: Option<String>,
        forked_from: Option<crate::event::ForkLink>,
    ) -> TurnMachine {
        self.principal.clone_from(&principal);
        let max_steps = self.ctx.limits().max_steps;
        let first = match &self.parent {
            Some(parent) => TurnState::initial_child(max_steps, parent.turn_id.clone()),
            None => TurnState::initial(max_steps),
        };
        let mut state = RunState::new(first, prompt.clone());
        // Only where the rule that reads them may send an answer back.
        let settings = &self.engine.machine;
        if settings.feedback && settings.tools_offered {
            state.named_files =
                named_files::find(&self.workspace, &self.engine.protected, &self.engine.read_only, &prompt).await;
        }
        let started_ms = self.emit_start(&state, &prompt, false, forked_from);
        let mut machine = self.machine(state, Vec::new());
        let opened = match self.earlier_conversation(history).await {
            Ok(history) => self.open_record(&prompt, principal, started_ms).await.map(|()| history),
            Err(reason) => Err(reason),
        };
        if opened.is_ok() {
            // The log belongs to the record: its events may be written now.
            self.log.open();
        }
        match opened {
            Ok(history) => self.start_history(&mut machine, history, prompt).await,
            Err(reason) => machine.fail_to_start(reason),
        }
        machine
    }

    /// The last result the run's stored log told for each call. A log that
    /// cannot be read counts as holding none: a result told twice is
    /// better than one never told.
    async fn logged_results(&self) -> HashMap<String, (ToolStatus, String)> {
        let log = match self.store.events(self.ctx.run_id(), 0).await {
            Ok(log) => log,
            Err(err) => {
                tracing::warn!(run_id = %self.ctx.run_id(), error = %err, "cannot read the run's log to resume it");
                return HashMap::new();
            }
        };
        // In log order: a later result of a call replaces an earlier one.
        log.into_iter()
            .filter_map(|event| match event.kind {
                EventKind::ToolResult {
                    call_id,
                    status,
                    content,
                    ..
                } => Some((call_id, (status, content))),
                _ => None,
            })
            .collect()
    }

    /// A stored run, re-entered where its last checkpoint left it.
    async fn reenter(&mut self, snapshot: RunSnapshot) -> TurnMachine {
        let RunSnapshot {
            run,
            messages,
            state,
            journal,
            ..
        } = snapshot;
        let mut state = state.unwrap_or_else(|| RunState::new(TurnState::initial(self.ctx.limits().max_steps), ""));
        state.task.clone_from(&run.prompt);
        self.budget.seed(&run.metrics);
        self.principal.clone_from(&run.principal);
        let state = state.with_metrics(run.metrics);
        self.log.open();
        // Its trace context was read with its log when it was made ready
        // (`Agent::prepare_resume`), or is its parent's (a sub-agent).
        self.emit_start(&state, &run.prompt, true, None);
        if !journal.is_empty() {
            self.caches.logged_results = self.logged_results().await;
        }
        self.caches.journal = journal;
        if messages.is_empty() {
            // The process died before the first checkpoint: start over.
            let mut state = state;
            state.phase = TurnPhase::Boundary;
            let mut machine = self.machine(state, Vec::new());
            match self.earlier_conversation(None).await {
                Ok(history) => self.start_history(&mut machine, history, run.prompt).await,
                Err(reason) => machine.fail_to_start(reason),
            }
            return machine;
        }
        self.caches.remember_call_ids(&messages);
        let mut memory = Memory::new(self.engine.context.counter.clone());
        memory.extend(messages);
        memory.mark_saved();
        TurnMachine::resume(state, memory, self.engine.machine.clone())
    }

    fn machine(&self, state: RunState, messages: Vec<Message>) -> TurnMachine {
        let mut memory = Memory::new(self.engine.context.counter.clone());
        memory.extend(messages);
        TurnMachine::new(state, memory, self.engine.machine.clone())
    }

    /// Does what the machine asks until the run is over.
    async fn run(&mut self, machine: &mut TurnMachine) -> Ending {
        let ctx = self.ctx.clone();
        let mut deadlines = Deadlines::default();
        loop {
            self.flush(machine);
            match machine.next() {
                Next::Checkpoint => {
                    // The checkpoint before a turn's calls run is part of the
                    // turn's time; the one between turns is not.
                    let written = if machine.in_turn() {
                        let mut written = Ok(());
                        within(&ctx, &deadlines, async { written = self.checkpoint(machine).await }).await;
                        written
                    } else {
                        self.checkpoint(machine).await
                    };
                    machine.saved(written);
                }
                Next::BeginTurn => match self.within_budget(machine).and(self.may_begin().await) {
                    Ok(run) => {
                        machine.begin_turn();
                        // The step deadline covers the turn's model calls and
                        // tools; like the run's, its clock stops while a
                        // person is asked.
                        deadlines = Deadlines {
                            run,
                            step: ctx.step_deadline(),
                        };
                        self.step_deadline = deadlines.step.clone();
                    }
                    Err(reason) => machine.stop(reason),
                },
                Next::CallModel(call) => within(&ctx, &deadlines, self.call_model(machine, call)).await,
                Next::RunTools(calls) => {
                    // A sub-agent's run is many steps, each under its own
                    // step limit: the step that calls `task` is bounded by
                    // the run's limit only, or a child that works longer
                    // than one step may would end its parent (STEP_TIMEOUT).
                    let delegates = calls.iter().any(|call| call.name == crate::delegate::TASK_TOOL);
                    if delegates {
                        self.step_deadline = None;
                        let bounds = Deadlines {
                            run: deadlines.run.clone(),
                            step: None,
                        };
                        within(&ctx, &bounds, self.run_tools(machine, calls)).await
                    } else {
                        within(&ctx, &deadlines, self.run_tools(machine, calls)).await
                    }
                }
                Next::EndTurn => {
                    let mut end = self.turn_end(false);
                    // A person's message gets its turn anyway; otherwise the
                    // stop hooks may refuse the ending once more.
                    if end.steering.is_empty() {
                        let answer = machine.pending_answer().map(str::to_string);
                        if let Some(answer) = answer {
                            let refusal = self.stop_hooks(machine, &answer).await;
                            // Stopped while they ran (a cancel, an interrupt):
                            // not an ending they judged.
                            if let Some(reason) = self.stop_reason() {
                                machine.stop(reason);
                                continue;
                            }
                            end.steering.extend(refusal);
                            // A message a person sent while they ran.
                            end.steering.extend(self.controls.take_steering());
                        }
                    }
                    machine.end_turn(end);
                }
                Next::Finish(answer) => return Ending::Answer(answer),
                Next::Stop(reason) => return Ending::Stopped(reason),
            }
        }
    }

    /// Emits the events the machine queued.
    fn flush(&self, machine: &mut TurnMachine) {
        for (turn, kind) in machine.take_events() {
            self.events.emit(&turn, kind);
        }
    }

    /// Whether a turn may begin: not cancelled, within the run's time, not
    /// paused (a paused run waits here). Returns the run's deadline.
    async fn may_begin(&mut self) -> Result<Option<Deadline>, StopReason> {
        if let Some(reason) = self.stop_reason() {
            return Err(reason);
        }
        let run_deadline = self.ctx.run_deadline();
        if run_deadline.as_ref().is_some_and(Deadline::passed) {
            self.ctx.stop(StopCause::RunTimeout);
            return Err(StopReason::Timeout(TimeoutKind::Run));
        }
        if !self.controls.wait_while_paused(&self.ctx).await {
            return Err(self.stop_reason().unwrap_or_else(cancelled));
        }
        Ok(run_deadline)
    }

    /// Whether the run may spend more: warns once a budget is 80 % used
    /// (each budget once), and stops the run once one is used up.
    fn within_budget(&mut self, machine: &mut TurnMachine) -> Result<(), StopReason> {
        self.fold_children_usage(machine);
        let spending = self.budget.spending();
        if spending.is_empty() {
            return Ok(());
        }
        let turn = machine.ids().clone();
        for spent in &spending {
            if spent.share() >= WARN_AT && !self.budget_warned.contains(&spent.kind) {
                self.budget_warned.push(spent.kind);
                self.events.emit(
                    &turn,
                    EventKind::Warning {
                        code: WarningCode::BudgetLow,
                        message: format!("{} used; the run stops once its budget is used up", spent.describe()),
                    },
                );
            }
        }
        match spending.iter().find(|spent| spent.share() >= 1.0) {
            Some(spent) => Err(StopReason::BudgetExhausted(spent.kind)),
            None => Ok(()),
        }
    }

    /// Adds what the run's sub-agents spent since the last time to its
    /// metrics: a run's metrics show its whole subtree.
    pub(super) fn fold_children_usage(&self, machine: &mut TurnMachine) {
        let spent = self.budget.take_descendants();
        if spent.input_tokens == 0 && spent.output_tokens == 0 && spent.cost_usd.is_none() {
            return;
        }
        let metrics = machine.metrics_mut();
        metrics.input_tokens = metrics.input_tokens.saturating_add(spent.input_tokens);
        metrics.output_tokens = metrics.output_tokens.saturating_add(spent.output_tokens);
        if let Some(cost) = spent.cost_usd {
            *metrics.cost_usd.get_or_insert(0.0) += cost;
        }
    }

    /// What the machine needs to end a turn: a stop (after tools only: an
    /// answer without calls ends the turn anyway), steering, the time.
    pub(super) fn turn_end(&mut self, after_tools: bool) -> TurnEnd {
        TurnEnd {
            stop: if after_tools { self.stop_reason() } else { None },
            steering: self.controls.take_steering(),
            elapsed_seconds: self.ctx.elapsed().as_secs_f64(),
        }
    }

    /// Emits `lifecycle.start`; its time, in ms since the epoch, which the
    /// run's record keeps as its start (so a gateway that shows the run from
    /// its events and one that reads its record agree to the millisecond).
    fn emit_start(
        &self,
        state: &RunState,
        prompt: &str,
        resumed: bool,
        forked_from: Option<crate::event::ForkLink>,
    ) -> u64 {
        let event = self.events.stamp(
            &TurnIds::of(state.turn()),
            EventKind::LifecycleStart {
                prompt: prompt.to_string(),
                model: self.engine.llm.model_name().to_string(),
                max_steps: self.ctx.limits().max_steps,
                resumed,
                forked_from,
                trace_parent: self.trace_parent,
                agent: self.agent_name.as_deref().map(str::to_string),
            },
        );
        let started_ms = event.ts_ms().unwrap_or_else(|| {
            self.ctx
                .started_at()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        });
        self.events.send(event);
        started_ms
    }

    /// The conversation a run continues: the given history, or the
    /// session's earlier runs in the store.
    async fn earlier_conversation(&self, history: Option<Vec<Message>>) -> Result<Vec<Message>, StopReason> {
        if let Some(history) = history {
            return Ok(history);
        }
        crate::recovery::session_history(self.store.as_ref(), self.ctx.session_id())
            .await
            .map_err(|err| {
                StopReason::error(
                    ErrorCode::Store,
                    format!("cannot load the session's conversation: {err}"),
                )
            })
    }

    async fn start_history(&mut self, machine: &mut TurnMachine, history: Vec<Message>, prompt: String) {
        let turn = machine.ids().clone();
        let context = match self.prompt_hooks(&turn, &prompt, history.is_empty()).await {
            Ok(context) => context,
            Err(blocked) => return machine.fail_to_start(blocked),
        };
        let system = self.system_prompt(machine, &prompt).await;
        self.caches.remember_call_ids(&history);
        let memory = machine.memory_mut();
        memory.push(Message::system(system));
        memory.extend(history);
        machine.mark_conversation_start();
        // What hooks add travels with the prompt: one user message, which
        // every provider takes.
        let prompt = if context.is_empty() {
            prompt
        } else {
            format!("{prompt}\n\n<hook-context>\n{}\n</hook-context>", context.join("\n"))
        };
        machine.memory_mut().push(Message::user(prompt));
    }

    /// Records the run, already `RUNNING`: one write, so no crash can
    /// leave it `QUEUED` behind a process that was running it.
    async fn open_record(&self, prompt: &str, principal: Option<String>, started_ms: u64) -> Result<(), StopReason> {
        let ctx = &self.ctx;
        let record = RunRecord {
            owner: self.engine.owner.clone(),
            workspace: Some(self.workspace.display().to_string()),
            principal,
            parent: self.parent.clone(),
            ..RunRecord::new(
                ctx.run_id(),
                ctx.session_id(),
                prompt,
                self.engine.llm.model_name(),
                RunStatus::Running,
                started_ms,
            )
        };
        self.store
            .create_run(&record)
            .await
            .map_err(|err| store_stop("cannot record the run", &err))
    }

    /// Writes the state, the unsaved history and the events since the last
    /// checkpoint. The only place a run is checkpointed.
    async fn checkpoint(&mut self, machine: &mut TurnMachine) -> Result<(), StopReason> {
        if !self.store.keeps_anything() {
            machine.memory_mut().mark_saved();
            return Ok(());
        }
        // The log holds every event up to the state this records.
        if let Err(err) = self.log.flush().await {
            return Err(store_stop("cannot write the run's events", &err));
        }
        let events = self.events.take_log();
        machine.metrics_mut().duration_ms = self.ctx.elapsed().as_millis() as u64;
        let (new_messages, replaced_history) = match machine.memory().unsaved() {
            Unsaved::Tail(tail) => (tail, None),
            Unsaved::Whole(all) => (&[][..], Some(all)),
        };
        let written = self
            .store
            .checkpoint(&Checkpoint {
                run_id: self.ctx.run_id(),
                state: machine.state(),
                new_messages,
                replaced_history,
                events: &events,
            })
            .await;
        match written {
            Ok(()) => {
                machine.memory_mut().mark_saved();
                Ok(())
            }
            Err(err) => Err(store_stop("cannot write the checkpoint", &err)),
        }
    }

    /// Emits the final events, records the end and builds the outcome.
    async fn close(self, mut machine: TurnMachine, ending: Ending) -> RunOutcome {
        // Sub-agents still stopping (a cancel reached them with the run's)
        // finish first, so their usage is in this run's metrics.
        self.children.close();
        if tokio::time::timeout(CHILDREN_GRACE, self.children.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                run_id = self.ctx.run_id(),
                "sub-agents did not stop within {CHILDREN_GRACE:?}"
            );
        }
        self.fold_children_usage(&mut machine);
        let (state, memory) = machine.into_parts();
        let turn = TurnIds::of(state.turn());
        let turns = state.turn().turn_counter() + 1;
        let steps = state.steps();
        let mut metrics = state.metrics;
        metrics.duration_ms = self.ctx.elapsed().as_millis() as u64;
        let (status, content, stop_reason) = match ending {
            Ending::Stopped(StopReason::Interrupted(why)) => {
                return self.suspend(memory, metrics, turns, why).await;
            }
            Ending::Answer(content) => {
                self.events.emit(
                    &turn,
                    EventKind::AgentFinish {
                        content: content.clone(),
                        turns,
                        metrics: metrics.clone(),
                    },
                );
                (RunStatus::Done, Some(content), None)
            }
            Ending::Stopped(reason) => {
                self.report_stop(&turn, &reason, steps);
                (reason.status(), None, Some(reason))
            }
        };
        // `lifecycle.end` goes out only once the end is recorded, so whoever
        // sees it finds the run ended in the store too.
        let last = self.events.stamp(
            &turn,
            EventKind::LifecycleEnd {
                status,
                content: content.clone(),
                metrics: metrics.clone(),
            },
        );
        if let Err(err) = self.log.flush().await {
            tracing::error!(run_id = self.ctx.run_id(), error = %err, "could not record the run's last events");
        }
        let mut events = self.events.take_log();
        // What a refused write left waiting gets one more try, with the end.
        events.extend(self.log.unwritten());
        events.push(last.clone());
        let stored = match self
            .store
            .finish_run(self.ctx.run_id(), status, content.as_deref(), &metrics, &events)
            .await
        {
            Ok(()) => true,
            Err(err) => {
                tracing::error!(run_id = self.ctx.run_id(), error = %err, "could not record the end of the run");
                false
            }
        };
        // Visible first: the run's state never shows an end its log lacks
        // (and nobody sees the end, or what waited, if it is not stored).
        self.log.end(last, stored).await;
        self.controls.show(status);
        RunOutcome {
            run_id: self.ctx.run_id().to_string(),
            status,
            content,
            stop_reason,
            turns,
            metrics,
            messages: memory.into_messages(),
        }
    }

    /// Leaves an interrupted run resumable: its last checkpoint written (the
    /// machine asked for it when it stopped), its status `INTERRUPTED`, and
    /// no `lifecycle.end` (it is not over: `Agent::resume` continues it).
    async fn suspend(self, mut memory: Memory, metrics: RunMetrics, turns: u32, why: String) -> RunOutcome {
        let run_id = self.ctx.run_id();
        if !self.store.keeps_anything() && !crate::history::dangling_calls(memory.messages()).is_empty() {
            // Nothing can resume this run: its transcript ends before the
            // calls it could not answer, so it stays valid for a provider.
            memory.pop();
        }
        if let Err(err) = self.log.flush().await {
            tracing::error!(run_id, error = %err, "could not record the run's last events");
        }
        if self.engine.store.is_some() {
            if let Err(err) = self.store.mark_interrupted(run_id, &self.engine.owner).await {
                tracing::error!(run_id, error = %err, "could not record the interrupted run");
            }
        }
        self.controls.show(RunStatus::Interrupted);
        RunOutcome {
            run_id: run_id.to_string(),
            status: RunStatus::Interrupted,
            content: None,
            stop_reason: Some(StopReason::Interrupted(why)),
            turns,
            metrics,
            messages: memory.into_messages(),
        }
    }

    /// Emits the events that explain a stop.
    fn report_stop(&self, turn: &TurnIds, reason: &StopReason, steps: u32) {
        let (code, message) = match reason {
            StopReason::Cancelled(why) => {
                self.events
                    .emit(turn, EventKind::ExecutionCancelled { reason: why.clone() });
                return;
            }
            StopReason::Timeout(TimeoutKind::Run) => (
                ErrorCode::RunTimeout,
                "the run took longer than its time limit".to_string(),
            ),
            StopReason::Timeout(TimeoutKind::Step) => (
                ErrorCode::StepTimeout,
                "one step (model call and tools) took longer than its time limit".to_string(),
            ),
            StopReason::MaxStepsWithoutAnswer => (
                ErrorCode::MaxStepsNoAnswer,
                "the step limit was reached and the model gave no final answer".to_string(),
            ),
            StopReason::BudgetExhausted(kind) => {
                let spent = self
                    .budget
                    .spending()
                    .into_iter()
                    .find(|spent| spent.kind == *kind && spent.share() >= 1.0);
                (
                    ErrorCode::BudgetExhausted,
                    match spent {
                        Some(spent) => format!("{} used: the run's budget is used up", spent.describe()),
                        None => "the run used up its budget and was stopped".to_string(),
                    },
                )
            }
            StopReason::Monitor(verdict) => (
                ErrorCode::MonitorStopped,
                format!(
                    "the recursion monitor ended the tool phase after {steps} of {} steps ({}: {}) and the model gave no final answer",
                    self.ctx.limits().max_steps,
                    verdict.termination.reason(),
                    verdict.detail
                ),
            ),
            // Suspended runs do not get here (see `suspend`).
            StopReason::Interrupted(why) => (ErrorCode::Interrupted, why.clone()),
            StopReason::Error { code, message } => (*code, message.clone()),
        };
        self.events.emit(
            turn,
            EventKind::Error {
                code,
                message,
                recoverable: false,
            },
        );
    }

    /// Why the run must stop now, if it must.
    pub(super) fn stop_reason(&self) -> Option<StopReason> {
        stop_reason(&self.ctx)
    }

    /// `phase.start` or `phase.end`.
    pub(super) fn phase(&self, turn: &TurnIds, phase: Phase, start: bool) {
        let kind = if start {
            EventKind::PhaseStart { phase }
        } else {
            EventKind::PhaseEnd { phase }
        };
        self.events.emit(turn, kind);
    }
}

/// Runs a turn's `work` within its deadlines. When one passes, the run is
/// stopped and the work winds down (every running tool gets a result, so
/// the transcript stays valid).
async fn within<F: std::future::Future<Output = ()>>(ctx: &RunContext, deadlines: &Deadlines, work: F) {
    tokio::pin!(work);
    let cause = tokio::select! {
        biased;
        () = &mut work => return,
        () = expired(deadlines.step.as_ref()) => StopCause::StepTimeout,
        () = expired(deadlines.run.as_ref()) => StopCause::RunTimeout,
    };
    ctx.stop(cause);
    work.await;
}

/// Completes when `deadline` passes; never without one.
async fn expired(deadline: Option<&Deadline>) {
    match deadline {
        Some(deadline) => deadline.expired().await,
        None => std::future::pending().await,
    }
}

/// Why the run of `ctx` must stop now, if it must.
fn stop_reason(ctx: &RunContext) -> Option<StopReason> {
    if !ctx.is_cancelled() {
        return None;
    }
    Some(match ctx.stop_cause() {
        Some(StopCause::Cancelled(reason)) => StopReason::Cancelled(reason.clone()),
        Some(StopCause::RunTimeout) => StopReason::Timeout(TimeoutKind::Run),
        Some(StopCause::StepTimeout) => StopReason::Timeout(TimeoutKind::Step),
        Some(StopCause::Interrupted(reason)) => StopReason::Interrupted(reason.clone()),
        Some(StopCause::StoreFailed(reason)) => {
            StopReason::error(ErrorCode::Store, format!("cannot write the run's events: {reason}"))
        }
        None => cancelled(),
    })
}

/// How a run stops when its store refused a write: resumable
/// (`INTERRUPTED`) when the store is out of reach for now or another
/// process holds the run ([`StoreError::interrupts`]), else a `STORE` error.
fn store_stop(what: &str, err: &crate::store::StoreError) -> StopReason {
    if err.interrupts() {
        StopReason::Interrupted(format!("{what}: {err}"))
    } else {
        StopReason::error(ErrorCode::Store, format!("{what}: {err}"))
    }
}

pub(super) fn cancelled() -> StopReason {
    StopReason::Cancelled("cancelled".to_string())
}
