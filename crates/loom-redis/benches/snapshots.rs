//! The cost of a snapshot per turn kept in Redis (bench/README.md,
//! "Snapshots per turn"): the same workspace as loom-snapshot's bench —
//! 10 000 files in 100 folders, 10 changed per turn — recorded into a real
//! `redis-server` on loopback (started here, append-only with `fsync`
//! always, as docs/cluster.md advises). Prints the time per turn (median
//! and worst) and Redis's memory each turn added beyond the bytes it
//! changed.
//!
//! `cargo bench -p loom-redis --bench snapshots` (`-- --files N --changed M --turns T`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure ends it

use std::time::Instant;

use loom_redis::RedisSnapshots;
use loom_snapshot::{Filter, Snapshots};
use loom_testkit::redis_server::RedisServer;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Redis's `used_memory`.
fn memory(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap()
}

fn main() {
    let (files, changed, turns) = (arg("--files", 10_000), arg("--changed", 10), arg("--turns", 30));
    let dir = tempfile::tempdir().unwrap();
    let redis_dir = dir.path().join("redis");
    std::fs::create_dir_all(&redis_dir).unwrap();
    let server = RedisServer::start(&redis_dir).unwrap_or_else(|err| panic!("{err}"));
    let ws = dir.path().join("ws");
    for i in 0..files {
        let folder = ws.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(format!("f{i}.txt")), format!("file {i}\n").repeat(40)).unwrap();
    }
    let mut conn = redis::Client::open(server.url(0)).unwrap().get_connection().unwrap();
    let store = RedisSnapshots::new(&server.url(0), "loom:").unwrap();
    let snapshots = Snapshots::open_in(&ws, Box::new(store), &dir.path().join("lock"), Filter::default()).unwrap();
    let started = Instant::now();
    snapshots.record_now("run", 0, None).unwrap();
    println!(
        "redis: first snapshot: {files} files, {:.1} ms, Redis memory {:.1} MB",
        started.elapsed().as_secs_f64() * 1e3,
        memory(&mut conn) as f64 / 1e6
    );
    let mut times = Vec::new();
    let mut overheads = Vec::new();
    for turn in 1..=turns {
        let mut changed_bytes = 0i64;
        for k in 0..changed {
            let i = (turn * 997 + k * 101) % files;
            let content = format!("turn {turn} changed file {i}\n").repeat(40);
            changed_bytes += content.len() as i64;
            std::fs::write(ws.join(format!("d{:03}/f{i}.txt", i % 100)), content).unwrap();
        }
        let before = memory(&mut conn);
        let started = Instant::now();
        let recorded = snapshots.record_now("run", turn as u32, None).unwrap();
        assert_eq!(recorded.changed.len(), changed);
        times.push(started.elapsed().as_secs_f64() * 1e3);
        overheads.push(memory(&mut conn) - before - changed_bytes);
    }
    times.sort_by(f64::total_cmp);
    overheads.sort_unstable();
    println!(
        "redis: per turn ({turns} turns, {changed} files changed each): median {:.2} ms, worst {:.2} ms",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    println!(
        "redis: memory per turn beyond the changed bytes: median {} bytes, worst {} bytes",
        overheads[overheads.len() / 2],
        overheads[overheads.len() - 1]
    );
}
