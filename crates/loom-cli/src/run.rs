//! `loom run`: one task, streamed, with Ctrl-C that cancels cleanly.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use loom::tools::file_tools;
use loom::{Agent, RunHandle, RunOutcome, RunStatus, StopReason};

use crate::cli::{AgentArgs, PlaceArgs, RunArgs};
use crate::config::{self, LoadedConfig};
use crate::exit::{self, Failure};
use crate::follow::Shown;
use crate::lines::Lines;
use crate::questions::Questions;
use crate::render::{Human, JsonLines, Renderer};
use crate::signals::{Signal, Signals};
use crate::{permissions, plan, provider, store, tuning};

pub(crate) async fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let prompt = crate::prompt::task(args.prompt.as_deref(), args.prompt_file.as_deref()).map_err(Failure::Usage)?;
    let agent = build_agent(&args.agent, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let handle = agent.run(loom::RunRequest {
        prompt,
        session_id: args.session.clone(),
        trace_parent: crate::telemetry::trace_parent_from_environment(),
        ..loom::RunRequest::default()
    });
    let session_id = handle.controller().session_id().to_string();
    let mut lines = Lines::default();
    let (code, outcome) = follow_to_end(handle, args.json, &args.agent, &mut lines).await?;
    let plan = outcome.filter(|outcome| args.agent.mode == loom::Mode::Plan && outcome.status == RunStatus::Done);
    let Some(plan) = plan else {
        return Ok(code);
    };
    if !approve_plan(&args.agent, &session_id, &mut lines).await {
        return Ok(code);
    }
    // The plan is carried out by the session's next run, in the default
    // mode: the same conversation, every tool the flags allow.
    let mut carrying = args.agent.clone();
    carrying.mode = loom::Mode::Default;
    let agent = build_agent(&carrying, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let handle = agent.run(loom::RunRequest {
        prompt: plan::APPROVED.to_string(),
        session_id: Some(session_id),
        // Without a store the next run cannot load the conversation itself.
        history: agent
            .store()
            .is_none()
            .then(|| loom::history::without_system_prompt(plan.messages)),
        trace_parent: crate::telemetry::trace_parent_from_environment(),
        ..loom::RunRequest::default()
    });
    Ok(follow_to_end(handle, args.json, &carrying, &mut lines).await?.0)
}

/// Whether the plan just shown is approved; with no terminal to ask on
/// and no `--yes`, it waits, and loom says how to carry it out later.
async fn approve_plan(args: &AgentArgs, session_id: &str, lines: &mut Lines) -> bool {
    let later = format!(
        "carry it out later with `loom run --session {session_id} \"{}\"`",
        plan::APPROVED
    );
    if !args.yes && !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        say!("loom: the plan waits for approval (no terminal to ask on; --yes approves); {later}");
        return false;
    }
    plan::approve(args.yes, lines, &later).await
}

/// Why a run being followed was stopped from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// A signal came (Ctrl-C cancels; SIGTERM and SIGHUP interrupt).
    By(Signal),
    /// Stdout was closed (`loom run --json … | head -1`) or failed: interrupted.
    OutputClosed,
}

/// Shows a run until it ends — its events rendered, permission questions
/// asked on the terminal — and returns its exit code. Ctrl-C cancels the
/// run; SIGTERM, SIGHUP or a closed stdout interrupt it (it stays
/// resumable, recorded `INTERRUPTED`); a second signal quits at once.
pub(crate) async fn follow(handle: RunHandle, json: bool, agent: &AgentArgs) -> Result<ExitCode, Failure> {
    Ok(follow_to_end(handle, json, agent, &mut Lines::default()).await?.0)
}

