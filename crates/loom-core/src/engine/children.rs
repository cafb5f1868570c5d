//! Sub-agents: a run's `task` calls start child runs of their own — own run
//! id (recorded with the parent's), fresh conversation, a subset of the
//! parent's tools under the parent's permissions, a step limit and budgets
//! no larger than what the parent has left, a cancel token under the
//! parent's. A child's events join the parent's stream as they happen
//! (the stream is unbounded: a child never waits for a reader), with the
//! child's own `runId`, `parentRunId` and `depth`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, BudgetNode};
use crate::context::RunContext;
use crate::delegate::{ChildEnd, ChildReport, ChildRequest, DelegateError, SubAgents};
use crate::emitter::EventEmitter;
use crate::event::{EventKind, TurnIds};
use crate::live_state::LiveState;
use crate::machine::TurnMachine;
use crate::outcome::{ErrorCode, RunOutcome, StopReason};
use crate::permission::PermissionGate;
use crate::status::RunStatus;
use crate::store::{ParentLink, RunRecord, Store, StoreError};

use super::{Caches, Controls, Driver, Engine, EventLog, Start};

use crate::delegate::TASK_TOOL;

/// What a `task` call needs of the run that makes it.
pub(crate) struct Children {
    engine: Arc<Engine>,
    parent: RunContext,
    turn: TurnIds,
    depth: u32,
    tools: Arc<crate::pipeline::ToolPipeline>,
    stream: crate::live_state::RunStream,
    gate: PermissionGate,
    pause_rx: watch::Receiver<bool>,
    store: Arc<dyn Store>,
    workspace: Arc<Path>,
    budget: Arc<BudgetNode>,
    steps_left: u32,
    /// The calling turn's time limit.
    step_deadline: Option<crate::context::Deadline>,
    /// Whose the parent is: its children are the same token's.
    principal: Option<String>,
    /// The trace context of the run tree, which its children carry.
    trace_parent: Option<crate::trace_context::TraceParent>,
    slots: Arc<tokio::sync::Semaphore>,
    tracker: tokio_util::task::TaskTracker,
}

impl std::fmt::Debug for Children {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("parent", &self.parent.run_id())
            .field("depth", &self.depth)
            .finish()
    }
}

impl Driver {
    /// What this turn's `task` calls may start: `None` when this run may
    /// not have sub-agents (its depth is at the limit).
    pub(super) fn sub_agents(&self, machine: &TurnMachine, turn: &TurnIds) -> Option<Arc<dyn SubAgents>> {
        let depth = self.events.depth();
        if depth >= self.engine.sub_agents.max_depth {
            return None;
        }
        let steps_left = self.ctx.limits().max_steps.saturating_sub(machine.state().steps());
        Some(Arc::new(Children {
            engine: self.engine.clone(),
            parent: self.ctx.clone(),
            turn: turn.clone(),
            depth,
            tools: self.tools.clone(),
            stream: self.log.visible(),
            gate: self.gate.clone(),
            pause_rx: self.controls.pause_rx.clone(),
            store: self.store.clone(),
            workspace: self.workspace.clone(),
            budget: self.budget.clone(),
            steps_left,
            step_deadline: self.step_deadline.clone(),
            principal: self.principal.clone(),
            trace_parent: self.trace_parent,
            slots: self.child_slots.clone(),
            tracker: self.children.clone(),
        }))
    }
}

impl Driver {
    /// Counts the spending of the sub-agent that the call `call_id` started
    /// and that ended before a crash (its result comes from the journal).
    pub(super) async fn account_recorded_child(&self, call_id: &str) {
        let child = crate::delegate::child_run_id(self.ctx.run_id(), call_id);
        if let Ok(found) = self.store.load_run(&child).await {
            self.budget.charge_descendant(&found.run.metrics);
        }
    }
}

impl Children {
    /// The child's tools: the requested ones (each the parent's), or
    /// (`all`, for an agent defined without a list) all the parent's, or
    /// the parent's read-only ones; never `task` at the nesting limit.
    fn tools_for(&self, requested: Option<&[String]>, all: bool) -> Result<crate::tool::ToolRegistry, DelegateError> {
        let registry = self.tools.registry();
        let child_depth = self.depth + 1;
        let nested_allowed = child_depth < self.engine.sub_agents.max_depth;
        match requested {
            Some(names) => {
                let unknown: Vec<&str> = names
                    .iter()
                    .map(String::as_str)
                    .filter(|name| registry.get(name).is_none())
                    .collect();
                if !unknown.is_empty() {
                    let offered: Vec<&str> = registry.names().collect();
                    return Err(DelegateError::Tools(format!(
                        "the sub-agent cannot have {}: not a tool of this run (it has: {})",
                        unknown.join(", "),
                        offered.join(", ")
                    )));
                }
                if !nested_allowed && names.iter().any(|name| name == TASK_TOOL) {
                    return Err(DelegateError::Tools(format!(
                        "a sub-agent at depth {child_depth} cannot start sub-agents of its own (the limit is {} levels)",
                        self.engine.sub_agents.max_depth
                    )));
                }
                let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
                Ok(registry.subset(|tool| wanted.contains(tool.spec.name.as_str())))
            }
            None if all => Ok(registry.subset(|tool| nested_allowed || tool.spec.name != TASK_TOOL)),
            None => Ok(registry.subset(|tool| tool.tool.read_only() && tool.spec.name != TASK_TOOL)),
        }
    }

