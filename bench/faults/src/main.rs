//! The fault campaign (bench/faults/README.md): under load, faults injected
//! into the model (500, 429 with `Retry-After`, a reset mid-stream, a
//! truncated stream, garbage, a stall), the database (held by another
//! process past the busy timeout; damaged at start), the disk (full while
//! SQLite writes), Redis (paused; killed and restarted from its
//! append-only file; partitioned away) and the wall clock (jumping). For
//! each it prints what the runs did: ended DONE, ended with a typed error,
//! never ended (lost), a side effect that ran twice, a panic in the
//! gateway's log, and whether a run after the fault ends DONE. It fails (status 1) on a lost run, an untyped error, a
//! repeated effect, a panic or no recovery.
//!
//!   loom-faults [--smoke] [--runs N] [--loom PATH] [SCENARIO...]
//!
//! `--smoke` (CI): at most 12 runs, 2 s stalls, five scenarios.

mod gateway;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use gateway::{prompt, repeated_effects, start, write_config, Gateway};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::{Fault, FaultPlan};
use loom_testkit::{PromptModel, PromptModelOptions};

const SCENARIOS: [&str; 8] = [
    "provider",
    "db_locked",
    "db_corrupt",
    "disk_full",
    "redis_pause",
    "redis_kill",
    "clock_jump",
    "redis_partition",
];

/// Debian's libfaketime (package `faketime`): the wall clock a process
/// reads, moved by writing an offset into a file.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

struct Options {
    runs: usize,
    smoke: bool,
    loom: PathBuf,
    scenarios: Vec<String>,
}

/// One scenario's line of the table.
#[derive(Default)]
struct Row {
    fault: String,
    runs: usize,
    done: usize,
    typed_errors: usize,
    untyped: usize,
    not_ended: usize,
    repeated: usize,
    panics: usize,
    recovered: bool,
    /// The fault reached the runs (a fault injected, a run taken back, a
    /// start refused): a scenario whose fault missed proves nothing.
    hit: bool,
    /// Runs may end with a typed error (the model failing: a call the
    /// retries cannot save). Elsewhere every run must end DONE: the
    /// gateway takes back the runs its store failed under.
    errors_expected: bool,
    /// Not run here (what it needs is missing).
    skipped: bool,
    notes: String,
}

impl Row {
    fn failed(&self) -> bool {
        !self.skipped
            && (self.untyped > 0
                || self.not_ended > 0
                || self.repeated > 0
                || self.panics > 0
                || !self.recovered
                || !self.hit
                || (self.typed_errors > 0 && !self.errors_expected))
    }
}

/// What a batch of runs came to.
async fn tally(gateway: &Gateway, row: &mut Row, ids: &[String], patience: Duration) -> Vec<String> {
    let mut codes = Vec::new();
    for (id, status) in gateway.wait_all(ids, patience).await {
        match status.as_str() {
            "DONE" => row.done += 1,
            "ERROR" | "TIMEOUT" | "CANCELED" => match gateway.error_code(&id).await {
                Some(code) => {
                    row.typed_errors += 1;
                    codes.push(format!("{status}:{code}"));
                }
                None => {
                    row.untyped += 1;
                    codes.push(format!("{status}:no code"));
                    if std::env::var_os("LOOM_FAULTS_DEBUG").is_some() {
                        eprintln!(
                            "{id}: {status} without an error event:\n{}",
                            gateway.events_text(&id).await
                        );
                    }
                }
            },
            other => {
                row.not_ended += 1;
                codes.push(format!("still {other}"));
            }
        }
    }
    codes.sort();
    codes
}

/// `codes` counted: `A×3 B×1`.
fn counted(codes: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut index = 0;
    while index < codes.len() {
        let same = codes[index..].iter().take_while(|code| **code == codes[index]).count();
        out.push(format!("{}×{same}", codes[index]));
        index += same;
    }
    out.join(" ")
}

async fn submit_all(
    gateway: &Gateway,
    tags: impl Iterator<Item = String>,
    steps: usize,
    more: &str,
) -> (Vec<String>, Vec<String>) {
    let (mut ids, mut refused) = (Vec::new(), Vec::new());
    for tag in tags {
        match gateway.submit(&prompt(&tag, steps, more)).await {
            Ok(id) => ids.push(id),
            Err(code) => refused.push(code),
        }
    }
    (ids, refused)
}

