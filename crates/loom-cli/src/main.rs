//! The `loom` command.

/// A line on stderr that never panics: a closed stderr must not bring loom
/// down in the middle of a run (`eprintln!` would).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Like [`say!`], without the newline.
macro_rules! say_partial {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, $($arg)*).and_then(|()| stderr.flush());
    }};
}

mod audit;
mod chat;
mod chat_rewind;
mod cli;
mod config;
mod definitions;
mod eval;
mod exit;
mod follow;
mod hidden;
mod hooks;
mod lines;
mod mcp;
mod permissions;
mod places;
mod plan;
mod project_definitions;
mod prompt;
mod provider;
mod questions;
mod recorded_runs;
mod render;
mod rewind;
mod run;
mod runs;
mod serve;
mod shell_settings;
mod signals;
mod snapshots;
mod state;
mod store;
mod telemetry;
mod text;
mod trust;
mod trust_records;
mod trust_rules;
mod tuning;
mod turn_tree;
mod worker;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use exit::Failure;

/// Threads for the gateway's blocking work (file tools, store calls,
/// project instructions). Tokio's default, 512, is what thousands of runs
/// calling tools at once grow the pool to: every new thread brings its own
/// stack and, past a few, shares malloc arenas whose locks the threads then
/// fight over. The store has one connection and file work is short, so a
/// few dozen threads keep the disk busy; more only cost memory and CPU.
const GATEWAY_BLOCKING_THREADS: usize = 32;

fn main() -> ExitCode {
    // Inside the bash sandbox's namespaces, `loom __landlock …` applies
    // Landlock and becomes the command (loom_tools::shell::sandbox): first
    // thing, while the process has one thread.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new("__landlock")) {
        let err = loom::tools::landlock_helper_main(args);
        say!("loom: the sandbox could not start the command: {err}");
        return ExitCode::from(126);
    }
    // No other process of this user reads Loom's memory or environment
    // (its API keys, LOOM_TOKEN) through /proc or ptrace, and a crash
    // leaves no core file (docs/security.md).
    if let Err(err) = loom::tools::make_process_undumpable() {
        say!("loom: warning: cannot keep other processes out of Loom's memory: {err}");
    }
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_) | Command::Worker(_));
    match &cli.command {
        Command::Serve(args) => init_logging("info", args.log_format == cli::LogFormat::Json),
        Command::Worker(args) => init_logging("info", args.log_format == cli::LogFormat::Json),
        _ => init_logging("warn", false),
    }
    // The gateway uses every core; a single run needs one thread.
    let runtime = if serving {
        tokio::runtime::Builder::new_multi_thread()
            .max_blocking_threads(GATEWAY_BLOCKING_THREADS)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            say!("loom: error: cannot start the async runtime: {err}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let result = runtime.block_on(async {
        let result = match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Eval(args) => eval::eval(*args).await,
            Command::Chat(args) => chat::chat(*args).await,
            Command::Runs(args) => runs::runs(args).await,
            Command::Audit(args) => audit::audit(args).await,
            Command::Serve(args) => serve::serve(*args).await,
            Command::Worker(args) => worker::worker(*args).await,
            Command::Trust(args) => trust::trust(args.path.as_deref()).await.map_err(Failure::Usage),
            Command::Agents(args) => definitions::run(loom::tools::definitions::Kind::Agent, args).await,
            Command::Skills(args) => definitions::run(loom::tools::definitions::Kind::Skill, args).await,
            Command::Mcp(args) => {
                until_signal(async move {
                    match args.command {
                        cli::McpCommand::List {
                            config,
                            workspace,
                            json,
                        } => mcp::list(config.as_deref(), workspace.as_deref(), json).await,
                    }
                })
                .await
            }
        };
        // No MCP server outlives loom.
        mcp::shutdown().await;
        result
    });
    // The runs' last spans go out before the process ends.
    telemetry::flush();
    // Do not wait for tool work still on the blocking pool after a forced quit.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(Failure::Usage(err)) => {
            say!("loom: error: {}", one_line(&err));
            ExitCode::from(exit::USAGE)
        }
        Err(Failure::Runtime(err)) => {
            say!("loom: error: {}", one_line(&err));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// Runs a command that does not watch for signals itself: SIGINT, SIGTERM
/// or SIGHUP end it early with the signal's exit code, and what it started
/// is still stopped (`mcp::shutdown` runs after every command).
async fn until_signal(
    command: impl std::future::Future<Output = Result<ExitCode, Failure>>,
) -> Result<ExitCode, Failure> {
    let Ok(mut signals) = signals::Signals::listen() else {
        return command.await;
    };
    tokio::select! {
        result = command => result,
        signal = signals.recv() => Ok(ExitCode::from(signal.exit_code())),
    }
}

/// Warnings (retries, the circuit breaker opening) go to stderr — for
/// `loom serve` also one line per request and per run (`default`
/// `info`), as JSON with `json`; `LOOM_LOG` (e.g. `LOOM_LOG=debug` or
/// `LOOM_LOG=loom_llm=info`) shows more.
fn init_logging(default: &str, json: bool) {
    // rmcp's own log lines repeat, with Rust type names, what Loom reports
    // in words (a server down and why); `LOOM_LOG=rmcp=debug` shows them.
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOOM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},rmcp=off")));
    // A log line that cannot be written is dropped: tracing's own report of
    // that failure would go through `eprintln!`, which panics on a closed
    // stderr (`loom serve 2>&1 | head` must not break requests).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .log_internal_errors(false);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
    };
}

/// The error and its causes on one line.
fn one_line(err: &anyhow::Error) -> String {
    format!("{err:#}").replace('\n', " ")
}
