//! Long runs over HTTP, as a user runs them: the `loom` binary against a
//! local fake OpenAI-compatible server, for 50, 200 and 400 tool turns
//! (each a `read_file` of a few lines, then one answer), with the default
//! store. Prints, per run length (median of several runs):
//!
//! - Loom's own CPU per turn (user + system time of the `loom` process,
//!   from `wait4`), and its peak resident memory (`VmHWM` of the process,
//!   read from `/proc` while it runs: a child's `ru_maxrss` would start at
//!   this process's size, which it inherits through fork/exec);
//! - the fake server's CPU per turn (this process's CPU over the run: the
//!   server threads parse every request body and write every answer, and
//!   nothing else here works meanwhile), as a yardstick of what the growing
//!   request costs anyone who reads it;
//! - the wall time of the run.
//!
//! The goal: Loom's CPU per turn at 400 turns within 1.5× of its CPU per
//! turn at 50, below the fake server's own, and peak memory under 25 MB.
//!
//!     cargo bench -p loom-cli --bench long_run
//!
//! `LOOM_BIN=/path/to/loom` measures another build of the binary (e.g. an
//! older commit, for a before/after comparison on one machine).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loom_testkit::{openai_text, openai_tool_calls_with_usage, FakeServer, Reply};

const LENGTHS: [usize; 3] = [50, 200, 400];
const SAMPLES: usize = 5;
/// Lines of the file the model reads from.
const FILE_LINES: usize = 200;
/// Lines per read.
const READ_LINES: usize = 6;

struct Sample {
    loom_cpu: Duration,
    loom_peak_kb: u64,
    server_cpu: Duration,
    wall: Duration,
}

fn main() {
    // `cargo test --benches` runs this without --bench; keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("long_run benchmark: run with `cargo bench -p loom-cli --bench long_run`");
        return;
    }
    let loom = std::env::var_os("LOOM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_loom")));
    println!("binary: {}", loom.display());
    println!(
        "{:>6}  {:>16}  {:>14}  {:>18}  {:>9}",
        "turns", "loom CPU/turn", "loom peak RSS", "server CPU/turn", "wall"
    );
    // A run that answers at once: the fixed cost (process start, runtime,
    // store, first request) that every run length below shares.
    let mut startup: Vec<Sample> = (0..SAMPLES).map(|_| one_run(&loom, 0)).collect();
    startup.sort_by_key(|s| s.loom_cpu);
    let fixed = startup[SAMPLES / 2].loom_cpu;
    println!(
        "{:>6}  {:>13.3} ms  {:>11.1} MB  (a run that answers at once: the fixed cost, in the figures below)",
        0,
        fixed.as_secs_f64() * 1e3,
        startup.iter().map(|s| s.loom_peak_kb).max().unwrap_or(0) as f64 / 1024.0
    );
    let mut per_turn_at = Vec::new();
    for turns in LENGTHS {
        // One warm-up run (page cache, allocator), then the samples.
        one_run(&loom, turns);
        let mut samples: Vec<Sample> = (0..SAMPLES).map(|_| one_run(&loom, turns)).collect();
        let per_turn = |d: Duration| d.as_secs_f64() * 1e3 / turns as f64;
        samples.sort_by_key(|s| s.loom_cpu);
        let loom_cpu = per_turn(samples[SAMPLES / 2].loom_cpu);
        let loom_cpu_net = per_turn(samples[SAMPLES / 2].loom_cpu.saturating_sub(fixed));
        let peak_mb = samples.iter().map(|s| s.loom_peak_kb).max().unwrap_or(0) as f64 / 1024.0;
        samples.sort_by_key(|s| s.server_cpu);
        let server_cpu = per_turn(samples[SAMPLES / 2].server_cpu);
        samples.sort_by_key(|s| s.wall);
        let wall = samples[SAMPLES / 2].wall.as_secs_f64();
        println!(
            "{turns:>6}  {loom_cpu:>13.3} ms  {peak_mb:>11.1} MB  {server_cpu:>15.3} ms  {wall:>7.2} s   ({loom_cpu_net:.3} ms/turn without the fixed cost)"
        );
        per_turn_at.push((turns, loom_cpu, loom_cpu_net));
    }
    if let (Some((_, first, first_net)), Some((last_turns, last, last_net))) = (per_turn_at.first(), per_turn_at.last())
    {
        println!(
            "loom CPU per turn at {last_turns} turns / at {} turns: {:.2}× ({:.2}× without the fixed cost)",
            LENGTHS[0],
            last / first,
            last_net / first_net
        );
    }
}

