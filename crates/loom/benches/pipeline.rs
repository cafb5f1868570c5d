//! The tool pipeline's own cost and the scheduler's parallelism:
//!
//! - ten concurrency-safe calls of a tool that sleeps 1 s, in one turn: the
//!   wall time should be about 1 s, not 10 s;
//! - microseconds per call of a no-op tool (one turn with 1000 calls, minus
//!   a run without calls), with every call allowed, and with an `ask` rule
//!   that the consumer answers as soon as the request arrives.
//!
//!     cargo bench -p loom --bench pipeline

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::{
    Agent, Decision, EventKind, PermissionDecision, PermissionPolicy, RunStatus, Tool, ToolContext, ToolError,
    ToolOutput,
};
use loom_testkit::{NoArgs, NoopTool};
use serde_json::json;

struct SleepOneSecond;

impl Tool for SleepOneSecond {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "sleep"
    }
    fn description(&self) -> &str {
        "Sleeps for one second."
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok("slept".into())
    }
}

fn one_turn(tool: &str, calls: usize) -> Vec<ScriptTurn> {
    let mut turns = Vec::new();
    if calls > 0 {
        turns.push(ScriptTurn {
            tool_calls: (0..calls)
                .map(|_| ScriptToolCall {
                    name: tool.into(),
                    arguments: json!({}),
                    id: None,
                })
                .collect(),
            ..ScriptTurn::default()
        });
    }
    turns.push(ScriptTurn {
        content: Some("done".into()),
        ..ScriptTurn::default()
    });
    turns
}

/// Wall time of one run; answers every permission request at once.
async fn run(agent: Agent) -> Duration {
    let started = Instant::now();
    let mut handle = agent.run("bench");
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            handle
                .respond_permission(request_id, PermissionDecision::Allow)
                .expect("request is waiting");
        }
    }
    let outcome = handle.outcome().await;
    assert_eq!(outcome.status, RunStatus::Done);
    started.elapsed()
}

fn noop_agent(calls: usize, ask: bool) -> Agent {
    let policy = if ask {
        PermissionPolicy::new(Decision::Allow)
            .rule("noop", Decision::Ask)
            .expect("rule")
    } else {
        PermissionPolicy::default()
    };
    Agent::builder()
        .model(ScriptedModel::new(one_turn("noop", calls)).check_history(false))
        .tool(NoopTool::concurrent())
        .permissions(policy)
        .max_concurrency(1000)
        .build()
        .expect("agent")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("pipeline benchmark: run with `cargo bench -p loom --bench pipeline`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let agent = Agent::builder()
        .model(ScriptedModel::new(one_turn("sleep", 10)))
        .tool(SleepOneSecond)
        .build()
        .expect("agent");
    let took = runtime.block_on(run(agent));
    println!(
        "10 concurrency-safe calls of a 1 s tool: {:.3} s wall time",
        took.as_secs_f64()
    );

    const CALLS: usize = 1000;
    const SAMPLES: usize = 15;
    for ask in [false, true] {
        let mut per_call = Vec::with_capacity(SAMPLES);
        runtime.block_on(run(noop_agent(CALLS, ask)));
        for _ in 0..SAMPLES {
            let with_calls = runtime.block_on(run(noop_agent(CALLS, ask)));
            let without = runtime.block_on(run(noop_agent(0, ask)));
            per_call.push((with_calls.as_secs_f64() - without.as_secs_f64()) * 1e6 / CALLS as f64);
        }
        println!(
            "pipeline overhead, no-op tool, {}: {:.2} µs per call (median of {SAMPLES} runs of {CALLS} calls)",
            if ask { "ask rule answered at once" } else { "allowed" },
            median(per_call)
        );
    }
}