/// [`follow`], with the stdin reader the caller keeps and the run's
/// outcome (none when a second signal quit at once).
async fn follow_to_end(
    mut handle: RunHandle,
    json: bool,
    agent: &AgentArgs,
    lines: &mut Lines,
) -> Result<(ExitCode, Option<RunOutcome>), Failure> {
    let renderer: Box<dyn Renderer> = if json {
        Box::new(JsonLines)
    } else {
        Box::new(Human::new(agent.verbose))
    };
    let mut shown = Shown::new(renderer, Questions::new(agent.yes));
    let controller = handle.controller();
    let mut signals = Signals::listen().context("cannot listen for signals")?;
    let mut stopped: Option<Stopped> = None;
    loop {
        tokio::select! {
            event = handle.next_event() => {
                let Some(event) = event else { break };
                if let Some(err) = shown.event(&controller, &event, lines) {
                    // Nobody can read any more (a closed pipe, a terminal
                    // gone, a full disk): stop, resumably, and write
                    // nothing more on stdout.
                    if stopped.is_none() {
                        say!("loom: cannot write output ({err}); stopping the run, which can be resumed with `loom runs resume {}`", controller.run_id());
                        controller.interrupt(format!("loom's output failed: {err}"));
                    }
                    stopped = Some(Stopped::OutputClosed);
                }
            }
            line = lines.recv(), if shown.asking() => shown.answer(&controller, line),
            signal = signals.recv() => {
                if stopped.is_some() {
                    say!("loom: {} again; quitting now", signal.name());
                    return Ok((ExitCode::from(signal.exit_code()), None));
                }
                stopped = Some(Stopped::By(signal));
                match signal {
                    Signal::Interrupt => {
                        say!("loom: cancelling (press Ctrl-C again to quit at once)");
                        controller.cancel("interrupted by the user (Ctrl-C)");
                    }
                    Signal::Terminate | Signal::Hangup => {
                        say!("loom: {}: stopping the run; it can be resumed with `loom runs resume {}`", signal.name(), controller.run_id());
                        controller.interrupt(format!("loom received {}", signal.name()));
                    }
                }
            }
        }
    }
    let outcome = handle.outcome().await;
    if agent.verbose {
        say_partial!("{}", crate::render::summary(&outcome));
    }
    let code = match (outcome.status, stopped) {
        (RunStatus::Interrupted, Some(Stopped::By(signal))) => signal.exit_code(),
        (RunStatus::Interrupted, Some(Stopped::OutputClosed)) => exit::OUTPUT_CLOSED,
        // Neither a signal nor the output: its store failed under it (the
        // database held past its busy timeout, its disk full, a Redis
        // down). What it did is kept up to its last checkpoint.
        (RunStatus::Interrupted, None) => {
            let why = match &outcome.stop_reason {
                Some(StopReason::Interrupted(why)) => why.clone(),
                _ => "its store failed".to_string(),
            };
            say!(
                "loom: the run stopped: {why}; it can be resumed with `loom runs resume {}` once the store is back",
                outcome.run_id
            );
            exit::ERROR
        }
        _ => crate::exit::for_outcome(&outcome),
    };
    Ok((ExitCode::from(code), Some(outcome)))
}

/// The agent the flags and loom.toml describe. `default_model` is used when
/// neither names one (a resumed run's recorded model).
pub(crate) async fn build_agent(args: &AgentArgs, place: &PlaceArgs, default_model: Option<&str>) -> Result<Agent> {
    let loaded = config::load(args.common.config.as_deref())?;
    for note in &loaded.notes {
        say!("loom: note: {note}");
    }
    // It may ask on the terminal and read files: off the async thread.
    let (loaded, trusted) =
        tokio::task::spawn_blocking(move || crate::trust::require(&loaded, true).map(|t| (loaded, t)))
            .await
            .map_err(|err| anyhow!("the trust check failed: {err}"))??;
    if let Some(trusted) = trusted {
        crate::trust_records::audit(trusted).await;
    }
    configure_agent(args, place, default_model, &loaded, None).await
}

/// What `loom serve` asks of an agent, beyond the flags and loom.toml.
pub(crate) struct ServerAgent {
    /// The model the client chose (else the configured one).
    pub model: Option<String>,
    /// Only these tools.
    pub tools: Option<Vec<String>>,
    /// The permission mode the client asked for (one the server allows).
    pub mode: loom::Mode,
    /// The gateway's default model (what `[server] models` adds to).
    pub default_model: String,
    /// The gateway's store.
    pub store: Option<std::sync::Arc<dyn loom::Store>>,
}

/// The model the flags and loom.toml name.
pub(crate) fn configured_model(args: &AgentArgs, loaded: &LoadedConfig, default_model: Option<&str>) -> Result<String> {
    let LoadedConfig { file, dir, .. } = loaded;
    Ok(match (&args.common.model, &file.model, default_model) {
        (Some(model), _, _) => model.clone(),
        (None, Some(model), _) => config::model_from_file(model, dir.as_deref()),
        (None, None, Some(model)) => model.to_string(),
        (None, None, None) => {
            return Err(anyhow!(
                "no model given: pass --model scripted:PATH, set LOOM_MODEL, or put model = \"...\" in loom.toml"
            ))
        }
    })
}