fn one_run(loom: &Path, turns: usize) -> Sample {
    let dir = tempfile::tempdir().expect("tempdir");
    let text: String = (1..=FILE_LINES)
        .map(|n| format!("line {n}: the quick brown fox jumps over the lazy dog, again and again.\n"))
        .collect();
    std::fs::write(dir.path().join("notes.txt"), text).expect("write notes");

    let mut replies: Vec<Reply> = (0..turns)
        .map(|i| {
            // Every read is a different slice, so the monitor sees progress.
            let args = format!(
                r#"{{"path": "notes.txt", "offset": {}, "limit": {READ_LINES}}}"#,
                (i * READ_LINES) % (FILE_LINES - READ_LINES) + 1
            );
            // Token counts as a real server reports them: the prompt grows
            // by about 140 tokens a turn (a call and a six-line result).
            let prompt = 800 + 140 * i as u64;
            Reply::Sse(openai_tool_calls_with_usage(
                &[(&format!("call_{i}"), "read_file", &args)],
                prompt,
                30,
            ))
        })
        .collect();
    replies.push(Reply::Sse(openai_text("I read the notes.", 8)));
    let server = FakeServer::start_counting(replies);

    let before = self_cpu();
    let started = Instant::now();
    // Reaped by `wait4` below, which also gives its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(loom)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("LOOM_MODEL")
        .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
        .args(["run", "--model", "openai:fake", "--timeout", "0", "--workspace"])
        .arg(dir.path())
        .arg("--max-steps")
        .arg((turns + 1).to_string())
        .arg("--base-url")
        .arg(server.url())
        .arg("read the notes, a few lines at a time")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start loom");
    let pid = child.id();
    let peak = std::thread::spawn(move || peak_rss_kb(pid));
    wait_exited(pid);
    let peak_kb = peak.join().expect("peak reader");
    let (status, usage) = wait4(pid);
    let wall = started.elapsed();
    let server_cpu = self_cpu().saturating_sub(before);
    assert_eq!(status, 0, "loom run failed ({turns} turns)");
    assert_eq!(server.request_count(), turns + 1, "one request per turn");
    drop(server);
    Sample {
        loom_cpu: cpu(&usage),
        loom_peak_kb: peak_kb,
        server_cpu,
        wall,
    }
}

/// The highest `VmHWM` of `pid` until it exits (a zombie has none).
fn peak_rss_kb(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let mut peak = 0;
    loop {
        let Some(hwm) = std::fs::read_to_string(&path).ok().and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        }) else {
            return peak;
        };
        peak = peak.max(hwm);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `pid` has exited, leaving it unreaped (so its pid cannot be
/// reused while its `/proc` entry is still being read).
fn wait_exited(pid: u32) {
    // SAFETY: waitid only writes to `info`, which lives for the call.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let done = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
    assert_eq!(done, 0, "waitid: {}", std::io::Error::last_os_error());
}

/// Reaps `pid` and returns its exit code and resource usage.
fn wait4(pid: u32) -> (i32, libc::rusage) {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 only writes to the two
    // pointers, which live for the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, usage)
}

/// This process's user + system CPU so far.
fn self_cpu() -> Duration {
    // SAFETY: as in `wait4`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    cpu(&usage)
}

fn cpu(usage: &libc::rusage) -> Duration {
    let time = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    time(usage.ru_utime) + time(usage.ru_stime)
}