/// A run after the fault is over ends DONE.
async fn recovers(gateway: &Gateway) -> bool {
    match gateway.submit(&prompt("after", 1, "")).await {
        Ok(id) => gateway
            .wait_all(&[id], Duration::from_secs(60))
            .await
            .first()
            .is_some_and(|(_, status)| status == "DONE"),
        Err(_) => false,
    }
}

async fn provider(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    let stall = if options.smoke {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(30)
    };
    let model = PromptModel::start(PromptModelOptions {
        faults: Some(FaultPlan {
            every: 3,
            kinds: vec![
                Fault::ServerError,
                Fault::RateLimited,
                Fault::ResetMidStream,
                Fault::Truncated,
                Fault::Garbage,
                Fault::Stall,
            ],
            stall,
        }),
        ..PromptModelOptions::default()
    });
    write_config(dir, &model.url(), "")?;
    let gateway = start(&options.loom, dir, state, &[])?;
    let mut row = Row {
        fault: format!(
            "model: every 3rd call 500 / 429 / reset / truncated / garbage / {}s stall",
            stall.as_secs()
        ),
        runs: options.runs,
        ..Row::default()
    };
    let (ids, refused) = submit_all(&gateway, (0..options.runs).map(|n| format!("p{n}")), 2, "").await;
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(240)).await;
    model.set_faults(None);
    row.recovered = recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    row.not_ended += refused.len();
    row.hit = model.faults_injected() > 0;
    row.errors_expected = true;
    row.notes = format!("{} faults injected; {}", model.faults_injected(), counted(&codes));
    Ok(row)
}

async fn db_locked(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(200),
        ..PromptModelOptions::default()
    });
    write_config(dir, &model.url(), "")?;
    let db = dir.join("loom.db");
    let gateway = start(&options.loom, dir, state, &["--db", &db.to_string_lossy()])?;
    let mut row = Row {
        fault: "database held by another process for 7 s (busy timeout 5 s)".into(),
        runs: options.runs,
        ..Row::default()
    };
    let (mut ids, _) = submit_all(&gateway, (0..options.runs / 2).map(|n| format!("l{n}")), 3, "").await;
    // Another process takes the write lock while the runs write.
    let held = db.clone();
    let holder = std::thread::spawn(move || -> Result<()> {
        let connection = rusqlite::Connection::open(&held)?;
        connection.execute_batch("BEGIN IMMEDIATE")?;
        std::thread::sleep(Duration::from_secs(7));
        connection.execute_batch("COMMIT")?;
        Ok(())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (more, refused) = submit_all(
        &gateway,
        (options.runs / 2..options.runs).map(|n| format!("l{n}")),
        3,
        "",
    )
    .await;
    ids.extend(more);
    holder.join().map_err(|_| anyhow!("the lock holder failed"))??;
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(120)).await;
    row.recovered = recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    // A start refused while the database was held is answered, not lost.
    let unavailable = refused.iter().filter(|code| *code == "UNAVAILABLE").count();
    row.untyped += refused.len() - unavailable;
    row.hit = unavailable > 0 || gateway.took_back() > 0;
    row.runs = ids.len() + refused.len();
    row.notes = format!(
        "{unavailable} starts refused UNAVAILABLE while held; {} runs interrupted and taken back; {}",
        gateway.took_back(),
        counted(&codes)
    );
    Ok(row)
}

async fn db_corrupt(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    let model = PromptModel::start(PromptModelOptions::default());
    write_config(dir, &model.url(), "")?;
    let db = dir.join("loom.db");
    let garbage: Vec<u8> = (0..65536u32)
        .map(|n| (n.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&db, garbage)?;
    let mut row = Row {
        fault: "database file damaged before start".into(),
        runs: 0,
        ..Row::default()
    };
    let refused = match start(&options.loom, dir, state, &["--db", &db.to_string_lossy()]) {
        Ok(_) => bail!("loom serve started on a damaged database"),
        Err(err) => err.to_string(),
    };
    row.panics = refused.lines().filter(|line| line.contains("panicked")).count();
    row.hit = true;
    let said = refused
        .lines()
        .find(|line| line.contains("error"))
        .unwrap_or("(no error line)")
        .trim()
        .chars()
        .take(120)
        .collect::<String>();
    // The operator moves the damaged file away; the next start is clean.
    std::fs::rename(&db, dir.join("loom.db.damaged"))?;
    let gateway = start(&options.loom, dir, state, &["--db", &db.to_string_lossy()])?;
    row.recovered = recovers(&gateway).await;
    row.panics += gateway.panics();
    row.notes = format!("refused to start: {said}");
    Ok(row)
}

async fn disk_full(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk)?;
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&disk)
        .status()
        .is_ok_and(|status| status.success());
    if !mounted {
        return Ok(Row {
            fault: "disk full while SQLite writes: skipped (mounting a tmpfs needs root)".into(),
            skipped: true,
            ..Row::default()
        });
    }
    let result = disk_full_on(options, dir, state, &disk).await;
    let _ = std::process::Command::new("umount").arg(&disk).status();
    result
}

