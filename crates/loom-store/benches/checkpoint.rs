//! Checkpoint cost per turn with SQLite in WAL mode, and the size on disk
//! per turn: a typical turn (an assistant message with a tool call, its
//! result, a guidance message, 15 events, the metrics) written 2000 times;
//! then whole runs of 200 turns with and without a store.
//!
//!     cargo bench -p loom-store --bench checkpoint

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{
    Agent, Checkpoint, Event, EventKind, Message, MonitorConfig, Phase, RunLog, RunMetrics, RunRecord, RunState,
    RunStatus, Store, ToolCall, ToolResult, ToolStatus, TurnState,
};
use loom_llm::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom_store::SqliteStore;
use loom_testkit::NoopTool;
use serde_json::json;

const TURNS: usize = 2000;

fn turn_messages(turn: usize) -> Vec<Message> {
    let id = format!("call_{turn}");
    vec![
        Message::Assistant {
            content: "Let me check the next file.".into(),
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: "read_file".into(),
                arguments: json!({"path": format!("src/module_{turn}.rs")}),
            }],
        },
        Message::tool(
            id,
            "read_file",
            "     1\tfn main() {\n     2\t    println!(\"hello\");\n     3\t}\n".repeat(3),
        ),
        Message::system("Continue with the task: refactor the modules\n\nProgress so far: 30%"),
    ]
}

fn turn_events(turn: usize) -> Vec<Event> {
    (0..15)
        .map(|i| Event {
            run_id: "bench".into(),
            turn_id: format!("turn-{turn}").into(),
            parent_turn_id: None,
            depth: 0,
            parent_run_id: None,
            seq: (turn * 15 + i + 1) as u64,
            ts: "2026-11-22T05:00:00.000Z".into(),
            kind: EventKind::PhaseStart { phase: Phase::Llm },
        })
        .collect()
}

fn file_size(path: &std::path::Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(format!("{}{suffix}", path.display())).ok())
        .map(|m| m.len())
        .sum()
}

async fn whole_run(store: Option<Arc<dyn Store>>, turns: usize) -> Duration {
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
    let mut builder = Agent::builder()
        .model(ScriptedModel::new(script).check_history(false))
        .tool(NoopTool::serial())
        .monitor(MonitorConfig {
            duplicate_threshold: u32::MAX,
            ..MonitorConfig::default()
        })
        .max_steps(turns as u32 + 1);
    if let Some(store) = store {
        builder = builder.store(store);
    }
    let agent = builder.build().expect("agent");
    let started = Instant::now();
    let outcome = agent.run("bench").outcome().await;
    assert_eq!(outcome.status, RunStatus::Done);
    started.elapsed()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("checkpoint benchmark: run with `cargo bench -p loom-store --bench checkpoint`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("loom.db");
    let store = SqliteStore::open(&path).expect("store");
    let empty = file_size(&path);
    let mut times = Vec::with_capacity(TURNS);
    runtime.block_on(async {
        store
            .create_run(&RunRecord {
                owner: "bench".into(),
                ..RunRecord::new(
                    "bench",
                    "bench",
                    "refactor the modules",
                    "scripted:bench",
                    RunStatus::Queued,
                    0,
                )
            })
            .await
            .expect("run");
        let mut state = TurnState::initial(100_000);
        let metrics = RunMetrics::default();
        for turn in 0..TURNS {
            let messages = turn_messages(turn);
            let events = turn_events(turn);
            state = state.next_turn(false);
            // What a run checkpoints: its whole state (the turn, steps, mode,
            // monitor, …) with its metrics.
            let run_state = RunState::new(state.clone(), "refactor the modules").with_metrics(metrics.clone());
            let started = Instant::now();
            store
                .checkpoint(&Checkpoint {
                    run_id: "bench",
                    state: &run_state,
                    new_messages: &messages,
                    replaced_history: None,
                    events: &events,
                })
                .await
                .expect("checkpoint");
            times.push(started.elapsed());
        }
    });
    // A side-effecting call's journal rows: the intent (synced to disk)
    // before it runs, the result after.
    let mut intents = Vec::with_capacity(200);
    let mut results = Vec::with_capacity(200);
    runtime.block_on(async {
        for index in 0..200 {
            let call = ToolCall {
                id: format!("call_{index}"),
                name: "write_file".into(),
                arguments: json!({"path": "a.txt", "content": "x"}),
            };
            let started = Instant::now();
            store.journal_intent("bench", &call).await.expect("intent");
            intents.push(started.elapsed());
            let result = ToolResult::new(&call.id, "write_file", ToolStatus::Success, "Created 'a.txt'");
            let started = Instant::now();
            store.journal_result("bench", &result).await.expect("result");
            results.push(started.elapsed());
        }
    });
    intents.sort();
    results.sort();

    // What a resume reads first: the whole run back from the database.
    let mut loads: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let snapshot = runtime.block_on(store.load_run("bench")).expect("load");
            assert_eq!(snapshot.messages.len(), TURNS * 3);
            started.elapsed()
        })
        .collect();
    loads.sort();
    let size = file_size(&path) - empty;
    times.sort();
    println!(
        "checkpoint (3 messages, 15 events, WAL, synchronous=NORMAL): {:.0} µs median, {:.0} µs p90 per turn ({TURNS} turns)",
        times[TURNS / 2].as_secs_f64() * 1e6,
        times[TURNS * 9 / 10].as_secs_f64() * 1e6
    );
    println!(
        "size on disk: {:.2} KB per turn (database + WAL after {TURNS} turns)",
        size as f64 / 1024.0 / TURNS as f64
    );

    println!(
        "journal per side-effecting call: intent {:.0} µs median (synchronous=FULL, fsync), result {:.0} µs median",
        intents[100].as_secs_f64() * 1e6,
        results[100].as_secs_f64() * 1e6
    );
    println!(
        "loading the {TURNS}-turn run for a resume (history, journal, last seq): {:.1} ms (median of 5)",
        loads[2].as_secs_f64() * 1e3
    );

    const RUN_TURNS: usize = 200;
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("loom.db")).expect("store"));
        with.push(runtime.block_on(whole_run(Some(store), RUN_TURNS)));
        without.push(runtime.block_on(whole_run(None, RUN_TURNS)));
    }
    with.sort();
    without.sort();
    let per_turn = |d: Duration| d.as_secs_f64() * 1e6 / (RUN_TURNS + 1) as f64;
    println!(
        "whole runs of {RUN_TURNS} turns: {:.1} µs/turn with the store, {:.1} µs/turn without (medians of 5)",
        per_turn(with[2]),
        per_turn(without[2])
    );
}