    /// What can refuse a child, checked before anything is started or
    /// taken over: its tools, its model, and whether the parent has steps
    /// and budget left. Returns the child's tools, budget and engine.
    fn preflight(&self, request: &ChildRequest) -> Result<Preflight, DelegateError> {
        let all_tools = request.agent.as_ref().is_some_and(|agent| agent.all_tools);
        let registry = self.tools_for(request.tools.as_deref(), all_tools)?;
        let engine = match request.agent.as_ref().and_then(|agent| agent.model.as_deref()) {
            Some(spec) => self.engine_with_model(spec)?,
            None => self.engine.clone(),
        };
        if self.steps_left == 0 {
            return Err(DelegateError::NothingLeft(
                "this run has no steps left for a sub-agent".to_string(),
            ));
        }
        let remaining = self.budget.remaining();
        if remaining.max_tokens == Some(0) || remaining.max_cost_usd.is_some_and(|left| left <= 0.0) {
            return Err(DelegateError::NothingLeft(
                "this run's budget is used up: no sub-agent can start".to_string(),
            ));
        }
        Ok(Preflight {
            registry,
            remaining,
            engine,
        })
    }

    /// The engine with the model `spec` names, from the agent's model source.
    fn engine_with_model(&self, spec: &str) -> Result<Arc<Engine>, DelegateError> {
        if spec == self.engine.llm.model_name() {
            return Ok(self.engine.clone());
        }
        let Some(models) = &self.engine.models else {
            return Err(DelegateError::Model(format!(
                "the sub-agent's model {spec} cannot be made here: this agent has no model source"
            )));
        };
        let sourced = models
            .model(spec, self.principal.as_deref())
            .map_err(|err| DelegateError::Model(format!("the sub-agent's model {spec}: {err}")))?;
        // A model without prices would spend outside a cost budget.
        if sourced.pricing.is_none() && self.budget.remaining().max_cost_usd.is_some() {
            return Err(DelegateError::Model(format!(
                "the sub-agent's model {spec} has no prices, and this run has a cost budget"
            )));
        }
        let mut engine = Engine::clone(&self.engine);
        engine.llm = sourced.llm;
        engine.pricing = sourced.pricing;
        Ok(Arc::new(engine))
    }

