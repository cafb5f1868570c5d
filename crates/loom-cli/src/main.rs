//! The `loom` command.

mod chat;
mod cli;
mod config;
mod context;
mod control;
mod interrupts;
mod permissions;
mod provider;
mod render;
mod run;
mod runs;
mod store;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use run::{exit, Failure};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("loom: error: cannot start the async runtime: {err}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Chat(args) => chat::chat(*args).await,
            Command::Runs(args) => runs::runs(args).await,
        }
    });
    // Do not wait for tool work still on the blocking pool after a forced quit.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(Failure::Usage(err)) => {
            eprintln!("loom: error: {}", one_line(&err));
            ExitCode::from(exit::USAGE)
        }
        Err(Failure::Runtime(err)) => {
            eprintln!("loom: error: {}", one_line(&err));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// Warnings (retries, the circuit breaker opening) go to stderr; `LOOM_LOG`
/// (e.g. `LOOM_LOG=debug` or `LOOM_LOG=loom_llm=info`) shows more.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOOM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// The error and its causes on one line.
fn one_line(err: &anyhow::Error) -> String {
    format!("{err:#}").replace('\n', " ")
}
