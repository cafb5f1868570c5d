//! `bash`: runs a shell command in the workspace, safely enough to offer a
//! model. The command runs with `bash -c`, stdin closed, in a session and
//! process group of its own that is killed as a whole ([`process`]), with
//! an environment cleared to an allowlist ([`env`]), in namespaces of its
//! own where they can be made ([`namespaces`]: its own processes, Loom's
//! state hidden) and, sandboxed, confined by Landlock inside them
//! ([`sandbox`]). Its output streams live as `tool.output` events
//! and comes back bounded: head and tail of each stream, with the number of
//! bytes dropped ([`capture`]).

mod capture;
pub mod env;
mod isolation;
pub mod namespaces;
pub(crate) mod privileges;
pub(crate) mod process;
pub mod sandbox;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use loom_core::{OutputStream, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::process::{ChildStderr, ChildStdout};

use capture::{HeadTail, LineSplitter};
pub use isolation::Isolation;
pub use namespaces::namespaces_available;
pub use privileges::make_process_undumpable;
use process::{ProcessGroup, KILL_GRACE};
use sandbox::Confinement;
pub use sandbox::{landlock_available, landlock_helper_main, SandboxMode};

/// How `bash` runs commands (`[tools.bash]` in loom.toml).
#[derive(Debug, Clone)]
pub struct BashSettings {
    /// A command's time limit when the call gives none (default 120 s).
    pub default_timeout: Duration,
    /// The most a call may ask for (default 600 s).
    pub max_timeout: Duration,
    /// Variables added to the allowlisted environment (secret-looking
    /// names are still left out).
    pub env: BTreeMap<String, String>,
    /// Landlock or none (default none).
    pub sandbox: SandboxMode,
    /// The bwrap program (default: the first of /usr/bin/bwrap, /bin/bwrap,
    /// /usr/local/bin/bwrap; never looked up through PATH).
    pub bwrap: Option<PathBuf>,
    /// Refuse to run a sandboxed command where namespaces cannot be made,
    /// instead of falling back to Landlock alone (default false).
    pub require_namespaces: bool,
    /// The program that applies Landlock inside the namespaces (the `loom`
    /// binary, see [`landlock_helper_main`]). Without it a sandboxed
    /// command gets the namespaces without the Landlock layer inside.
    pub landlock_helper: Option<PathBuf>,
    /// Bytes kept of each of stdout and stderr: half head, half tail
    /// (default 12 000).
    pub max_output_bytes: usize,
}

impl Default for BashSettings {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            env: BTreeMap::new(),
            sandbox: SandboxMode::None,
            bwrap: None,
            require_namespaces: false,
            landlock_helper: None,
            max_output_bytes: 12_000,
        }
    }
}

/// Arguments of `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command.
    pub command: String,
    /// Seconds before the command is stopped (default 120).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_secs: Option<u64>,
}

/// Runs shell commands in the workspace.
#[derive(Debug, Clone, Default)]
pub struct Bash {
    settings: BashSettings,
}

impl Bash {
    /// A `bash` tool with `settings`.
    pub fn new(settings: BashSettings) -> Self {
        Self { settings }
    }
}

/// How the command ended.
enum Ending {
    Exited(ExitStatus),
    TimedOut(Duration),
    Cancelled,
}

/// What one run of a command left: its ending and its two streams.
struct Finished {
    ending: Ending,
    stdout: HeadTail,
    stderr: HeadTail,
    elapsed: Duration,
}

impl Tool for Bash {
    type Args = BashArgs;

    fn name(&self) -> &str {
        "bash"
    }

    fn description(&self) -> &str {
        "Run a shell command with `bash -c` in the workspace; returns its exit code and output. \
         Stdin is closed."
    }

    /// A command bounds its own time (its `timeout_secs`, at most the
    /// configured maximum); a timeout set for `bash` by name still applies.
    fn bounds_own_time(&self) -> bool {
        true
    }

