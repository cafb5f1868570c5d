//! The in-process fuzz runner (bench/fuzz/README.md): each target for a
//! given time or number of executions, on inputs mutated from its corpus
//! (and from what AFL++ found, when `bench/fuzz/run` left a queue), in one
//! process with no fork server — tens to hundreds of thousands of
//! executions a second. A panic is a crash; an execution over 5 s is a
//! hang; an allocation past `--mem` aborts the process. Each is kept in
//! `bench/fuzz/crashes/TARGET/` (which `cargo test -p loom-fuzz` replays)
//! and counted in the table printed at the end.
//!
//!   loom-fuzz [--secs N | --execs N] [--seed N] [--mem MB] [TARGET...]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use loom_fuzz::mutate::{mutate, Rng};
use loom_fuzz::{Target, TARGETS};

/// An execution longer than this is a hang.
const HANG: Duration = Duration::from_secs(5);
/// Crashes kept per target and run (the first of each message).
const KEPT: usize = 20;

/// The input being executed, for the hang watchdog and the abort handler.
static CURRENT: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Where the abort handler writes it (a C string, made before fuzzing).
static ABORT_FILE: Mutex<Option<std::ffi::CString>> = Mutex::new(None);
/// The last panic's message, taken by the loop.
static PANIC: Mutex<Option<String>> = Mutex::new(None);

struct Options {
    secs: Option<u64>,
    execs: Option<u64>,
    seed: u64,
    mem_mb: u64,
    targets: Vec<Target>,
}

fn options() -> Result<Options> {
    let mut options = Options {
        secs: None,
        execs: None,
        seed: 0x5eed,
        mem_mb: 4096,
        targets: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64> {
            args.next()
                .and_then(|value| value.parse().ok())
                .with_context(|| format!("{name} takes a whole number"))
        };
        match arg.as_str() {
            "--secs" => options.secs = Some(number("--secs")?),
            "--execs" => options.execs = Some(number("--execs")?),
            "--seed" => options.seed = number("--seed")?,
            "--mem" => options.mem_mb = number("--mem")?,
            "-h" | "--help" => {
                println!("loom-fuzz [--secs N | --execs N] [--seed N] [--mem MB] [TARGET...]");
                for target in TARGETS {
                    println!("  {:<18} {}", target.name, target.about);
                }
                std::process::exit(0);
            }
            name => match loom_fuzz::target(name) {
                Some(target) => options.targets.push(target),
                None => bail!("no target '{name}' (--help lists them)"),
            },
        }
    }
    if options.targets.is_empty() {
        options.targets = TARGETS.to_vec();
    }
    if options.secs.is_none() && options.execs.is_none() {
        options.secs = Some(60);
    }
    Ok(options)
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The seeds of `target`: its corpus, its crashes, and AFL++'s queue.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let base = fuzz_dir();
    let queue = base.join("../../target/fuzz-out").join(target).join("default/queue");
    let mut seeds = Vec::new();
    for dir in [
        base.join("corpus").join(target),
        base.join("crashes").join(target),
        queue,
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.path().is_file() {
                if let Ok(data) = std::fs::read(entry.path()) {
                    seeds.push(data);
                }
            }
        }
    }
    if seeds.is_empty() {
        seeds.push(Vec::new());
    }
    seeds
}

fn keep_crash(target: &str, input: &[u8]) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    input.hash(&mut hasher);
    let dir = fuzz_dir().join("crashes").join(target);
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{:016x}", hasher.finish()));
    let _ = std::fs::write(&path, input);
    path
}

/// Writes the current input where `ABORT_FILE` says, then dies of the
/// abort as it would have: a failed allocation past `--mem` aborts.
extern "C" fn on_abort(_: libc::c_int) {
    let (Ok(path), Ok(input)) = (ABORT_FILE.try_lock(), CURRENT.try_lock()) else {
        return;
    };
    if let Some(path) = path.as_ref() {
        // SAFETY: open/write/close are async-signal-safe; the path is a
        // valid C string made before fuzzing began, and the buffer is not
        // being changed (its lock is ours).
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
            if fd >= 0 {
                libc::write(fd, input.as_ptr().cast(), input.len());
                libc::close(fd);
            }
        }
    }
    // SAFETY: restoring the default action and raising it again ends the
    // process with the abort's own status.
    unsafe {
        libc::signal(libc::SIGABRT, libc::SIG_DFL);
        libc::raise(libc::SIGABRT);
    }
}

fn limit_memory(mb: u64) {
    let bytes = mb.saturating_mul(1024 * 1024);
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads the struct given; a failure leaves no limit,
    // which the table's peak memory column still shows.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &limit);
        libc::signal(libc::SIGABRT, on_abort as *const () as libc::sighandler_t);
    }
}