/// The agent of `loom run`, `loom chat`, `loom runs resume` — or, with
/// `server`, of `loom serve`: tools that write or run commands are denied
/// unless loom.toml or a flag allows or asks, asks go to the gateway's
/// clients, and the gateway's store records the runs.
pub(crate) async fn configure_agent(
    args: &AgentArgs,
    place: &PlaceArgs,
    default_model: Option<&str>,
    loaded: &LoadedConfig,
    server: Option<ServerAgent>,
) -> Result<Agent> {
    let LoadedConfig { file, dir, .. } = loaded;
    let model = match server.as_ref().and_then(|s| s.model.clone()) {
        Some(model) => model,
        None => configured_model(args, loaded, default_model)?,
    };
    let llm = provider::model(&model, args.common.base_url.as_deref(), file, args.record.as_deref())?;

    let workspace = match &place.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if !workspace.is_dir() {
        return Err(anyhow!("workspace {} is not a directory", workspace.display()));
    }

    let mut tools = file_tools();
    let defined = defined_in_files(&workspace).await;
    let serving = server.is_some();
    let (defined, trusted) = {
        let workspace = workspace.clone();
        tokio::task::spawn_blocking(move || crate::project_definitions::admitted(defined, &workspace, serving))
            .await??
    };
    if let Some(trusted) = trusted {
        crate::trust_records::audit(trusted).await;
    }
    let wanted = match server.as_ref().and_then(|s| s.tools.clone()) {
        Some(wanted) => Some(wanted),
        None => (!args.tools.is_empty()).then(|| args.tools.clone()),
    };
    // Sub-agents are offered when asked for, or when the project defines
    // agents to hand work to: offered unasked, a model delegates what it
    // could do itself, and the child's whole run is one step of its parent.
    let task_wanted = wanted
        .as_ref()
        .is_some_and(|names| names.iter().any(|name| name == loom::delegate::TASK_TOOL));
    let task_configured = file.tools.as_ref().and_then(|tools| tools.task);
    if task_wanted || task_configured.unwrap_or(!defined.agents.is_empty()) {
        tools.push(Arc::new(loom::tools::Task::with_agents(
            defined.agents.into_iter().map(|found| found.definition).collect(),
        )));
    }
    let skills = (!defined.skills.is_empty()).then(|| loom::tools::Skill::new(defined.skills));
    if let Some(skill) = &skills {
        tools.push(Arc::new(skill.clone()));
    }
    let (shell, bash_enabled) = crate::shell_settings::bash_settings(file, &workspace, server.is_some())?;
    let store = match &server {
        Some(server) => server.store.clone(),
        None => {
            let redis = store::RedisFrom::pick(place.redis.as_deref(), file.cluster_redis());
            store::open(
                place.db.as_deref(),
                redis,
                file.store.as_deref(),
                dir.as_deref(),
                &workspace,
            )
            .await?
        }
    };
    let snapshots = crate::snapshots::open(
        file.snapshots.as_ref(),
        store.as_deref(),
        &workspace,
        crate::snapshots::Purpose::Runs,
    )
    .await?;
    // Where this run's store keeps prompts and answers (`--db` or `store`
    // may put it anywhere): hidden from the programs it starts and from
    // every other Loom's. Files and a lock: off the async thread.
    let mut kept: Vec<PathBuf> = store.iter().flat_map(|store| store.files()).collect();
    kept.extend(
        snapshots
            .iter()
            .flat_map(|snapshots| loom::WorkspaceSnapshots::files(snapshots.as_ref())),
    );
    let hidden = {
        let (loaded, workspace) = (loaded.clone(), workspace.clone());
        tokio::task::spawn_blocking(move || {
            crate::places::register(&kept);
            crate::hidden::Hidden::of(&loaded, &workspace, kept)
        })
        .await
        .map_err(|err| anyhow!("finding Loom's places failed: {err}"))?
    };
    let shell_bwrap = shell.bwrap.clone();
    if bash_enabled {
        tools.push(Arc::new(loom::tools::Bash::new(shell.clone())));
    }
    // Hooks run as the shell's commands do, whether or not the model has it.
    let source = loaded
        .path
        .as_ref()
        .map_or_else(|| "loom.toml".to_string(), |path| path.display().to_string());
    let hooks = crate::hooks::command_hooks(file, &source, shell)?;
    let mode = server.as_ref().map_or(args.mode, |server| server.mode);
    let planning = mode == loom::Mode::Plan;
    // Plan mode starts no MCP server: its tools are not offered.
    let mcp = if planning {
        None
    } else {
        crate::mcp::clients(file, &workspace, hidden.isolation(shell_bwrap)).await?
    };
    let mcp_names = mcp.as_ref().map(|clients| clients.tool_names()).unwrap_or_default();
    let mcp_servers: Vec<String> = file
        .mcp
        .as_ref()
        .map(|mcp| mcp.servers.keys().map(|name| format!("{name}__")).collect())
        .unwrap_or_default();
    if let Some(wanted) = &wanted {
        let known = |name: &String| {
            tools.iter().any(|tool| tool.name() == name.as_str())
                || mcp_names.contains(name)
                || (planning && mcp_servers.iter().any(|prefix| name.starts_with(prefix.as_str())))
        };
        if let Some(unknown) = wanted.iter().find(|name| !known(name)) {
            return Err(anyhow!(
                "no tool '{unknown}' {}",
                if server.is_some() {
                    "on this server"
                } else {
                    "to offer (--tools)"
                }
            ));
        }
        tools.retain(|tool| wanted.iter().any(|name| name == tool.name()));
    }
    if planning {
        // Plan mode: of the tools asked for, only what reads (and `task`,
        // whose children get a subset of these); no shell, no MCP.
        tools.retain(|tool| tool.read_only() || tool.name() == loom::delegate::TASK_TOOL);
    }
    let mut policy = permissions::policy(args, file.permissions.as_ref(), server.is_some())?;
    if let Some(clients) = mcp.as_ref().filter(|_| mode != loom::Mode::Bypass) {
        permissions::ask_for_mcp_tools(&mut policy, clients, file.permissions.as_ref())?;
    }
    policy.set_mode(mode);
    if mode == loom::Mode::Bypass && server.is_none() {
        say!("loom: warning: --mode bypass: every tool call runs without asking, the shell included; only rules that match (--deny, --ask, [permissions]) still hold");
    }
    // The skills' names and descriptions go in the system prompt only
    // when the run has the tool that loads them.
    let skills_section = skills
        .filter(|_| tools.iter().any(|tool| tool.name() == "skill"))
        .and_then(|skill| skill.system_section());
    let mut builder = Agent::builder()
        .model_arc(llm)
        .tools(tools)
        .workspace(PathBuf::from(&workspace))
        .permissions(policy);
    if let Some(why) = permissions::nobody_to_ask(args, server.is_some()) {
        builder = builder.nobody_to_ask(why);
    }
    for path in &hidden.protected {
        builder = builder.protect(path.clone());
    }
    for path in &hidden.read_only {
        builder = builder.read_only(path.clone());
    }
    if let Some(clients) = mcp {
        builder = builder.tool_source(match wanted {
            Some(names) => clients.only(names),
            None => clients,
        });
    }
    if let Some(hooks) = hooks {
        builder = builder.lifecycle_hooks(Arc::new(hooks));
    }
    if let Some(times) = file.max_stop_refusals {
        builder = builder.max_stop_refusals(times);
    }
    if let Some(pricing) = provider::pricing(&model, file) {
        builder = builder.pricing(pricing);
    }
    if let Some(section) = skills_section {
        builder = builder.system_section_for("skill", "skills", section);
    }
    if mode == loom::Mode::Plan {
        builder = builder.system_instructions("plan_mode", plan::INSTRUCTIONS);
    }
    builder = builder.model_source(Arc::new(provider::ConfiguredModels {
        file: Arc::new(file.clone()),
        base_url: args.common.base_url.clone(),
        served: server
            .as_ref()
            .map(|server| provider::ServedModels::of(file.server.as_ref(), &server.default_model)),
        parent: model.clone(),
        made: std::sync::Mutex::default(),
    }));
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
            // 0 is no limit, as for every other timeout.
            builder = builder.tool_timeout_for(tool, seconds(*secs).unwrap_or(Duration::MAX));
        }
    }
    if let Some(steps) = args.common.max_steps.or(file.max_steps) {
        builder = builder.max_steps(steps);
    }
    if let Some(tokens) = args.max_tokens.or(file.max_tokens) {
        builder = builder.max_tokens(tokens);
    }
    if let Some(dollars) = args.max_cost.or(file.max_cost_usd) {
        builder = builder.max_cost_usd(dollars);
    }
    if let Some(secs) = args.common.timeout.or(file.run_timeout_secs) {
        builder = builder.run_timeout(seconds(secs));
    }
    if let Some(secs) = file.step_timeout_secs {
        builder = builder.step_timeout(seconds(secs));
    }
    builder = tuning::apply(builder, file, dir.as_deref(), &model, args.common.base_url.as_deref()).await?;
    if let Some(snapshots) = snapshots {
        builder = builder.snapshots(snapshots);
    }
    if let Some(telemetry) = crate::telemetry::observer(file.telemetry.as_ref()) {
        builder = builder.observer(telemetry);
    }
    if let Some(store) = store {
        builder = builder.store(store);
    }
    Ok(builder.build()?)
}

/// The agents and skills defined in the workspace's `.loom/` and the
/// user's config folder (docs/agents.md), for the `task` and `skill`
/// tools; a file that does not load is a warning (`loom agents list` and
/// `loom skills list` say more) and is left out.
async fn defined_in_files(workspace: &Path) -> loom::tools::definitions::Definitions {
    let places = crate::definitions::places(workspace);
    let found = tokio::task::spawn_blocking(move || loom::tools::definitions::discover(&places))
        .await
        .unwrap_or_else(|_| loom::tools::definitions::discover(&[]));
    for problem in &found.problems {
        tracing::warn!("definition left out: {}", crate::text::shown(&problem.to_string()));
    }
    found
}

/// 0 means no limit.
fn seconds(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}