    async fn call(&self, args: BashArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let limit = match args.timeout_secs {
            Some(0) => {
                return Err(ToolError::InvalidArguments(
                    "timeout_secs must be at least 1".to_string(),
                ))
            }
            Some(secs) if Duration::from_secs(secs) > self.settings.max_timeout => {
                return Err(ToolError::InvalidArguments(format!(
                    "timeout_secs may be at most {}",
                    self.settings.max_timeout.as_secs()
                )))
            }
            Some(secs) => Duration::from_secs(secs),
            None => self.settings.default_timeout,
        };
        let settings = self.settings.clone();
        let (workspace, protected, read_only) = (ctx.workspace.clone(), ctx.protected.clone(), ctx.read_only.clone());
        // A private temp dir per call, the ruleset (which opens files) and
        // the namespace probe: file and process work, off the async threads.
        let prepared = tokio::task::spawn_blocking(move || prepare(&settings, &workspace, &protected, &read_only))
            .await
            .map_err(|err| ToolError::Failed(format!("could not prepare the command: {err}")))??;
        let env = env::command_env(&self.settings.env, prepared.tmp.path(), &ctx.workspace);
        let (mut child, group) = process::spawn(
            &prepared.launcher,
            &args.command,
            &ctx.workspace,
            &env,
            prepared.confinement.as_ref(),
            false,
        )
        .map_err(|err| ToolError::Failed(format!("could not start bash: {err}")))?;
        let finished = supervise(&mut child, group, &ctx, limit, self.settings.max_output_bytes).await;
        // Removing the temp dir may be heavy; it never delays the answer.
        let Prepared { tmp, note, .. } = prepared;
        tokio::task::spawn_blocking(move || drop(tmp));
        report(finished, &note)
    }
}

/// How a command given input ended, and what it printed ([`run_with_input`]).
#[derive(Debug)]
pub(crate) struct CommandRun {
    /// Its exit code; `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// It passed its time limit and its group was stopped.
    pub timed_out: bool,
    /// It was stopped because the run was cancelled.
    pub cancelled: bool,
    pub stdout: String,
    pub stderr: String,
    /// Bytes of stdout beyond what was kept.
    pub stdout_dropped: u64,
}

/// Runs `command` as `bash` runs a model's command — the same environment
/// rules, namespaces and sandbox, process group and time limit — with
/// `input` on its stdin (for a hook: docs/extending.md).
pub(crate) async fn run_with_input(
    settings: &BashSettings,
    command: &str,
    input: Vec<u8>,
    ctx: &ToolContext,
    limit: Duration,
    cap: usize,
) -> Result<CommandRun, String> {
    let owned = settings.clone();
    let (workspace, protected, read_only) = (ctx.workspace.clone(), ctx.protected.clone(), ctx.read_only.clone());
    let prepared = tokio::task::spawn_blocking(move || prepare(&owned, &workspace, &protected, &read_only))
        .await
        .map_err(|err| format!("could not prepare the command: {err}"))?
        .map_err(|err| err.to_string())?;
    let env = env::command_env(&settings.env, prepared.tmp.path(), &ctx.workspace);
    let (mut child, group) = process::spawn(
        &prepared.launcher,
        command,
        &ctx.workspace,
        &env,
        prepared.confinement.as_ref(),
        true,
    )
    .map_err(|err| format!("could not start bash: {err}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that never reads its input must not hold the call:
        // the write gives up when the pipe closes, and never outlives it.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&input).await;
        });
    }
    let finished = supervise(&mut child, group, ctx, limit, cap).await;
    let Prepared { tmp, .. } = prepared;
    tokio::task::spawn_blocking(move || drop(tmp));
    let (exit_code, timed_out, cancelled) = match finished.ending {
        Ending::Exited(status) => (status.code(), false, false),
        Ending::TimedOut(_) => (None, true, false),
        Ending::Cancelled => (None, false, true),
    };
    Ok(CommandRun {
        exit_code,
        timed_out,
        cancelled,
        stdout: finished.stdout.render(),
        stderr: finished.stderr.render(),
        stdout_dropped: finished.stdout.dropped(),
    })
}

struct Prepared {
    tmp: tempfile::TempDir,
    /// What starts `bash`: bwrap and its arguments, or nothing.
    launcher: Vec<OsString>,
    /// Landlock applied by Loom before `exec` (no namespaces).
    confinement: Option<Confinement>,
    /// How the command is confined, in words, for its result.
    note: String,
}