    /// The child's driver, ready to run: a new child (`last_seq` 0) or one
    /// resumed after its stored events, with `registry` and `remaining`
    /// from [`Children::preflight`].
    fn child_driver(
        &self,
        request: &ChildRequest,
        Preflight {
            registry,
            remaining,
            engine,
        }: Preflight,
        cancel: CancellationToken,
        run_id: String,
        last_seq: u64,
    ) -> (Driver, Inherited) {
        let mut limits = self.parent.limits().clone();
        let wanted = request.max_steps.unwrap_or(self.engine.sub_agents.default_steps).max(1);
        limits.max_steps = wanted.min(self.steps_left);
        let mut inherited = Inherited {
            steps: (wanted > self.steps_left).then_some(self.steps_left),
            time: false,
        };
        // A child has at most the time its parent has left: of its run, and
        // of the calling turn when that has a limit (the driver lifts the
        // step limit from a turn that calls `task`).
        let parent_ends = [self.parent.run_deadline(), self.step_deadline.clone()]
            .into_iter()
            .flatten()
            .filter_map(|deadline| deadline.at())
            .min();
        if let Some(at) = parent_ends {
            let left = at
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            inherited.time = limits.run_timeout.is_none_or(|own| left < own);
            limits.run_timeout = Some(limits.run_timeout.map_or(left, |own| own.min(left)));
        }
        // Its own budget is what the parent has left; the parent's (and
        // every ancestor's) stay in force above it as both spend.
        limits.budget = Budget::default();
        let depth = self.depth + 1;
        let ctx = RunContext::new(
            Some(run_id),
            Some(self.parent.session_id().to_string()),
            self.workspace.to_path_buf(),
            limits,
            cancel,
        )
        .under(&self.parent);
        // Its events join the root's stream once stored, like the root's own.
        let (log, sink) = if self.store.keeps_anything() {
            EventLog::start(self.store.clone(), ctx.clone(), self.stream.clone())
        } else {
            EventLog::direct(self.stream.clone())
        };
        let events = EventEmitter::to_sink(ctx.run_id_arc(), depth, sink)
            .with_parent_run(self.parent.run_id_arc())
            .continuing_after(last_seq);
        let (_steer_tx, steer_rx) = mpsc::unbounded_channel();
        // Its own status is its parent's business (its asks show in the
        // root's state, through the root's stream).
        let state = Arc::new(watch::channel(LiveState::default()).0);
        // Asks go to the same person as the parent's: the root's
        // controller answers them (request ids differ by run).
        let gate = PermissionGate {
            state: state.clone(),
            store: self
                .gate
                .store
                .as_ref()
                .map(|(store, _)| (store.clone(), ctx.run_id_arc())),
            ..self.gate.clone()
        };
        let driver = Driver {
            engine,
            tools: Arc::new(self.tools.with_tools(registry)),
            child_slots: Arc::new(tokio::sync::Semaphore::new(self.engine.sub_agents.max_running)),
            budget: self.budget.child(remaining),
            parent: Some(ParentLink {
                run_id: self.parent.run_id().to_string(),
                turn_id: self.turn.turn_id.to_string(),
            }),
            children: tokio_util::task::TaskTracker::new(),
            ctx,
            workspace: self.workspace.clone(),
            store: self.store.clone(),
            events,
            log,
            controls: Controls {
                steer_rx,
                pause_rx: self.pause_rx.clone(),
                state,
            },
            gate,
            caches: Caches::default(),
            budget_warned: Vec::new(),
            step_deadline: None,
            principal: self.principal.clone(),
            trace_parent: self.trace_parent,
            instructions: request
                .agent
                .as_ref()
                .map(|agent| Arc::from(agent.instructions.as_str())),
            agent_name: request.agent.as_ref().map(|agent| Arc::from(agent.name.as_str())),
        };
        (driver, inherited)
    }
}

/// What [`Children::preflight`] found a child may have.
struct Preflight {
    registry: crate::tool::ToolRegistry,
    remaining: Budget,
    /// The parent's engine, or a copy with the child's own model.
    engine: Arc<Engine>,
}

/// The limits a child got from what its parent had left rather than from
/// its own request: reaching one of them is running out of budget.
#[derive(Debug, Clone, Copy)]
struct Inherited {
    /// The parent's steps left, when fewer than the child asked for.
    steps: Option<u32>,
    /// Its time limit is the parent's time left.
    time: bool,
}

#[async_trait::async_trait]
impl SubAgents for Children {
    async fn run_child(&self, request: ChildRequest, cancel: CancellationToken) -> Result<ChildReport, DelegateError> {
        // A place among the children running at once.
        let slot = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(DelegateError::Cancelled),
            slot = self.slots.clone().acquire_owned() => slot.map_err(|_| DelegateError::Cancelled)?,
        };
        let child_cancel = cancel.child_token();
        let run_id = crate::delegate::child_run_id(self.parent.run_id(), &request.call_id);
        let allowed = self.preflight(&request)?;
        // The same call made again after a crash finds the child it began.
        let mut spent_before = None;
        let (start, last_seq) = match self.store.load_run(&run_id).await {
            Err(StoreError::NotFound(_)) => (
                Start::New {
                    prompt: request.prompt.clone(),
                    history: Some(Vec::new()),
                    principal: self.principal.clone(),
                    forked_from: None,
                    trace_parent: self.trace_parent,
                },
                0,
            ),
            Ok(found) if found.run.status.is_terminal() => {
                // It ended before the crash; its result was not recorded.
                self.budget.charge_descendant(&found.run.metrics);
                // Its record keeps its status; its last events say why.
                let last = self
                    .store
                    .events_page(&run_id, found.last_seq.saturating_sub(4), 8)
                    .await
                    .unwrap_or_default();
                let ran_out = last.iter().any(
                    |event| matches!(&event.kind, EventKind::Error { code, .. } if *code == ErrorCode::BudgetExhausted),
                );
                return Ok(report_stored(found.run, ran_out));
            }
            Ok(_) => {
                let snapshot = crate::recovery::take_over(self.store.as_ref(), &run_id, &self.engine.owner)
                    .await
                    .map_err(|err| DelegateError::Resume(format!("the sub-agent {run_id} cannot be resumed: {err}")))?;
                spent_before = Some(snapshot.run.metrics.clone());
                let last_seq = snapshot.last_seq;
                (Start::Resumed(Box::new(snapshot)), last_seq)
            }
            Err(err) => {
                return Err(DelegateError::Resume(format!(
                    "the sub-agent {run_id} cannot be looked up: {err}"
                )))
            }
        };
        let (driver, inherited) = self.child_driver(&request, allowed, child_cancel.clone(), run_id.clone(), last_seq);
        // What a resumed child spent before the crash counts for its
        // ancestors again (its own node is seeded with it when it resumes;
        // the budget it was given is what was left before counting it).
        if let Some(spent) = &spent_before {
            self.budget.charge_descendant(spent);
        }
        // The child runs as a task of its own, tracked by the parent: if
        // this call is dropped (its grace after a cancel ran out), the
        // child still stops in order and the parent waits for it.
        let child = self.tracker.spawn(async move {
            let outcome = driver.drive(start).await;
            drop(slot);
            outcome
        });
        // Dropping this future (the call given up) must stop the child.
        let _stop_on_drop = child_cancel.drop_guard();
        match child.await {
            Ok(outcome) => Ok(report(outcome, inherited)),
            Err(err) => Ok(ChildReport {
                run_id,
                end: ChildEnd::Failed,
                answer: None,
                reason: Some(format!("the sub-agent's task failed: {err}")),
                metrics: crate::metrics::RunMetrics::default(),
            }),
        }
    }
}