async fn disk_full_on(options: &Options, dir: &Path, state: &Path, disk: &Path) -> Result<Row> {
    let model = PromptModel::start(PromptModelOptions::default());
    write_config(dir, &model.url(), "")?;
    let db = disk.join("loom.db");
    let gateway = start(&options.loom, dir, state, &["--db", &db.to_string_lossy()])?;
    // All but about 400 KB taken: a few runs fit, the rest meet a full disk.
    let filler = disk.join("filler");
    let free = 8 * 1024 * 1024 - std::fs::metadata(&db).map_or(0, |meta| meta.len()) - 400 * 1024;
    let _ = std::fs::write(&filler, vec![0u8; free as usize]);
    let mut row = Row {
        fault: "disk full while SQLite writes (an 8 MB tmpfs, filled)".into(),
        runs: options.runs,
        ..Row::default()
    };
    let (ids, refused) = submit_all(&gateway, (0..options.runs).map(|n| format!("d{n}")), 2, "long=40").await;
    // The disk stays full a while, then space comes back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let healthy = gateway.healthy().await;
    std::fs::remove_file(&filler)?;
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(120)).await;
    row.recovered = healthy && recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    row.runs = ids.len() + refused.len();
    let typed_refusals = refused
        .iter()
        .filter(|code| *code != "UNTYPED" && !code.starts_with("no "))
        .count();
    row.untyped += refused.len() - typed_refusals;
    row.hit = !refused.is_empty() || gateway.took_back() > 0;
    row.notes = format!(
        "{} starts refused ({}); {} runs interrupted and taken back; {}",
        refused.len(),
        counted(&{
            let mut refused = refused.clone();
            refused.sort();
            refused
        }),
        gateway.took_back(),
        counted(&codes)
    );
    Ok(row)
}

async fn redis(options: &Options, dir: &Path, state: &Path, kill: bool) -> Result<Row> {
    let mut redis = RedisServer::start(state).map_err(|err| anyhow!("{err}"))?;
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(300),
        ..PromptModelOptions::default()
    });
    write_config(
        dir,
        &model.url(),
        &format!("[cluster]\nredis = \"{}\"\nexecute = true\n", redis.url(0)),
    )?;
    let gateway = start(&options.loom, dir, state, &[])?;
    let mut row = Row {
        fault: if kill {
            "Redis SIGKILLed under load, restarted from its append-only file after 2 s".into()
        } else {
            "Redis paused (SIGSTOP) for 5 s under load".into()
        },
        runs: options.runs,
        ..Row::default()
    };
    let (ids, refused) = submit_all(&gateway, (0..options.runs).map(|n| format!("r{n}")), 3, "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    if kill {
        redis.kill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        redis.restart().map_err(|err| anyhow!("{err}"))?;
    } else {
        let pid = redis.pid().to_string();
        std::process::Command::new("kill").args(["-STOP", &pid]).status()?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        std::process::Command::new("kill").args(["-CONT", &pid]).status()?;
    }
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(180)).await;
    row.recovered = recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    row.not_ended += refused.len();
    // A pause shorter than every timeout may interrupt nothing: it is hit
    // when the runs waited through it (they were running when it came).
    row.hit = if kill { gateway.took_back() > 0 } else { !ids.is_empty() };
    row.notes = format!(
        "{} runs interrupted and taken back; {}",
        gateway.took_back(),
        counted(&codes)
    );
    Ok(row)
}