fn prepare(
    settings: &BashSettings,
    workspace: &Path,
    protected: &[PathBuf],
    read_only: &[PathBuf],
) -> Result<Prepared, ToolError> {
    let tmp = tempfile::Builder::new()
        .prefix("loom-bash-")
        .tempdir()
        .map_err(|err| ToolError::Failed(format!("could not create a temp dir: {err}")))?;
    let view = namespaces::View {
        mode: settings.sandbox,
        workspace,
        tmp: tmp.path(),
        protected,
        read_only,
        home: std::env::var_os("HOME").map(PathBuf::from),
    };
    let namespaces = namespaces_available(settings.bwrap.as_deref());
    let (launcher, confinement, note) = match (settings.sandbox, namespaces) {
        (SandboxMode::None, Ok(bwrap)) => (
            view.bwrap_args(&bwrap, None),
            None,
            "none (own PID namespace; Loom's state hidden)".to_string(),
        ),
        // Uid 0 without namespaces would write the kernel's settings
        // (`/proc/sys/kernel/core_pattern`: a program the kernel runs as
        // real root on the next crash), capabilities or not.
        (SandboxMode::None, Err(why)) if namespaces::is_root() => {
            return Err(ToolError::Failed(format!(
                "{why}; Loom runs as root, and without namespaces a command could write the kernel's settings, so it was not run (install bubblewrap, or set [tools.bash] sandbox = \"landlock\")"
            )));
        }
        (SandboxMode::None, Err(why)) => (Vec::new(), None, format!("none (Loom's state NOT hidden: {why})")),
        (SandboxMode::Landlock, Ok(bwrap)) => {
            // Landlock is checked here too: the helper would only fail
            // inside, with a less clear message.
            let abi = sandbox::landlock_available().map_err(|why| {
                ToolError::Failed(format!("{why}; the sandbox is required, so the command was not run"))
            })?;
            match &settings.landlock_helper {
                Some(helper) => {
                    let mut launcher = view.bwrap_args(&bwrap, Some(helper));
                    launcher.extend([
                        OsString::from(namespaces::HELPER_INSIDE),
                        OsString::from("__landlock"),
                        workspace.as_os_str().to_os_string(),
                        tmp.path().as_os_str().to_os_string(),
                        OsString::from("--"),
                    ]);
                    (
                        launcher,
                        None,
                        format!("namespaces + landlock (ABI {abi}; no network, no other processes)"),
                    )
                }
                None => (
                    view.bwrap_args(&bwrap, None),
                    None,
                    "namespaces (no network, no other processes; no Landlock layer: no helper)".to_string(),
                ),
            }
        }
        (SandboxMode::Landlock, Err(why)) if settings.require_namespaces => {
            return Err(ToolError::Failed(format!(
                "{why}; namespaces are required ([tools.bash] require_namespaces), so the command was not run"
            )));
        }
        (SandboxMode::Landlock, Err(why)) => {
            let confinement =
                Confinement::build(workspace, tmp.path()).map_err(|err| ToolError::Failed(err.to_string()))?;
            let network = if confinement.network_blocked {
                "network blocked"
            } else {
                "network allowed: kernel too old"
            };
            let note = format!(
                "landlock-only (ABI {}, {network}; other processes and Loom's state NOT hidden: {why})",
                confinement.abi
            );
            (Vec::new(), Some(confinement), note)
        }
    };
    Ok(Prepared {
        tmp,
        launcher,
        confinement,
        note,
    })
}

/// Reads both streams while the command runs, and stops its group on
/// timeout or cancel. Returns once the group is gone (or its pipes are
/// given up on).
async fn supervise(
    child: &mut tokio::process::Child,
    mut group: ProcessGroup,
    ctx: &ToolContext,
    limit: Duration,
    cap: usize,
) -> Finished {
    let started = Instant::now();
    let mut streams = Streams::new(child.stdout.take(), child.stderr.take(), cap);
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let ending = loop {
        tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => {
                group.terminate(child, Duration::from_millis(200)).await;
                break Ending::Cancelled;
            }
            _ = &mut deadline => {
                group.terminate(child, KILL_GRACE).await;
                break Ending::TimedOut(limit);
            }
            // Before the reads: a background job flooding the pipes must
            // not hide that the command itself has ended.
            status = child.wait() => match status {
                Ok(status) => break Ending::Exited(status),
                Err(_) => {
                    group.terminate(child, KILL_GRACE).await;
                    break Ending::Exited(ExitStatus::from_raw(1 << 8));
                }
            },
            _ = streams.next(ctx), if streams.open() => {}
        }
    };
    // The leader is gone. Output still in the pipes is read; a process
    // left in the group (a background job holding the pipes) gets a short
    // while, then the group is stopped so the pipes close.
    let linger = tokio::time::sleep(Duration::from_millis(300));
    tokio::pin!(linger);
    while streams.open() {
        tokio::select! {
            _ = streams.next(ctx) => {}
            _ = &mut linger => break,
        }
    }
    group.kill_rest();
    // A process that escaped the group (its own setsid) may still hold a
    // pipe: read what is there, then give up on it.
    let give_up = tokio::time::sleep(Duration::from_millis(200));
    tokio::pin!(give_up);
    while streams.open() {
        tokio::select! {
            _ = streams.next(ctx) => {}
            _ = &mut give_up => break,
        }
    }
    streams.finish(ctx);
    Finished {
        ending,
        stdout: streams.stdout.kept,
        stderr: streams.stderr.kept,
        elapsed: started.elapsed(),
    }
}

/// One output stream: its pipe (until EOF), what is kept, and the lines
/// still to stream.
struct StreamState<R> {
    pipe: Option<R>,
    kept: HeadTail,
    lines: LineSplitter,
    which: OutputStream,
}

