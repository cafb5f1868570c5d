//! Sub-agents: what parallel `task` calls buy, and what starting a child
//! costs the engine.
//!
//! 1. Wall time of 8 children run in parallel (one turn with 8 `task`
//!    calls; the cap on children at once raised to 8, and at its default
//!    of 4) against 8 in sequence (8 turns of one `task` call), with a
//!    scripted model that answers every call after 200 ms. Ideal: 8 × 200
//!    ms in sequence, 200 ms in parallel (400 ms with the cap of 4), plus
//!    the parent's own calls, which answer at once.
//! 2. The engine's cost of a child: a run with N sequential `task` calls
//!    whose children answer at once, against the same run with N calls of
//!    a no-op tool; the difference per call is the child's start, its one
//!    (scripted, instant) model call and its end. No store.
//!
//!     cargo bench -p loom --bench subagents

#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed unwrap is a failed bench

use std::time::{Duration, Instant};

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::tools::Task;
use loom::{Agent, Decision, MonitorConfig, PermissionPolicy, RunStatus, SubAgentSettings};
use loom_testkit::NoopTool;
use serde_json::json;

const CHILDREN: usize = 8;
const MODEL_DELAY_MS: u64 = 200;
const COST_CALLS: usize = 200;
const SAMPLES: usize = 5;

fn call(name: &str, count: usize) -> ScriptTurn {
    ScriptTurn {
        tool_calls: (0..count)
            .map(|i| ScriptToolCall {
                name: name.into(),
                arguments: if name == "task" {
                    json!({"description": format!("part {i}"), "prompt": format!("do part {i}"), "tools": []})
                } else {
                    json!({})
                },
                id: None,
            })
            .collect(),
        ..ScriptTurn::default()
    }
}

fn answer(delay_ms: u64) -> ScriptTurn {
    ScriptTurn {
        content: Some("done".into()),
        delay_ms: (delay_ms > 0).then_some(delay_ms),
        ..ScriptTurn::default()
    }
}

async fn run(script: Vec<ScriptTurn>, max_running: usize) -> Duration {
    let policy = PermissionPolicy::new(Decision::Allow);
    let agent = Agent::builder()
        .model(ScriptedModel::new(script).check_history(false))
        .tool(Task::new())
        .tool(NoopTool::serial())
        .permissions(policy)
        .max_steps(1000)
        .sub_agents(SubAgentSettings {
            max_running,
            ..SubAgentSettings::default()
        })
        // The cost run repeats one call on purpose.
        .monitor(MonitorConfig {
            duplicate_threshold: u32::MAX,
            ..MonitorConfig::default()
        })
        .feedback(false)
        .build()
        .unwrap();
    let started = Instant::now();
    let (_, outcome) = agent.run("go").collect().await;
    let took = started.elapsed();
    assert_eq!(outcome.status, RunStatus::Done, "{outcome:?}");
    took
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn parallel(max_running: usize) -> Duration {
    let mut script = vec![call("task", CHILDREN)];
    script.extend((0..CHILDREN).map(|_| answer(MODEL_DELAY_MS)));
    script.push(answer(0));
    run(script, max_running).await
}

async fn sequential() -> Duration {
    let mut script = Vec::new();
    for _ in 0..CHILDREN {
        script.push(call("task", 1));
        script.push(answer(MODEL_DELAY_MS));
    }
    script.push(answer(0));
    run(script, CHILDREN).await
}

async fn per_call(tool: &str) -> Duration {
    let mut script = Vec::new();
    for _ in 0..COST_CALLS {
        script.push(call(tool, 1));
        if tool == "task" {
            script.push(answer(0));
        }
    }
    script.push(answer(0));
    run(script, 4).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut rows = Vec::new();
    for (label, cap) in [
        ("parallel, cap 8", Some(8)),
        ("parallel, cap 4 (default)", Some(4)),
        ("sequential", None),
    ] {
        let mut samples = Vec::new();
        for _ in 0..SAMPLES {
            samples.push(match cap {
                Some(cap) => parallel(cap).await,
                None => sequential().await,
            });
        }
        rows.push((label, median(samples)));
    }
    println!("{CHILDREN} children, model answers after {MODEL_DELAY_MS} ms (median of {SAMPLES}):");
    for (label, took) in &rows {
        println!("  {label:<28} {:>8.1} ms", ms(*took));
    }
    let mut with_children = Vec::new();
    let mut with_noop = Vec::new();
    for _ in 0..SAMPLES {
        with_children.push(per_call("task").await);
        with_noop.push(per_call("noop").await);
    }
    let (children, noop) = (median(with_children), median(with_noop));
    let per_child = children.saturating_sub(noop).as_secs_f64() * 1e6 / COST_CALLS as f64;
    println!(
        "engine cost of a child (start, one instant model call, end; no store): {per_child:.1} µs \
         ({COST_CALLS} task calls {:.1} ms, {COST_CALLS} no-op calls {:.1} ms)",
        ms(children),
        ms(noop)
    );
}