/// The gateway's wall clock jumps under load: an hour back, then a day
/// forward, then back to now, while runs write. Its monotonic clock (what
/// timeouts and leases measure) goes on, as on a machine whose clock is
/// set by hand or by NTP.
async fn clock_jump(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    if !Path::new(FAKETIME).exists() {
        return Ok(Row {
            fault: "the clock jumping: skipped (apt-get install faketime)".into(),
            skipped: true,
            ..Row::default()
        });
    }
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(300),
        ..PromptModelOptions::default()
    });
    write_config(dir, &model.url(), "")?;
    let offset = dir.join("clock-offset");
    std::fs::write(&offset, "+0")?;
    let env = [
        ("LD_PRELOAD", FAKETIME.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset.to_string_lossy().into_owned()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ];
    let gateway = gateway::start_with(&options.loom, dir, state, &[], &env)?;
    let mut row = Row {
        fault: "the wall clock jumps an hour back, then a day forward, then back, under load".into(),
        runs: options.runs,
        ..Row::default()
    };
    let (mut ids, mut refused) = submit_all(&gateway, (0..options.runs / 2).map(|n| format!("c{n}")), 3, "").await;
    for jump in ["-3600", "+86400", "+0"] {
        tokio::time::sleep(Duration::from_millis(700)).await;
        std::fs::write(&offset, jump)?;
    }
    let (more, more_refused) = submit_all(
        &gateway,
        (options.runs / 2..options.runs).map(|n| format!("c{n}")),
        3,
        "",
    )
    .await;
    ids.extend(more);
    refused.extend(more_refused);
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(120)).await;
    row.recovered = recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    row.not_ended += refused.len();
    // The jumps came while runs were executing.
    row.hit = !ids.is_empty();
    row.notes = counted(&codes);
    Ok(row)
}

/// A network namespace holding a Redis, reached from here over a veth
/// pair; removed (and its Redis killed) on drop.
struct Partitioned {
    namespace: String,
    link: String,
    redis: Option<std::process::Child>,
}

impl Partitioned {
    const HERE: &'static str = "10.77.9.1";
    const THERE: &'static str = "10.77.9.2";
    const PORT: u16 = 6399;

    fn ip(args: &[&str]) -> Result<()> {
        let status = std::process::Command::new("ip").args(args).status()?;
        if !status.success() {
            bail!("ip {}: {status}", args.join(" "));
        }
        Ok(())
    }

    /// The namespace, the link, and Redis in it with its files in `dir`.
    fn start(dir: &Path) -> Result<Self> {
        let tag = std::process::id() % 100_000;
        let mut made = Self {
            namespace: format!("loomfaults{tag}"),
            link: format!("lf{tag}h"),
            redis: None,
        };
        let peer = format!("lf{tag}r");
        Self::ip(&["netns", "add", &made.namespace])?;
        Self::ip(&["link", "add", &made.link, "type", "veth", "peer", "name", &peer])?;
        Self::ip(&["link", "set", &peer, "netns", &made.namespace])?;
        Self::ip(&["addr", "add", &format!("{}/24", Self::HERE), "dev", &made.link])?;
        Self::ip(&["link", "set", &made.link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", made.namespace.as_str(), "ip"];
            all.extend_from_slice(args);
            Self::ip(&all)
        };
        inside(&["addr", "add", &format!("{}/24", Self::THERE), "dev", &peer])?;
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        let port = Self::PORT.to_string();
        let redis = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &made.namespace,
                "redis-server",
                "--bind",
                Self::THERE,
                "--port",
                &port,
            ])
            .args([
                "--protected-mode",
                "no",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
            ])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()?;
        made.redis = Some(redis);
        let address: std::net::SocketAddr = format!("{}:{}", Self::THERE, Self::PORT).parse()?;
        for _ in 0..100 {
            if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
                return Ok(made);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the partitioned Redis did not start")
    }

    fn url(&self) -> String {
        format!("redis://{}:{}/0", Self::THERE, Self::PORT)
    }

    /// Cuts the link (packets go nowhere: no reset, no answer), or mends it.
    fn cut(&self, cut: bool) -> Result<()> {
        Self::ip(&["link", "set", &self.link, if cut { "down" } else { "up" }])
    }
}

impl Drop for Partitioned {
    fn drop(&mut self) {
        if let Some(mut redis) = self.redis.take() {
            let _ = redis.kill();
            let _ = redis.wait();
        }
        let _ = Self::ip(&["link", "del", &self.link]);
        let _ = Self::ip(&["netns", "del", &self.namespace]);
    }
}

