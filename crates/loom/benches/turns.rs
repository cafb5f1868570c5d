//! The engine's own cost per turn: a scripted model (no network, no history
//! check) and a no-op tool, for runs of 10, 100 and 1000 tool turns. Prints
//! microseconds per turn (median of several runs); the figure should not grow
//! with depth. Feedback (a guidance message per turn) and the monitor are on.
//! Exact token counting starts once the cheap upper bound of the history
//! nears the warning line (after a few hundred turns here); from then on
//! each new message is counted once, so the cost per turn steps up once and
//! then stays flat.
//!
//!     cargo bench -p loom --bench turns

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::{Agent, EventKind, MonitorConfig, RunStatus};
use loom_testkit::NoopTool;
use serde_json::json;

fn script(turns: usize) -> Vec<ScriptTurn> {
    let mut script: Vec<ScriptTurn> = (0..turns)
        .map(|_| ScriptTurn {
            tool_calls: vec![ScriptToolCall {
                name: "noop".into(),
                arguments: json!({}),
                id: None,
            }],
            ..ScriptTurn::default()
        })
        .collect();
    script.push(ScriptTurn {
        content: Some("done".into()),
        ..ScriptTurn::default()
    });
    script
}

/// One run of `turns` tool turns plus the answer; returns its wall time and
/// when each `iteration.start` reached the consumer.
async fn one_run(turns: usize, script: Vec<ScriptTurn>) -> (Duration, Vec<Instant>) {
    let model = ScriptedModel::new(script).check_history(false);
    let agent = Agent::builder()
        .model(model)
        .tool(NoopTool::serial())
        // The script repeats one call on purpose; the monitor would rightly
        // stop that after 3 turns. Feedback and the rest stay on.
        .monitor(MonitorConfig {
            duplicate_threshold: u32::MAX,
            ..MonitorConfig::default()
        })
        // A window no run here fills: this measures turns, not compression
        // (the context benchmark measures that).
        .context_window(50_000_000)
        .max_steps(turns as u32 + 1)
        .build()
        .expect("agent");
    let started = Instant::now();
    let mut handle = agent.run("bench");
    let mut events = 0usize;
    let mut turn_starts = Vec::with_capacity(turns + 1);
    while let Some(event) = handle.next_event().await {
        events += 1;
        if let EventKind::IterationStart { .. } = event.kind {
            turn_starts.push(Instant::now());
        }
    }
    let outcome = handle.outcome().await;
    let took = started.elapsed();
    assert_eq!(outcome.status, RunStatus::Done);
    assert!(events > turns * 10);
    (took, turn_starts)
}

/// µs per turn over turns `from..to` of a run, from the turn start times.
fn slice_cost(starts: &[Instant], from: usize, to: usize) -> f64 {
    starts[to].duration_since(starts[from]).as_secs_f64() * 1e6 / (to - from) as f64
}

fn measure(runtime: &tokio::runtime::Runtime, label: &str) {
    for turns in [10usize, 100, 1000] {
        let samples = match turns {
            10 => 200,
            100 => 40,
            _ => 10,
        };
        let template = script(turns);
        // Warm up allocator and caches.
        runtime.block_on(one_run(turns, template.clone()));
        let mut early = Vec::new();
        let mut middle = Vec::new();
        let mut late = Vec::new();
        let mut per_turn: Vec<f64> = (0..samples)
            .map(|_| {
                let script = template.clone();
                let (took, starts) = runtime.block_on(one_run(turns, script));
                if turns == 1000 {
                    early.push(slice_cost(&starts, 100, 200));
                    middle.push(slice_cost(&starts, 600, 700));
                    late.push(slice_cost(&starts, 900, 1000));
                }
                // turns + 1 model calls; the answer turn counts as a turn.
                took.as_secs_f64() * 1e6 / (turns + 1) as f64
            })
            .collect();
        per_turn.sort_by(|a, b| a.total_cmp(b));
        let median = per_turn[per_turn.len() / 2];
        let best = per_turn[0];
        println!(
            "{label:<14} {turns:>5} turns: {median:>7.2} µs/turn median, {best:>7.2} µs/turn best ({samples} runs)"
        );
        // Consumer-side timestamps are only meaningful when the run and the
        // consumer are on different threads; on one thread they arrive in bursts.
        if turns == 1000 && label == "multi_thread" {
            println!(
                "{label:<14}   within the 1000-turn run: turns 100-199 {:>6.2}, 600-699 {:>6.2}, 900-999 {:>6.2} µs/turn (medians)",
                median_of(&mut early),
                median_of(&mut middle),
                median_of(&mut late)
            );
        }
    }
}

fn median_of(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    // `cargo test --benches` runs this with --bench absent; keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("turns benchmark: run with `cargo bench -p loom --bench turns`");
        return;
    }
    // `cargo bench -p loom --bench turns -- current_thread` runs one runtime
    // only (for a profiler); no name runs both.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |label: &str| only.is_empty() || only.iter().any(|name| name == label);
    if !wanted("current_thread") && !wanted("multi_thread") {
        println!("no runtime named {only:?}: current_thread or multi_thread");
        return;
    }
    if wanted("current_thread") {
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        measure(&current, "current_thread");
    }
    if wanted("multi_thread") {
        let multi = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        measure(&multi, "multi_thread");
    }
}
