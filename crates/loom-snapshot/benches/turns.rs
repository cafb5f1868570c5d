//! The cost of a snapshot per turn (bench/README.md, "Snapshots"): a
//! workspace of 10 000 files in 100 folders, 10 of them changed per turn;
//! each turn is scanned and recorded in a SQLite file. Prints the time per
//! turn (median and worst) and the storage each turn added beyond the bytes
//! it changed.
//!
//! `cargo bench -p loom-snapshot` (`-- --files N --changed M --turns T`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure ends it

use std::time::Instant;

use loom_snapshot::{Filter, Snapshots};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (files, changed, turns) = (arg("--files", 10_000), arg("--changed", 10), arg("--turns", 30));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    for i in 0..files {
        let folder = ws.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(format!("f{i}.txt")), format!("file {i}\n").repeat(40)).unwrap();
    }
    for watch in [true, false] {
        measure(
            &ws,
            &dir.path().join(format!("snapshots-{watch}.db")),
            watch,
            files,
            changed,
            turns,
        );
    }
}

/// Records step 0, then `turns` steps each after changing `changed` files,
/// as a run does; with or without the kernel's watches.
fn measure(ws: &std::path::Path, db: &std::path::Path, watch: bool, files: usize, changed: usize, turns: usize) {
    let mut store = Snapshots::open(ws, db, Filter::default()).unwrap();
    if !watch {
        store = store.without_watches();
    }
    let how = if watch {
        "with the kernel's watches"
    } else {
        "walking the whole workspace"
    };
    let started = Instant::now();
    store.record_now("run", 0, None).unwrap();
    println!(
        "{how}: first snapshot: {files} files, {:.1} ms, database {:.1} MB",
        started.elapsed().as_secs_f64() * 1e3,
        store.bytes_used().unwrap().unwrap_or(0) as f64 / 1e6
    );
    let mut times = Vec::new();
    let mut overheads = Vec::new();
    for turn in 1..=turns {
        let mut changed_bytes = 0u64;
        for k in 0..changed {
            let i = (turn * 997 + k * 101 + usize::from(watch) * 7) % files;
            let path = ws.join(format!("d{:03}/f{i}.txt", i % 100));
            let content = format!("turn {turn} ({watch}) changed file {i}\n").repeat(40);
            changed_bytes += content.len() as u64;
            std::fs::write(path, content).unwrap();
        }
        let before = store.bytes_used().unwrap().unwrap_or(0);
        let started = Instant::now();
        let recorded = store.record_now("run", turn as u32, None).unwrap();
        assert_eq!(recorded.changed.len(), changed);
        times.push(started.elapsed().as_secs_f64() * 1e3);
        overheads.push(store.bytes_used().unwrap().unwrap_or(0) as i64 - before as i64 - changed_bytes as i64);
    }
    times.sort_by(f64::total_cmp);
    overheads.sort_unstable();
    println!(
        "{how}: per turn ({turns} turns, {changed} files changed each): median {:.2} ms, worst {:.2} ms",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    println!(
        "{how}: storage per turn beyond the changed bytes: median {} bytes, worst {} bytes",
        overheads[overheads.len() / 2],
        overheads[overheads.len() - 1]
    );
    // One large text file changed: its cost is reading, hashing and
    // checking it for secrets (Loom's redaction patterns).
    let large = ws.join(format!("large-{watch}.txt"));
    std::fs::write(
        &large,
        "let total = items.iter().map(|item| item.price).sum::<u64>();\n".repeat(16_000),
    )
    .unwrap();
    let started = Instant::now();
    store.record_now("run", turns as u32 + 1, None).unwrap();
    println!(
        "{how}: a step that changed one 1 MB text file: {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}
