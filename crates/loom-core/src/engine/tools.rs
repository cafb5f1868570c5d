//! Phase 3 of a turn: the calls run through the tool pipeline — or, for
//! the calls a crash cut short, are settled from the journal first (see
//! [`crate::resume`]) — and every call gets exactly one result, in call
//! order, also when the run is cancelled.

use std::collections::HashMap;

use crate::event::{EventKind, Phase, TurnIds};
use crate::machine::TurnMachine;
use crate::message::ToolCall;
use crate::pipeline::BatchEnv;
use crate::resume::CallRepair;
use crate::tool_result::{ErrorKind, ToolResult};

use super::Driver;

impl Driver {
    /// Runs the turn's `calls` and hands the results to the machine.
    pub(super) async fn run_tools(&mut self, machine: &mut TurnMachine, calls: Vec<ToolCall>) {
        let turn = machine.ids().clone();
        // Only the first tool turn of a resumed run can have journaled
        // calls, or calls whose result its log told already.
        let journal = std::mem::take(&mut self.caches.journal);
        let logged = std::mem::take(&mut self.caches.logged_results);
        self.snapshot_before_first_step(machine.state().steps(), &turn).await;
        self.phase(&turn, Phase::Tools, true);
        let results = if journal.is_empty() {
            self.pipeline(machine, &calls, &turn).await
        } else {
            self.settle(machine, &calls, &journal, &logged, &turn).await
        };
        self.phase(&turn, Phase::Tools, false);
        self.events
            .emit(&turn, EventKind::ToolCallsComplete { count: results.len() });
        // The turn's checkpoint then holds what its sub-agents spent — unless
        // the run is being interrupted: then the checkpoint is the one from
        // before the calls, and the resumed run counts its sub-agents'
        // spending when it settles the calls (see `account_recorded_child`).
        if !matches!(self.ctx.stop_cause(), Some(crate::context::StopCause::Interrupted(_))) {
            self.fold_children_usage(machine);
        }
        let end = self.turn_end(true);
        let step = machine.state().steps() + 1;
        if end.stop.is_none() {
            self.snapshot_after_step(step, &turn).await;
        } else {
            self.snapshot_stopped_step(step).await;
        }
        machine.tools_returned(&calls, results, end);
    }

    /// Calls cut short by a crash: recorded results are reused (and not
    /// told again when the log has them, `logged`), calls that may have had
    /// an effect get an "interrupted" result, and only calls that never
    /// started or have no side effects run.
    async fn settle(
        &mut self,
        machine: &mut TurnMachine,
        calls: &[ToolCall],
        journal: &[crate::store::JournalEntry],
        logged: &HashMap<String, (crate::tool_result::ToolStatus, String)>,
        turn: &TurnIds,
    ) -> Vec<ToolResult> {
        let tools = self.tools.clone();
        let resumable = |call: &ToolCall| {
            tools
                .registry()
                .get(&call.name)
                .is_some_and(|registered| registered.tool.resumable())
        };
        let repairs: Vec<CallRepair> = crate::resume::plan_resuming(calls, journal, resumable)
            .into_iter()
            .map(|repair| match repair {
                // The journal's result, the very one the log told last.
                CallRepair::Recorded(result)
                    if logged
                        .get(&result.call_id)
                        .is_some_and(|(status, content)| *status == result.status && *content == result.content) =>
                {
                    CallRepair::Told(result)
                }
                repair => repair,
            })
            .collect();
        let resumable_names: Vec<String> = calls
            .iter()
            .filter(|call| resumable(call))
            .map(|call| call.name.clone())
            .collect();
        let rerun: Vec<ToolCall> = repairs
            .iter()
            .filter_map(|repair| match repair {
                CallRepair::Rerun(call) => Some(call.clone()),
                _ => None,
            })
            .collect();
        let mut rerun_results = self.pipeline(machine, &rerun, turn).await.into_iter();
        let mut results = Vec::with_capacity(repairs.len());
        for repair in repairs {
            let result = match repair {
                // The pipeline answers every call; the fallback only keeps the
                // history valid should it ever not.
                CallRepair::Rerun(call) => rerun_results
                    .next()
                    .unwrap_or_else(|| crate::resume::not_run_result(&call)),
                CallRepair::Recorded(result) if resumable_names.contains(&result.name) => {
                    // A sub-agent that ended before the crash: its spending
                    // is not in the checkpoint this run resumed from.
                    self.account_recorded_child(&result.call_id).await;
                    record_tool_metrics(machine, &result);
                    self.events.emit(turn, EventKind::tool_result(&result));
                    result
                }
                CallRepair::Recorded(result) | CallRepair::Interrupted(result) => {
                    record_tool_metrics(machine, &result);
                    self.events.emit(turn, EventKind::tool_result(&result));
                    result
                }
                CallRepair::Told(result) => {
                    if resumable_names.contains(&result.name) {
                        self.account_recorded_child(&result.call_id).await;
                    }
                    record_tool_metrics(machine, &result);
                    result
                }
            };
            results.push(result);
        }
        results
    }

    /// Runs `calls` through the pipeline.
    async fn pipeline(&mut self, machine: &mut TurnMachine, calls: &[ToolCall], turn: &TurnIds) -> Vec<ToolResult> {
        let engine = self.engine.clone();
        let tools = self.tools.clone();
        let sub_agents = self.sub_agents(machine, turn);
        let env = BatchEnv {
            ctx: &self.ctx,
            workspace: &self.workspace,
            events: &self.events,
            turn,
            gate: &self.gate,
            store: &self.store,
            protected: &engine.protected,
            read_only: &engine.read_only,
            sub_agents,
        };
        let results = tools.run_batch(calls, &env).await;
        for result in &results {
            record_tool_metrics(machine, result);
        }
        results
    }
}

fn record_tool_metrics(machine: &mut TurnMachine, result: &ToolResult) {
    // A call that never started is not a call: a resumed run may still run
    // it, and counts it then (once, not twice and once failed).
    if result.metadata.error_kind == Some(ErrorKind::NotStarted) {
        return;
    }
    machine.metrics_mut().record_tool(
        &result.name,
        result.status.is_failure(),
        result.metadata.error_kind.as_ref().map(ErrorKind::as_str),
        result.metadata.duration_ms,
    );
}

impl Driver {
    /// Takes up a change in the agent's tool sources (an MCP server's
    /// `list_changed`) between turns. A sub-agent keeps the subset it was
    /// given.
    pub(super) async fn refresh_tools(&mut self) {
        if self.parent.is_some() {
            return;
        }
        self.engine.tools.settle().await;
        let latest = self.engine.tools.current();
        if !std::sync::Arc::ptr_eq(&latest, &self.tools) {
            self.tools = latest;
            // The definitions changed, so their token count did too.
            self.caches.tools_tokens = None;
            self.caches.tools_bound = None;
        }
    }
}
