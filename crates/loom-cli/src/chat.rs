//! `loom chat`: an interactive session in the terminal. Each line is a task
//! in one conversation; answers stream, tool calls show as lines, risky
//! tools ask first, Ctrl-C cancels the answer in progress but keeps the
//! session, `/new` starts a new conversation and `/exit` (or Ctrl-D) quits.
//! With a store the session is recorded and `--session ID` continues it
//! after a restart.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use loom::{Agent, EventKind, Message, PermissionDecision, RunRequest, RunStatus};
use tokio::sync::mpsc;

use crate::cli::ChatArgs;
use crate::permissions;
use crate::render::{summarize_args, Human, Renderer};
use crate::run::{build_agent, Failure};

const HELP: &str = "Type a task and press Enter. Commands: /new starts a new conversation, \
/session shows its id, /exit quits (so does Ctrl-D). Ctrl-C cancels the answer in progress.";

pub async fn chat(args: ChatArgs) -> Result<ExitCode, Failure> {
    let agent = build_agent(&args.agent, &args.place, None)
        .await
        .map_err(Failure::Usage)?;
    let mut session = Session::open(&agent, args.session.clone()).await?;
    let mut lines = LineReader::spawn();
    eprintln!("loom chat — session {}. {HELP}", session.id);
    if session.earlier > 0 {
        eprintln!(
            "loom: continuing the conversation ({} earlier messages)",
            session.earlier
        );
    }

    loop {
        prompt();
        let line = tokio::select! {
            line = lines.next() => line,
            signal = tokio::signal::ctrl_c() => {
                signal.context("cannot listen for Ctrl-C")?;
                eprintln!("\n(no answer is running: type /exit or press Ctrl-D to quit)");
                continue;
            }
        };
        let Some(line) = line else { break };
        match line.trim() {
            "" => {}
            "/exit" | "/quit" => break,
            "/help" => eprintln!("{HELP}"),
            "/session" => eprintln!("session {}", session.id),
            "/new" => {
                session = Session::fresh();
                eprintln!("loom: new conversation, session {}", session.id);
            }
            command if command.starts_with('/') => {
                eprintln!("loom: unknown command {command}; /help lists them")
            }
            task => one_task(&agent, &mut session, task, &mut lines, &args).await?,
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

/// The conversation the next task continues.
struct Session {
    id: String,
    /// Messages loaded from the store when the chat started.
    earlier: usize,
    /// The conversation kept in memory when there is no store.
    history: Vec<Message>,
}

impl Session {
    async fn open(agent: &Agent, id: Option<String>) -> Result<Self, Failure> {
        let Some(id) = id else { return Ok(Self::fresh()) };
        let earlier = match agent.store() {
            Some(store) => loom::store::session_history(store.as_ref(), &id)
                .await
                .map_err(|err| Failure::Runtime(anyhow::anyhow!("{err}")))?
                .len(),
            None => 0,
        };
        Ok(Self {
            id,
            earlier,
            history: Vec::new(),
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
        }
    }
}

/// Runs one task of the conversation to its end.
async fn one_task(
    agent: &Agent,
    session: &mut Session,
    task: &str,
    lines: &mut LineReader,
    args: &ChatArgs,
) -> Result<(), Failure> {
    let with_store = agent.store().is_some();
    let mut handle = agent.run(RunRequest {
        prompt: task.to_string(),
        session_id: Some(session.id.clone()),
        // With a store the run loads the session's conversation itself.
        history: (!with_store).then(|| session.history.clone()),
        ..RunRequest::default()
    });
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
                        ask(&shown, lines).await?
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
            signal = tokio::signal::ctrl_c(), if !cancelling => {
                signal.context("cannot listen for Ctrl-C")?;
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
    if !with_store {
        // Everything but the system prompt, which each run writes anew.
        session.history = outcome.messages.into_iter().skip(1).collect();
    }
    Ok(())
}

/// Asks on the terminal; `None` when Ctrl-C was pressed instead.
async fn ask(shown: &str, lines: &mut LineReader) -> Result<Option<PermissionDecision>, Failure> {
    loop {
        permissions::ask(shown);
        let line = tokio::select! {
            line = lines.next() => line,
            signal = tokio::signal::ctrl_c() => {
                signal.context("cannot listen for Ctrl-C")?;
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

/// Lines typed on stdin, read on a thread of their own so that waiting for
/// the next line never blocks the runtime (and Ctrl-C stays responsive).
struct LineReader {
    rx: mpsc::UnboundedReceiver<String>,
}

impl LineReader {
    fn spawn() -> Self {
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
        Self { rx }
    }

    /// The next line; `None` at the end of input.
    async fn next(&mut self) -> Option<String> {
        self.rx.recv().await
    }
}
