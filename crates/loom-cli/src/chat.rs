//! `loom chat`: an interactive session in the terminal. Each line is a task
//! in one conversation; answers stream, tool calls show as lines, risky
//! tools ask first, Ctrl-C cancels the answer in progress but keeps the
//! session, `/new` starts a new conversation, `/undo` and `/rewind` go back
//! (`chat_rewind.rs`) and `/exit` (or Ctrl-D) quits.
//! With a store the session is recorded: `--session ID` (or `--continue`)
//! continues it after a restart, and `/resume` finishes a task the last
//! process died in.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use loom::{Agent, Message, RunHandle, RunOutcome, RunRequest, RunStatus};

use crate::cli::ChatArgs;
use crate::exit::Failure;
use crate::follow::Shown;
use crate::lines::Lines;
use crate::questions::Questions;
use crate::render::Human;
use crate::run::build_agent;
use crate::signals::{Signal, Signals};

const HELP: &str = "Type a task and press Enter. Commands: /new starts a new conversation, \
/session shows its id, /resume continues a task interrupted by a crash, /undo takes the last task back \
(its files and the conversation), /rewind goes back to a step you pick, /exit quits (so does Ctrl-D). \
Ctrl-C cancels the answer in progress.";

pub(crate) async fn chat(args: ChatArgs) -> Result<ExitCode, Failure> {
    let mut mode = args.agent.mode;
    let mut agent = build_agent(&args.agent, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let session_id = match (&args.session, args.continue_last) {
        (Some(id), _) => Some(id.clone()),
        (None, true) => Some(latest_session(&agent).await?),
        (None, false) => None,
    };
    let mut session = Session::open(&agent, session_id).await?;
    let mut input = Input::open().context("cannot listen for signals")?;
    say!("loom chat — session {}. {HELP}", session.id);
    if session.earlier > 0 {
        say!(
            "loom: continuing the conversation ({} earlier messages)",
            session.earlier
        );
    }
    if let Some(run_id) = &session.interrupted {
        say!("loom: the last task (run {run_id}) was interrupted when its process died; /resume continues it");
    }

    loop {
        if let Some(signal) = input.quit {
            say!("loom: {}: leaving the chat", signal.name());
            break;
        }
        crate::lines::prompt();
        let line = tokio::select! {
            line = input.lines.recv() => line,
            signal = input.signals.recv() => {
                if signal == Signal::Interrupt {
                    say!("\n(no answer is running: type /exit or press Ctrl-D to quit)");
                } else {
                    input.quit = Some(signal);
                }
                continue;
            }
        };
        let Some(line) = line else {
            // Ctrl-D: end the prompt's line before the goodbye.
            say!("");
            break;
        };
        match line.trim() {
            "" => {}
            "/exit" | "/quit" => break,
            "/help" => say!("{HELP}"),
            "/session" => say!("session {}", session.id),
            "/resume" => resume_task(&agent, &mut session, &mut input, &args).await?,
            // A task the process died in is not resumed past a rewind.
            "/undo" => {
                if crate::chat_rewind::undo(&agent, &session.id).await {
                    session.interrupted = None;
                }
            }
            "/rewind" => {
                if crate::chat_rewind::rewind(&agent, &session.id, &mut input.lines).await {
                    session.interrupted = None;
                }
            }
            "/new" => {
                session = Session::fresh();
                say!("loom: new conversation, session {}", session.id);
            }
            command if command.starts_with('/') => {
                say!("loom: unknown command {command}; /help lists them")
            }
            task => {
                let outcome = one_task(&agent, &mut session, task, &mut input, &args).await?;
                let planned = mode == loom::Mode::Plan && outcome.status == RunStatus::Done;
                let later = "say what to change, or approve a later plan";
                if planned && crate::plan::approve(args.agent.yes, &mut input.lines, later).await {
                    // The plan is carried out by the session's next task,
                    // and the chat goes on in the default mode.
                    let mut carrying = args.agent.clone();
                    carrying.mode = loom::Mode::Default;
                    agent = build_agent(&carrying, &args.place, None)
                        .await
                        .map_err(Failure::Usage)?;
                    mode = loom::Mode::Default;
                    say!("loom: carrying out the plan; the chat goes on in the default mode");
                    one_task(&agent, &mut session, crate::plan::APPROVED, &mut input, &args).await?;
                }
            }
        }
    }
    if agent.store().is_some() {
        say!(
            "loom: session {} is saved; continue it with `loom chat --session {}`",
            session.id,
            session.id
        );
    }
    Ok(ExitCode::from(input.quit.map_or(0, Signal::exit_code)))
}

/// The session of the newest recorded run, for `--continue`.
async fn latest_session(agent: &Agent) -> Result<String, Failure> {
    let Some(store) = agent.store() else {
        return Err(Failure::Usage(anyhow::anyhow!(
            "--continue needs a store; runs are not recorded with store = \"none\""
        )));
    };
    let newest = store
        .list_runs(1)
        .await
        .map_err(|err| Failure::Runtime(anyhow::anyhow!("{err}")))?;
    newest
        .into_iter()
        .next()
        .map(|run| run.session_id)
        .ok_or_else(|| Failure::Usage(anyhow::anyhow!("no earlier session to continue in this workspace")))
}

/// The conversation the next task continues.
struct Session {
    id: String,
    /// Messages loaded from the store when the chat started.
    earlier: usize,
    /// The conversation kept in memory when there is no store.
    history: Vec<Message>,
    /// The session's last task, when its process died before it ended.
    interrupted: Option<String>,
}

impl Session {
    async fn open(agent: &Agent, id: Option<String>) -> Result<Self, Failure> {
        let Some(id) = id else { return Ok(Self::fresh()) };
        let Some(store) = agent.store() else {
            return Ok(Self { id, ..Self::fresh() });
        };
        let failed = |err: loom::StoreError| Failure::Runtime(anyhow::anyhow!("{err}"));
        // A chat that died mid-task left its run RUNNING: mark it so it can
        // be resumed.
        loom::recovery::recover_interrupted_runs(store.as_ref())
            .await
            .map_err(failed)?;
        let earlier = loom::recovery::session_history(store.as_ref(), &id)
            .await
            .map_err(failed)?
            .len();
        let interrupted = store
            .session_runs(&id)
            .await
            .map_err(failed)?
            .pop()
            .filter(|run| run.status == RunStatus::Interrupted)
            .map(|run| run.run_id);
        Ok(Self {
            id,
            earlier,
            history: Vec::new(),
            interrupted,
        })
    }

    fn fresh() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Self {
            id: format!("chat-{now:x}-{:x}", std::process::id()),
            earlier: 0,
            history: Vec::new(),
            interrupted: None,
        }
    }
}