fn peak_rss_mb() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    (usage.ru_maxrss.max(0) as u64) / 1024
}

struct Outcome {
    execs: u64,
    secs: f64,
    crashes: u64,
    kept: Vec<(PathBuf, String)>,
}

fn fuzz(target: &Target, options: &Options, busy_since: &AtomicU64, busy: &AtomicBool, epoch: Instant) -> Outcome {
    let seeds = seeds(target.name);
    let mut rng = Rng::new(options.seed ^ (target.name.len() as u64) << 32);
    let started = Instant::now();
    let deadline = options.secs.map(|secs| started + Duration::from_secs(secs));
    let mut outcome = Outcome {
        execs: 0,
        secs: 0.0,
        crashes: 0,
        kept: Vec::new(),
    };
    let mut messages: Vec<String> = Vec::new();
    let mut input = Vec::new();
    loop {
        if options.execs.is_some_and(|limit| outcome.execs >= limit) {
            break;
        }
        // The clock is read once per 1024 executions.
        if outcome.execs % 1024 == 0 && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            break;
        }
        input.clear();
        input.extend_from_slice(&seeds[rng.below(seeds.len())]);
        let other = &seeds[rng.below(seeds.len())];
        // The first round plays every seed as it is.
        if outcome.execs >= seeds.len() as u64 {
            mutate(&mut rng, &mut input, other);
        }
        if let Ok(mut current) = CURRENT.lock() {
            current.clear();
            current.extend_from_slice(&input);
        }
        busy_since.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        busy.store(true, Ordering::Release);
        let result = std::panic::catch_unwind(|| (target.run)(&input));
        busy.store(false, Ordering::Release);
        outcome.execs += 1;
        if result.is_err() {
            outcome.crashes += 1;
            let message = PANIC
                .lock()
                .ok()
                .and_then(|mut last| last.take())
                .unwrap_or_else(|| "a panic without a message".into());
            // One kept input per distinct message (its first line).
            let key = message.lines().next().unwrap_or_default().to_string();
            if !messages.contains(&key) && outcome.kept.len() < KEPT {
                messages.push(key);
                let path = keep_crash(target.name, &input);
                outcome.kept.push((path, message));
            }
        }
    }
    outcome.secs = started.elapsed().as_secs_f64();
    outcome
}

fn main() -> Result<()> {
    let options = options()?;
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = PANIC.lock() {
            *last = Some(info.to_string());
        }
    }));
    let epoch = Instant::now();
    let busy_since = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicBool::new(false));
    let current_target: Arc<Mutex<&'static str>> = Arc::new(Mutex::new(""));
    {
        // The hang watchdog: an execution past `HANG` is kept and ends the run.
        let (busy_since, busy, current_target) = (busy_since.clone(), busy.clone(), current_target.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            let since = Duration::from_millis(busy_since.load(Ordering::Relaxed));
            if busy.load(Ordering::Acquire) && epoch.elapsed().saturating_sub(since) > HANG {
                let target = current_target.lock().map(|name| *name).unwrap_or("unknown");
                let input = CURRENT.lock().map(|input| input.clone()).unwrap_or_default();
                let path = keep_crash(target, &input);
                eprintln!("{target}: an execution took over {HANG:?}: kept as {}", path.display());
                std::process::exit(3);
            }
        });
    }
    limit_memory(options.mem_mb);
    println!(
        "{:<18} {:>14} {:>11} {:>8} {:>8} {:>8}",
        "target", "executions", "per sec", "seconds", "crashes", "peak MB"
    );
    let mut failed = false;
    for target in &options.targets {
        if let Ok(mut name) = current_target.lock() {
            *name = target.name;
        }
        let abort_file = fuzz_dir().join("crashes").join(target.name);
        let _ = std::fs::create_dir_all(&abort_file);
        let abort_file = abort_file.join("aborted-last-run");
        if let Ok(mut slot) = ABORT_FILE.lock() {
            *slot = Some(std::ffi::CString::new(
                abort_file.to_string_lossy().as_bytes().to_vec(),
            )?);
        }
        let outcome = fuzz(target, &options, &busy_since, &busy, epoch);
        println!(
            "{:<18} {:>14} {:>11.0} {:>8.0} {:>8} {:>8}",
            target.name,
            outcome.execs,
            outcome.execs as f64 / outcome.secs.max(1e-9),
            outcome.secs,
            outcome.crashes,
            peak_rss_mb()
        );
        for (path, message) in &outcome.kept {
            println!(
                "  kept {}: {}",
                path.display(),
                message.lines().next().unwrap_or_default()
            );
        }
        failed |= outcome.crashes > 0;
        // A target's folder without crashes is not kept.
        let _ = std::fs::remove_dir(fuzz_dir().join("crashes").join(target.name));
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