/// The gateway cut off from its Redis for 5 s under load: a partition, not
/// a crash — packets vanish, nothing answers, nothing resets.
async fn redis_partition(options: &Options, dir: &Path, state: &Path) -> Result<Row> {
    let network = match Partitioned::start(state) {
        Ok(network) => network,
        Err(err) => {
            return Ok(Row {
                fault: format!("Redis partitioned: skipped ({err:#}; needs root, iproute2, redis-server)"),
                skipped: true,
                ..Row::default()
            })
        }
    };
    let model = PromptModel::start(PromptModelOptions {
        delay: Duration::from_millis(300),
        ..PromptModelOptions::default()
    });
    write_config(
        dir,
        &model.url(),
        &format!("[cluster]\nredis = \"{}\"\nexecute = true\n", network.url()),
    )?;
    let gateway = start(&options.loom, dir, state, &[])?;
    let mut row = Row {
        fault: "Redis partitioned from the gateway for 5 s under load (a veth to a network namespace, cut)".into(),
        runs: options.runs,
        ..Row::default()
    };
    let (ids, refused) = submit_all(&gateway, (0..options.runs).map(|n| format!("n{n}")), 3, "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    network.cut(true)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    network.cut(false)?;
    let codes = tally(&gateway, &mut row, &ids, Duration::from_secs(180)).await;
    row.recovered = recovers(&gateway).await;
    row.repeated = repeated_effects(&dir.join("effects.txt"));
    row.panics = gateway.panics();
    row.not_ended += refused.len();
    row.hit = !ids.is_empty();
    row.notes = format!(
        "{} runs interrupted and taken back; {}",
        gateway.took_back(),
        counted(&codes)
    );
    Ok(row)
}

fn options() -> Result<Options> {
    let mut options = Options {
        runs: 30,
        smoke: false,
        loom: PathBuf::from("target/release/loom"),
        scenarios: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => {
                options.runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| anyhow!("--runs N"))?
            }
            "--loom" => options.loom = PathBuf::from(args.next().ok_or_else(|| anyhow!("--loom PATH"))?),
            "--smoke" => options.smoke = true,
            "-h" | "--help" => {
                println!(
                    "loom-faults [--smoke] [--runs N] [--loom PATH] [{}]",
                    SCENARIOS.join(" | ")
                );
                std::process::exit(0);
            }
            name if SCENARIOS.contains(&name) => options.scenarios.push(name.to_string()),
            other => bail!("unknown argument '{other}' (--help)"),
        }
    }
    if options.smoke {
        options.runs = options.runs.min(12);
        if options.scenarios.is_empty() {
            options.scenarios = ["provider", "db_locked", "db_corrupt", "disk_full", "redis_kill"]
                .map(String::from)
                .to_vec();
        }
    }
    if options.scenarios.is_empty() {
        options.scenarios = SCENARIOS.map(String::from).to_vec();
    }
    options.loom = options
        .loom
        .canonicalize()
        .map_err(|err| anyhow!("{}: {err} (cargo build --release -p loom-cli)", options.loom.display()))?;
    Ok(options)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let options = options()?;
    let mut rows = Vec::new();
    for scenario in &options.scenarios {
        let dir = tempfile::tempdir()?;
        let state = tempfile::tempdir()?;
        let row = match scenario.as_str() {
            "provider" => provider(&options, dir.path(), state.path()).await,
            "db_locked" => db_locked(&options, dir.path(), state.path()).await,
            "db_corrupt" => db_corrupt(&options, dir.path(), state.path()).await,
            "disk_full" => disk_full(&options, dir.path(), state.path()).await,
            "redis_pause" => redis(&options, dir.path(), state.path(), false).await,
            "clock_jump" => clock_jump(&options, dir.path(), state.path()).await,
            "redis_partition" => redis_partition(&options, dir.path(), state.path()).await,
            _ => redis(&options, dir.path(), state.path(), true).await,
        };
        let row = row.unwrap_or_else(|err| Row {
            fault: format!("{scenario}: the scenario failed: {err:#}"),
            ..Row::default()
        });
        eprintln!("{scenario}: done");
        rows.push(row);
    }
    println!("| fault | runs | DONE | typed errors | untyped | not ended | effects repeated | panics | recovered | what the runs saw |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.fault,
            row.runs,
            row.done,
            row.typed_errors,
            row.untyped,
            row.not_ended,
            row.repeated,
            row.panics,
            match (row.skipped, row.recovered, row.hit) {
                (true, _, _) => "skipped",
                (false, true, true) => "yes",
                (false, true, false) => "fault missed",
                (false, false, _) => "NO",
            },
            row.notes
        );
    }
    if rows.iter().any(Row::failed) {
        bail!("a fault broke a promise (see the table)");
    }
    Ok(())
}