impl<R: tokio::io::AsyncRead + Unpin> StreamState<R> {
    fn new(pipe: Option<R>, cap: usize, which: OutputStream) -> Self {
        Self {
            pipe,
            kept: HeadTail::new(cap),
            lines: LineSplitter::default(),
            which,
        }
    }

    fn take(&mut self, bytes: &[u8], ctx: &ToolContext) {
        self.kept.push(bytes);
        if let Some(text) = self.lines.feed(bytes) {
            ctx.stream_output(self.which, text);
        }
    }
}

struct Streams {
    stdout: StreamState<ChildStdout>,
    stderr: StreamState<ChildStderr>,
    buf_out: Vec<u8>,
    buf_err: Vec<u8>,
}

impl Streams {
    fn new(stdout: Option<ChildStdout>, stderr: Option<ChildStderr>, cap: usize) -> Self {
        Self {
            stdout: StreamState::new(stdout, cap, OutputStream::Stdout),
            stderr: StreamState::new(stderr, cap, OutputStream::Stderr),
            buf_out: vec![0; 8192],
            buf_err: vec![0; 8192],
        }
    }

    fn open(&self) -> bool {
        self.stdout.pipe.is_some() || self.stderr.pipe.is_some()
    }

    /// Reads once from whichever stream has data; false at EOF of one.
    /// Cancel-safe: a read that loses a race has taken nothing.
    async fn next(&mut self, ctx: &ToolContext) -> bool {
        let Self {
            stdout,
            stderr,
            buf_out,
            buf_err,
        } = self;
        let out = async {
            match stdout.pipe.as_mut() {
                Some(pipe) => pipe.read(buf_out).await,
                None => std::future::pending().await,
            }
        };
        let err = async {
            match stderr.pipe.as_mut() {
                Some(pipe) => pipe.read(buf_err).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = out => match read {
                Ok(n) if n > 0 => { stdout.take(&buf_out[..n], ctx); true }
                _ => { stdout.pipe = None; false }
            },
            read = err => match read {
                Ok(n) if n > 0 => { stderr.take(&buf_err[..n], ctx); true }
                _ => { stderr.pipe = None; false }
            },
        }
    }

    /// Streams what is left of unfinished lines.
    fn finish(&mut self, ctx: &ToolContext) {
        for (lines, which) in [
            (&mut self.stdout.lines, OutputStream::Stdout),
            (&mut self.stderr.lines, OutputStream::Stderr),
        ] {
            if let Some(text) = lines.finish() {
                ctx.stream_output(which, text);
            }
        }
    }
}

/// The result the model reads: how it ended, then each stream.
fn report(finished: Finished, sandbox: &str) -> Result<ToolOutput, ToolError> {
    let Finished {
        ending,
        stdout,
        stderr,
        elapsed,
    } = finished;
    let (status, ok) = match ending {
        Ending::Exited(status) => match (status.code(), status.signal()) {
            (Some(code), _) => (format!("exit code {code}"), code == 0),
            (None, Some(signal)) => (format!("killed by signal {signal}"), false),
            (None, None) => ("ended".to_string(), false),
        },
        Ending::TimedOut(limit) => (
            format!(
                "timed out after {} s: the command and every process it started were stopped",
                limit.as_secs()
            ),
            false,
        ),
        Ending::Cancelled => return Err(ToolError::Cancelled),
    };
    // What the model needs first — how it ended and what it printed. What
    // held the command in is said on the first line of a success, apart
    // from the output a small model copies into the file it writes; and on
    // the last line of a failure, where it is not taken for the point of
    // the result (and echoed as the answer).
    let seconds = elapsed.as_secs_f64();
    let mut text = if ok {
        format!("{status} ({seconds:.1} s; sandbox: {sandbox})\n")
    } else {
        format!("{status} ({seconds:.1} s)\n")
    };
    for (name, kept) in [("stdout", &stdout), ("stderr", &stderr)] {
        let shown = kept.render();
        if shown.is_empty() {
            continue;
        }
        text.push_str(&format!("--- {name}"));
        if kept.dropped() > 0 {
            text.push_str(&format!(" ({} bytes dropped)", kept.dropped()));
        }
        text.push_str(" ---\n");
        text.push_str(&shown);
        if !shown.ends_with('\n') {
            text.push('\n');
        }
    }
    if stdout.render().is_empty() && stderr.render().is_empty() {
        text.push_str("(no output)\n");
    }
    if !ok {
        text.push_str(&format!("[sandbox: {sandbox}]\n"));
    }
    if ok {
        Ok(text.into())
    } else {
        Err(ToolError::Failed(text))
    }
}