/// How a child ended, in the words of its result: only an answer is
/// "completed"; a child that reached a limit its parent's budget set
/// (tokens, cost, steps or time it inherited) ran out of budget.
fn report(outcome: RunOutcome, inherited: Inherited) -> ChildReport {
    let out_of_parents = match &outcome.stop_reason {
        Some(StopReason::MaxStepsWithoutAnswer) => inherited
            .steps
            .map(|steps| format!("it used the {steps} steps its parent had left without an answer")),
        Some(StopReason::Timeout(crate::outcome::TimeoutKind::Run)) if inherited.time => {
            Some("it used the time its parent had left".to_string())
        }
        _ => None,
    };
    let end = match (&outcome.status, &outcome.stop_reason) {
        (RunStatus::Done, _) => ChildEnd::Completed,
        (RunStatus::Canceled, _) | (_, Some(StopReason::Cancelled(_))) => ChildEnd::Cancelled,
        (_, Some(StopReason::BudgetExhausted(_))) => ChildEnd::BudgetExhausted,
        _ if out_of_parents.is_some() => ChildEnd::BudgetExhausted,
        _ => ChildEnd::Failed,
    };
    let reason = match (&end, &outcome.stop_reason) {
        (ChildEnd::Completed, _) => None,
        _ if out_of_parents.is_some() => out_of_parents,
        (_, Some(reason)) => Some(describe(reason)),
        (_, None) => Some(format!("it ended {}", outcome.status.as_str())),
    };
    ChildReport {
        run_id: outcome.run_id,
        end,
        answer: outcome.content.filter(|_| end == ChildEnd::Completed),
        reason,
        metrics: outcome.metrics,
    }
}

/// How a child that ended before a crash ended, from its record and
/// whether its last events say it ran out of budget.
fn report_stored(run: RunRecord, ran_out_of_budget: bool) -> ChildReport {
    let end = match run.status {
        RunStatus::Done => ChildEnd::Completed,
        RunStatus::Canceled => ChildEnd::Cancelled,
        _ if ran_out_of_budget => ChildEnd::BudgetExhausted,
        _ => ChildEnd::Failed,
    };
    ChildReport {
        reason: (end != ChildEnd::Completed).then(|| format!("it ended {}", run.status.as_str())),
        answer: run.content.filter(|_| end == ChildEnd::Completed),
        run_id: run.run_id,
        end,
        metrics: run.metrics,
    }
}

fn describe(reason: &StopReason) -> String {
    match reason {
        StopReason::Cancelled(why) => format!("cancelled: {why}"),
        StopReason::Timeout(kind) => format!("its time limit passed ({kind:?})").to_lowercase(),
        StopReason::MaxStepsWithoutAnswer => "it reached its step limit without an answer".to_string(),
        StopReason::Monitor(verdict) => format!("the recursion monitor stopped it: {}", verdict.detail),
        StopReason::BudgetExhausted(kind) => format!("its {kind:?} budget was used up").to_lowercase(),
        StopReason::Interrupted(why) => format!("interrupted: {why}"),
        StopReason::Error { code, message } => format!("{code}: {message}"),
    }
}
