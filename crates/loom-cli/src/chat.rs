//! `loom chat`: an interactive session in the terminal. Each line is a task
//! in one conversation; answers stream, tool calls show as lines, risky
//! tools ask first, Ctrl-C cancels the answer in progress but keeps the
//! session, `/new` starts a new conversation and `/exit` (or Ctrl-D) quits.
//! With a store the session is recorded: `--session ID` (or `--continue`)
//! continues it after a restart, and `/resume` finishes a task the last
//! process died in.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use loom::{Agent, EventKind, Message, PermissionDecision, RunHandle, RunOutcome, RunRequest, RunStatus};
use tokio::sync::mpsc;

use crate::cli::ChatArgs;
use crate::permissions;
use crate::render::{summarize_args, Human, Renderer};
use crate::run::{build_agent, Failure};

const HELP: &str = "Type a task and press Enter. Commands: /new starts a new conversation, \
/session shows its id, /resume continues a task interrupted by a crash, /exit quits (so does Ctrl-D). \
Ctrl-C cancels the answer in progress.";

pub async fn chat(args: ChatArgs) -> Result<ExitCode, Failure> {
    let agent = build_agent(&args.agent, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let session_id = match (&args.session, args.continue_last) {
        (Some(id), _) => Some(id.clone()),
        (None, true) => Some(latest_session(&agent).await?),
        (None, false) => None,
    };
    let mut session = Session::open(&agent, session_id).await?;
    let mut input = Input::open().context("cannot listen for Ctrl-C")?;
    eprintln!("loom chat — session {}. {HELP}", session.id);
    if session.earlier > 0 {
        eprintln!(
            "loom: continuing the conversation ({} earlier messages)",
            session.earlier
        );
    }
    if let Some(run_id) = &session.interrupted {
        eprintln!("loom: the last task (run {run_id}) was interrupted when its process died; /resume continues it");
    }

    loop {
        prompt();
        let line = tokio::select! {
            line = input.lines.recv() => line,
            () = input.interrupts.recv() => {
                eprintln!("\n(no answer is running: type /exit or press Ctrl-D to quit)");
                continue;
            }
        };
        let Some(line) = line else {
            // Ctrl-D: end the prompt's line before the goodbye.
            println!();
            break;
        };
        match line.trim() {
            "" => {}
            "/exit" | "/quit" => break,
            "/help" => eprintln!("{HELP}"),
            "/session" => eprintln!("session {}", session.id),
            "/resume" => resume_task(&agent, &mut session, &mut input, &args).await?,
            "/new" => {
                session = Session::fresh();
                eprintln!("loom: new conversation, session {}", session.id);
            }
            command if command.starts_with('/') => {
                eprintln!("loom: unknown command {command}; /help lists them")
            }
            task => one_task(&agent, &mut session, task, &mut input, &args).await?,
        }
    }
    if agent.store().is_some() {
        eprintln!(
            "loom: session {} is saved; continue it with `loom chat --session {}`",
            session.id, session.id
        );
    }
    Ok(ExitCode::SUCCESS)
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
        loom::store::recover_interrupted_runs(store.as_ref())
            .await
            .map_err(failed)?;
        let earlier = loom::store::session_history(store.as_ref(), &id)
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
) -> Result<(), Failure> {
    let with_store = agent.store().is_some();
    // A new task moves on from an interrupted one (it stays resumable with
    // `loom runs resume`).
    session.interrupted = None;
    let handle = agent.run(RunRequest {
        prompt: task.to_string(),
        session_id: Some(session.id.clone()),
        // With a store the run loads the session's conversation itself.
        history: (!with_store).then(|| session.history.clone()),
        ..RunRequest::default()
    });
    let outcome = follow(handle, input, args).await?;
    if !with_store {
        // Everything but the system prompt, which each run writes anew.
        session.history = outcome.messages.into_iter().skip(1).collect();
    }
    Ok(())
}

/// Continues the session's interrupted task (`/resume`).
async fn resume_task(agent: &Agent, session: &mut Session, input: &mut Input, args: &ChatArgs) -> Result<(), Failure> {
    let Some(run_id) = session.interrupted.take() else {
        eprintln!("loom: nothing to resume: the session's last task was not interrupted");
        return Ok(());
    };
    match agent.resume(&run_id).await {
        Ok(handle) => {
            eprintln!("loom: resuming run {run_id} from its last checkpoint");
            follow(handle, input, args).await?;
        }
        Err(err) => eprintln!("loom: cannot resume run {run_id}: {err}"),
    }
    Ok(())
}

/// Shows a run of the session until it ends: events rendered, permission
/// questions asked on the terminal, Ctrl-C cancelling only this run.
async fn follow(mut handle: RunHandle, input: &mut Input, args: &ChatArgs) -> Result<RunOutcome, Failure> {
    let controller = handle.controller();
    let mut renderer = Human::new(args.agent.verbose);
    let mut cancelling = false;
    loop {
        tokio::select! {
            event = handle.next_event() => {
                let Some(event) = event else { break };
                renderer.event(&event).context("cannot write output")?;
                if let EventKind::PermissionRequest { request_id, tool, args: call_args, .. } = &event.kind {
                    let shown = format!("{tool}({})", summarize_args(call_args));
                    let decision = if args.agent.yes {
                        eprintln!("  ? {shown}: allowed by --yes");
                        Some(PermissionDecision::Allow)
                    } else {
                        ask(&shown, input).await?
                    };
                    match decision {
                        Some(decision) => {
                            let _ = controller.respond_permission(request_id, decision);
                        }
                        None => {
                            cancelling = true;
                            controller.cancel("interrupted by the user (Ctrl-C)");
                        }
                    }
                }
            }
            () = input.interrupts.recv(), if !cancelling => {
                cancelling = true;
                eprintln!("\nloom: cancelling this answer (the session goes on)");
                controller.cancel("interrupted by the user (Ctrl-C)");
            }
        }
    }
    let outcome = handle.outcome().await;
    if args.agent.verbose {
        eprint!("{}", crate::render::summary(&outcome));
    }
    match outcome.status {
        RunStatus::Done | RunStatus::Canceled => {}
        status => eprintln!("loom: the task ended {}", status.as_str()),
    }
    Ok(outcome)
}

/// Asks on the terminal; `None` when Ctrl-C was pressed instead.
async fn ask(shown: &str, input: &mut Input) -> Result<Option<PermissionDecision>, Failure> {
    loop {
        permissions::ask(shown);
        let line = tokio::select! {
            line = input.lines.recv() => line,
            () = input.interrupts.recv() => {
                eprintln!();
                return Ok(None);
            }
        };
        let Some(line) = line else {
            return Ok(Some(PermissionDecision::Deny));
        };
        match permissions::parse_answer(&line) {
            Ok(decision) => return Ok(Some(decision)),
            Err(other) => eprintln!("loom: '{other}' is not an answer"),
        }
    }
}

fn prompt() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(b"\n> ").and_then(|()| out.flush());
}

/// The terminal's input: lines typed on stdin, read on a thread of their
/// own so that waiting for the next line never blocks the runtime, and
/// Ctrl-C. Interrupts are received from one signal stream kept for the
/// whole chat, so a Ctrl-C pressed between two waits is not lost.
struct Input {
    lines: mpsc::UnboundedReceiver<String>,
    interrupts: crate::interrupts::Interrupts,
}

impl Input {
    fn open() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line.trim_end_matches(['\n', '\r']).to_string()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Ok(Self {
            lines: rx,
            interrupts: crate::interrupts::Interrupts::listen()?,
        })
    }
}
