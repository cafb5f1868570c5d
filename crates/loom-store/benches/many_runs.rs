//! The store under many runs at once, alone (no gateway, no model): each
//! run appends its events as a streaming run does (a few at a time, a
//! write in flight at most) and checkpoints every few writes. Prints how
//! long a write waits (p50/p99) and the writes per second, for 100 and
//! 1 000 runs — what the load harness's event latency is made of.
//!
//!     cargo bench -p loom-store --bench many_runs

#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed unwrap is a failed bench

use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{Checkpoint, Event, EventKind, Message, RunLog, RunRecord, RunState, RunStatus, TurnState};
use loom_store::SqliteStore;

/// Writes of events per run.
const WRITES: usize = 48;
/// A checkpoint after every this many writes.
const CHECKPOINT_EVERY: usize = 6;

fn event(run_id: &str, seq: u64) -> Event {
    Event {
        run_id: run_id.into(),
        turn_id: "turn-1".into(),
        parent_turn_id: None,
        depth: 0,
        parent_run_id: None,
        seq,
        ts: "2026-11-26T00:00:00.000Z".into(),
        kind: EventKind::LlmDelta {
            text: "a streamed piece of the answer".into(),
        },
    }
}

async fn one_run(store: Arc<SqliteStore>, run_id: String, waits: Arc<std::sync::Mutex<Vec<Duration>>>) {
    let state = RunState::new(TurnState::initial(100_000), "bench");
    let mut seq = 0;
    let mut mine = Vec::with_capacity(WRITES * 2);
    for write in 0..WRITES {
        let events: Vec<Event> = (0..2)
            .map(|_| {
                seq += 1;
                event(&run_id, seq)
            })
            .collect();
        let started = Instant::now();
        store.append_events(&run_id, &events).await.unwrap();
        mine.push(started.elapsed());
        if write % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 {
            let messages = [Message::assistant("Let me look at the next file.")];
            let started = Instant::now();
            store
                .checkpoint(&Checkpoint {
                    run_id: &run_id,
                    state: &state,
                    new_messages: &messages,
                    replaced_history: None,
                    events: &[],
                })
                .await
                .unwrap();
            mine.push(started.elapsed());
        }
        // A model streams: the next events come a moment later.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    waits.lock().unwrap().extend(mine);
}

/// Bytes this process has handed to `write` so far (`wchar` of
/// /proc/self/io; 0 where there is none).
fn bytes_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("wchar: ").and_then(|n| n.trim().parse().ok()))
        })
        .unwrap_or(0)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("many-runs benchmark: run with `cargo bench -p loom-store --bench many_runs`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for runs in [100, 1000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).expect("store"));
        let waits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let written_before = bytes_written();
        let elapsed = runtime.block_on(async {
            for i in 0..runs {
                let record = RunRecord::new(format!("run-{i}"), "s", "bench", "scripted:x", RunStatus::Running, 1);
                store.create_run(&record).await.unwrap();
            }
            let started = Instant::now();
            let tasks: Vec<_> = (0..runs)
                .map(|i| tokio::spawn(one_run(store.clone(), format!("run-{i}"), waits.clone())))
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            started.elapsed()
        });
        let written = bytes_written().saturating_sub(written_before);
        let mut waits = waits.lock().unwrap().clone();
        waits.sort();
        let at = |q: f64| waits[((waits.len() as f64 * q) as usize).min(waits.len() - 1)].as_secs_f64() * 1e3;
        println!(
            "{runs} runs: {} writes in {:.2} s ({:.0}/s); a write waits p50 {:.2} ms, p99 {:.2} ms; {:.1} KB written per write (log and database)",
            waits.len(),
            elapsed.as_secs_f64(),
            waits.len() as f64 / elapsed.as_secs_f64(),
            at(0.5),
            at(0.99),
            written as f64 / waits.len() as f64 / 1024.0
        );
    }
}
