//! `loom run`: one task, streamed, with Ctrl-C that cancels cleanly.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use loom::tools::file_tools;
use loom::{Agent, EventKind, RunHandle, RunOutcome, RunStatus, StopReason};

use crate::cli::{AgentArgs, PlaceArgs, RunArgs};
use crate::config::{self, LoadedConfig};
use crate::interrupts::Interrupts;
use crate::render::{Human, JsonLines, Renderer};
use crate::{context, permissions, provider, store};

/// Exit codes of DESIGN 4.5.
pub mod exit {
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NO_ANSWER: u8 = 3;
    pub const TIMEOUT: u8 = 4;
    pub const CANCELLED: u8 = 130;
}

/// Why `loom run` could not do its job.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags, config or script: one line, exit code 2.
    Usage(anyhow::Error),
    /// Anything else: exit code 1.
    Runtime(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Self::Runtime(err)
    }
}

pub async fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let agent = build_agent(&args.agent, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let handle = agent.run(loom::RunRequest {
        prompt: args.prompt.clone(),
        session_id: args.session.clone(),
        ..loom::RunRequest::default()
    });
    follow(handle, args.json, &args.agent).await
}

/// Shows a run until it ends — its events rendered, permission requests
/// answered, Ctrl-C cancelling it — and returns its exit code.
pub async fn follow(mut handle: RunHandle, json: bool, agent: &AgentArgs) -> Result<ExitCode, Failure> {
    let mut renderer: Box<dyn Renderer> = if json {
        Box::new(JsonLines)
    } else {
        Box::new(Human::new(agent.verbose))
    };
    let controller = handle.controller();
    let mut interrupts = Interrupts::listen().context("cannot listen for Ctrl-C")?;
    let mut interrupted = 0u32;
    loop {
        tokio::select! {
            event = handle.next_event() => match event {
                Some(event) => {
                    if let EventKind::PermissionRequest { request_id, tool, args: call_args, .. } = &event.kind {
                        permissions::answer(&controller, request_id.clone(), tool.clone(), call_args, agent.yes);
                    }
                    renderer.event(&event).context("cannot write output")?;
                }
                None => break,
            },
            () = interrupts.recv() => {
                interrupted += 1;
                if interrupted > 1 {
                    eprintln!("loom: interrupted again; quitting now");
                    return Ok(ExitCode::from(exit::CANCELLED));
                }
                eprintln!("loom: cancelling (press Ctrl-C again to quit at once)");
                controller.cancel("interrupted by the user (Ctrl-C)");
            }
        }
    }
    let outcome = handle.outcome().await;
    if agent.verbose {
        eprint!("{}", crate::render::summary(&outcome));
    }
    Ok(ExitCode::from(exit_code(&outcome)))
}

pub fn exit_code(outcome: &RunOutcome) -> u8 {
    match (outcome.status, &outcome.stop_reason) {
        (RunStatus::Done, _) => 0,
        (RunStatus::Canceled, _) => exit::CANCELLED,
        (RunStatus::Timeout, _) => exit::TIMEOUT,
        (_, Some(StopReason::MaxStepsWithoutAnswer)) => exit::NO_ANSWER,
        _ => exit::ERROR,
    }
}

/// The agent the flags and loom.toml describe. `default_model` is used when
/// neither names one (a resumed run's recorded model).
pub async fn build_agent(args: &AgentArgs, place: &PlaceArgs, default_model: Option<&str>) -> Result<Agent> {
    let LoadedConfig { file, dir, notes } = config::load(args.config.as_deref())?;
    for note in notes {
        eprintln!("loom: note: {note}");
    }
    let model = match (&args.model, &file.model, default_model) {
        (Some(model), _, _) => model.clone(),
        (None, Some(model), _) => config::model_from_file(model, dir.as_deref()),
        (None, None, Some(model)) => model.to_string(),
        (None, None, None) => {
            return Err(anyhow!(
                "no model given: pass --model scripted:PATH, set LOOM_MODEL, or put model = \"...\" in loom.toml"
            ))
        }
    };
    let llm = provider::model(&model, args.base_url.as_deref(), &file, args.record.as_deref())?;

    let workspace = match &place.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if !workspace.is_dir() {
        return Err(anyhow!("workspace {} is not a directory", workspace.display()));
    }

    let mut builder = Agent::builder()
        .model_arc(llm)
        .tools(file_tools())
        .workspace(PathBuf::from(&workspace))
        .permissions(permissions::policy(args, file.permissions.as_ref())?);
    if let Some(pricing) = provider::pricing(&model, &file) {
        builder = builder.pricing(pricing);
    }
    if let Some(secs) = file.permission_timeout_secs {
        builder = builder.permission_timeout(seconds(secs));
    }
    if let Some(limit) = file.tool_output_max_chars {
        builder = builder.max_output_chars(limit);
    }
    if let Some(scheduler) = &file.scheduler {
        if let Some(limit) = scheduler.max_concurrency {
            builder = builder.max_concurrency(limit);
        }
        if let Some(secs) = scheduler.tool_timeout_secs {
            builder = builder.tool_timeout(seconds(secs));
        }
        for (tool, secs) in &scheduler.tool_timeouts {
            builder = builder.tool_timeout_for(tool, Duration::from_secs(*secs));
        }
    }
    if let Some(steps) = args.max_steps.or(file.max_steps) {
        builder = builder.max_steps(steps);
    }
    if let Some(secs) = args.timeout.or(file.run_timeout_secs) {
        builder = builder.run_timeout(seconds(secs));
    }
    if let Some(secs) = file.step_timeout_secs {
        builder = builder.step_timeout(seconds(secs));
    }
    builder = context::apply(builder, &file, dir.as_deref(), args.base_url.as_deref()).await?;
    if let Some(store) = store::open(place.db.as_deref(), file.store.as_deref(), dir.as_deref(), &workspace).await? {
        builder = builder.store(store);
    }
    Ok(builder.build()?)
}

/// 0 means no limit.
fn seconds(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}