/// Runs one task of the conversation to its end.
async fn one_task(
    agent: &Agent,
    session: &mut Session,
    task: &str,
    input: &mut Input,
    args: &ChatArgs,
) -> Result<RunOutcome, Failure> {
    let with_store = agent.store().is_some();
    // A new task moves on from an interrupted one (it stays resumable with
    // `loom runs resume`).
    session.interrupted = None;
    let handle = agent.run(RunRequest {
        prompt: task.to_string(),
        session_id: Some(session.id.clone()),
        // With a store the run loads the session's conversation itself.
        history: (!with_store).then(|| session.history.clone()),
        trace_parent: crate::telemetry::trace_parent_from_environment(),
        ..RunRequest::default()
    });
    let outcome = follow(handle, input, args).await?;
    if !with_store {
        session.history = loom::history::without_system_prompt(outcome.messages.clone());
    }
    Ok(outcome)
}

/// Continues the session's interrupted task (`/resume`).
async fn resume_task(agent: &Agent, session: &mut Session, input: &mut Input, args: &ChatArgs) -> Result<(), Failure> {
    let Some(run_id) = session.interrupted.take() else {
        say!("loom: nothing to resume: the session's last task was not interrupted");
        return Ok(());
    };
    match agent.resume(&run_id).await {
        Ok(handle) => {
            say!("loom: resuming run {run_id} from its last checkpoint");
            follow(handle, input, args).await?;
        }
        Err(err) => say!("loom: cannot resume run {run_id}: {err}"),
    }
    Ok(())
}

/// Shows a run of the session until it ends: events rendered, permission
/// questions asked on the terminal, Ctrl-C cancelling only this run.
/// SIGTERM or SIGHUP interrupt the run (it stays resumable) and end the chat.
async fn follow(mut handle: RunHandle, input: &mut Input, args: &ChatArgs) -> Result<RunOutcome, Failure> {
    let controller = handle.controller();
    let mut shown = Shown::new(Box::new(Human::new(args.agent.verbose)), Questions::new(args.agent.yes));
    let mut stopping = false;
    loop {
        tokio::select! {
            event = handle.next_event() => {
                let Some(event) = event else { break };
                if let Some(err) = shown.event(&controller, &event, &mut input.lines) {
                    // The terminal is gone: stop the task resumably, end the chat.
                    if !stopping {
                        stopping = true;
                        controller.interrupt(format!("loom's output failed: {err}"));
                        input.quit = Some(Signal::Hangup);
                    }
                }
            }
            line = input.lines.recv(), if shown.asking() => shown.answer(&controller, line),
            signal = input.signals.recv(), if !stopping => {
                stopping = true;
                if signal == Signal::Interrupt {
                    say!("\nloom: cancelling this answer (the session goes on)");
                    controller.cancel("interrupted by the user (Ctrl-C)");
                } else {
                    say!("\nloom: {}: stopping this task; /resume or `loom runs resume {}` continues it", signal.name(), controller.run_id());
                    controller.interrupt(format!("loom received {}", signal.name()));
                    input.quit = Some(signal);
                }
            }
        }
    }
    let outcome = handle.outcome().await;
    if args.agent.verbose {
        say_partial!("{}", crate::render::summary(&outcome));
    }
    match outcome.status {
        RunStatus::Done | RunStatus::Canceled | RunStatus::Interrupted => {}
        status => say!("loom: the task ended {}", status.as_str()),
    }
    Ok(outcome)
}

/// The terminal's input: lines typed on stdin and signals, each from one
/// stream kept for the whole chat, so nothing that arrives between two
/// waits is lost.
struct Input {
    lines: Lines,
    signals: Signals,
    /// A signal that ends the chat (SIGTERM, SIGHUP) came.
    quit: Option<Signal>,
}

impl Input {
    fn open() -> std::io::Result<Self> {
        Ok(Self {
            lines: Lines::started(),
            signals: Signals::listen()?,
            quit: None,
        })
    }
}
