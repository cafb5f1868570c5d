//! One live session with an MCP server: the process (stdio) or the HTTP
//! transport, rmcp's client service, the drained stderr, and a token that
//! fires the moment the session ends (the server died or closed its end).

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, Command};
use tokio_util::sync::CancellationToken;

use super::config::Endpoint;
use crate::shell::env::INHERITED;
use crate::shell::process::{die_with_parent, ProcessGroup};
use crate::shell::Isolation;

/// Lines of a server's stderr kept for `loom mcp list` and start-up errors.
const STDERR_KEPT: usize = 20;

/// The protocol version Loom asks for: the newest with the `initialize`
/// handshake, which every server of the 2024–2025 generations answers.
const PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_06_18;

/// Receives what the server tells the client.
pub(crate) struct Handler {
    /// Called on `notifications/tools/list_changed`.
    pub on_tools_changed: Arc<dyn Fn() + Send + Sync>,
    /// Called when a stdio server's output carries that notification,
    /// before rmcp reads what follows it ([`ListChangedTap`]).
    pub on_list_changed_bytes: Arc<dyn Fn() + Send + Sync>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("loom", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(PROTOCOL)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        (self.on_tools_changed)();
    }
}

/// The last lines a server wrote to stderr.
#[derive(Debug, Default, Clone)]
pub(crate) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if lines.len() == STDERR_KEPT {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// A stdio server's process and its group.
struct ServerProcess {
    child: Child,
    group: ProcessGroup,
}

/// A live session.
pub(crate) struct Connection {
    pub peer: Peer<RoleClient>,
    /// Asks the service task to end the session.
    stop: CancellationToken,
    /// Fires when the session ends, for whatever reason.
    pub closed: CancellationToken,
    process: tokio::sync::Mutex<Option<ServerProcess>>,
    pub started: Instant,
}

/// Why a session could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("could not start `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("no answer to `initialize` within {0:?}")]
    Timeout(Duration),
    #[error("the handshake failed: {0}")]
    Handshake(String),
    #[error("the server exited ({0}) before it answered `initialize`")]
    Exited(std::process::ExitStatus),
}

/// How a stdio server's process is started: its `env` beside the
/// allowlist, its folder, and what it is kept from.
#[derive(Clone, Copy)]
pub(crate) struct ProcessSetup<'a> {
    pub env: &'a std::collections::BTreeMap<String, String>,
    pub dir: &'a Path,
    pub isolation: &'a Isolation,
}

/// How long a server that broke the handshake gets to be seen exiting:
/// its exit status says more than the broken pipe that revealed it.
const EXIT_SEEN_WITHIN: Duration = Duration::from_millis(300);

/// rmcp's transport errors name Rust types (`Transport [rmcp::…<…>]
/// error: Broken pipe`); a person needs only the words around them. Only
/// a bracket that opens on `rmcp::` is dropped (an IPv6 address stays).
fn plain(error: impl std::fmt::Display) -> String {
    let text = error.to_string();
    let mut plain = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find("[rmcp::") {
        plain.push_str(&rest[..start]);
        // The matching `]`: type names nest brackets (`[u8]`).
        let mut depth = 0usize;
        let end = rest[start..].char_indices().find_map(|(i, c)| {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(start + i + 1);
                    }
                }
                _ => {}
            }
            None
        });
        match end {
            Some(end) => rest = &rest[end..],
            // Unbalanced: keep the text as it is.
            None => {
                plain.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    plain.push_str(rest);
    plain.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Connection {
    /// Starts a session: spawns the process (stdio) or connects (HTTP),
    /// then runs the `initialize` handshake within `limit`.
    pub(crate) async fn open(
        name: &str,
        endpoint: &Endpoint,
        process: ProcessSetup<'_>,
        handler: Handler,
        stderr: StderrTail,
        limit: Duration,
    ) -> Result<Self, ConnectError> {
        let ProcessSetup { env, dir, isolation } = process;
        match endpoint {
            Endpoint::Stdio { command, args } => {
                // Its own PID namespace, Loom's state hidden, no privilege
                // (shell/isolation.rs); without bwrap, no privilege still.
                // The program is found first, as the process would find it:
                // one that is not there is said as such, not as bwrap's failure.
                let env = server_env(env);
                let (launcher, program) = {
                    let (isolation, dir, command, search) =
                        (isolation.clone(), dir.to_path_buf(), command.clone(), env.clone());
                    tokio::task::spawn_blocking(move || {
                        (isolation.launcher(&dir), find_program(&command, &dir, &search))
                    })
                    .await
                    .map_err(|err| ConnectError::Handshake(format!("could not prepare the process: {err}")))?
                };
                let program = program.map_err(|source| ConnectError::Spawn {
                    command: command.clone(),
                    source,
                })?;
                let unprivileged = launcher.is_err();
                if let Err(why) = &launcher {
                    tracing::warn!(
                        server = name,
                        "started without namespaces (Loom's state NOT hidden): {why}"
                    );
                }
                let mut cmd = match launcher.as_deref().ok().and_then(|l| l.split_first()) {
                    Some((bwrap, rest)) => {
                        let mut cmd = Command::new(bwrap);
                        cmd.args(rest).arg(&program);
                        cmd
                    }
                    None => Command::new(&program),
                };
                cmd.args(args)
                    .current_dir(dir)
                    .env_clear()
                    .envs(env)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0);
                let parent = std::process::id() as libc::pid_t;
                // SAFETY: the closure only makes system calls (see die_with_parent
                // and privileges::drop_in_child).
                unsafe {
                    cmd.pre_exec(move || {
                        die_with_parent(parent)?;
                        if unprivileged {
                            crate::shell::privileges::drop_in_child()?;
                        }
                        Ok(())
                    });
                }
                let mut child = cmd.spawn().map_err(|source| ConnectError::Spawn {
                    command: command.clone(),
                    source,
                })?;
                let Some(pid) = child.id() else {
                    return Err(ConnectError::Handshake("the server exited at once".to_string()));
                };
                let group = ProcessGroup::new(pid as libc::pid_t);
                let drained = child
                    .stderr
                    .take()
                    .map(|err| tokio::spawn(drain_stderr(name.to_string(), err, stderr)));
                let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err(ConnectError::Handshake("the process has no pipes".to_string()));
                };
                let mut process = ServerProcess { child, group };
                let stdout = ListChangedTap::new(stdout, handler.on_list_changed_bytes.clone());
                match tokio::time::timeout(limit, handler.serve((stdout, stdin))).await {
                    Ok(Ok(running)) => Ok(Self::watch(running, Some(process))),
                    Ok(Err(err)) => {
                        let exited = tokio::time::timeout(EXIT_SEEN_WITHIN, process.child.wait()).await;
                        stop_process(process).await;
                        settle_stderr(drained).await;
                        Err(match exited {
                            Ok(Ok(status)) => ConnectError::Exited(status),
                            _ => ConnectError::Handshake(plain(err)),
                        })
                    }
                    Err(_) => {
                        stop_process(process).await;
                        settle_stderr(drained).await;
                        Err(ConnectError::Timeout(limit))
                    }
                }
            }
            Endpoint::Http { url } => {
                let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.as_str());
                match tokio::time::timeout(limit, handler.serve(transport)).await {
                    Ok(Ok(running)) => Ok(Self::watch(running, None)),
                    Ok(Err(err)) => Err(ConnectError::Handshake(plain(err))),
                    Err(_) => Err(ConnectError::Timeout(limit)),
                }
            }
        }
    }

    /// Keeps the service running and fires `closed` when it ends.
    fn watch(running: RunningService<RoleClient, Handler>, process: Option<ServerProcess>) -> Self {
        let peer = running.peer().clone();
        let stop = CancellationToken::new();
        let closed = CancellationToken::new();
        let (asked, fire) = (stop.clone(), closed.clone());
        tokio::spawn(async move {
            let service = running.cancellation_token();
            let waiting = running.waiting();
            tokio::pin!(waiting);
            tokio::select! {
                _ = &mut waiting => {}
                _ = asked.cancelled() => {
                    service.cancel();
                    let _ = waiting.await;
                }
            }
            fire.cancel();
        });
        Self {
            peer,
            stop,
            closed,
            process: tokio::sync::Mutex::new(process),
            started: Instant::now(),
        }
    }

    /// Whether the session still works.
    pub(crate) fn is_open(&self) -> bool {
        !self.closed.is_cancelled() && !self.peer.is_transport_closed()
    }

    /// Ends the session: closes the server's stdin, then SIGTERM and
    /// SIGKILL to its process group if it does not exit by itself.
    pub(crate) async fn shutdown(&self) {
        self.stop.cancel();
        if let Some(process) = self.process.lock().await.take() {
            stop_process(process).await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop.cancel();
        // A process not shut down gracefully is killed with its group by
        // `ProcessGroup`'s drop.
    }
}

/// A stdio server whose session has ended (which closed its stdin: rmcp
/// owned it) gets a second to exit, then SIGTERM and SIGKILL as a group.
async fn stop_process(mut process: ServerProcess) {
    let exited = tokio::time::timeout(Duration::from_secs(1), process.child.wait()).await;
    if exited.is_ok() && !process.group.alive() {
        process.group.kill_rest();
        return;
    }
    process
        .group
        .terminate(&mut process.child, crate::shell::process::KILL_GRACE)
        .await;
    process.group.kill_rest();
}

/// `command` as an executable file: a path (relative to `dir`) as it is,
/// a name looked up in the `PATH` of `env`, as `execvp` would.
fn find_program(command: &str, dir: &Path, env: &[(String, String)]) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    // Absolute: the program is started after a change into `dir`.
    let dir = &std::path::absolute(dir)?;
    if command.contains('/') {
        let path = dir.join(command);
        return if runnable(&path) {
            Ok(path)
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such executable file",
            ))
        };
    }
    let search = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, value)| value.as_str());
    std::env::split_paths(search)
        .map(|folder| dir.join(folder).join(command))
        .find(|path| runnable(path))
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "not found in PATH"))
}

/// The environment of a stdio server: the allowlist and its `env`.
fn server_env(extra: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = INHERITED
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect();
    env.extend(extra.iter().map(|(name, value)| (name.clone(), value.clone())));
    env.into_iter().collect()
}

/// Lets the stderr drain of a server that failed to start reach the end
/// (briefly): what the server said last explains the failure.
async fn settle_stderr(drained: Option<tokio::task::JoinHandle<()>>) {
    if let Some(drained) = drained {
        let _ = tokio::time::timeout(EXIT_SEEN_WITHIN, drained).await;
    }
}

/// Reads a server's stderr to the end so it never blocks on a full pipe;
/// each line goes to the log and the last few are kept.
async fn drain_stderr(server: String, mut stderr: ChildStderr, tail: StderrTail) {
    let mut buf = vec![0u8; 8192];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            log_line(&server, &line, &tail);
        }
        if pending.len() > 4096 {
            let line = std::mem::take(&mut pending);
            log_line(&server, &line, &tail);
        }
    }
    if !pending.is_empty() {
        log_line(&server, &pending, &tail);
    }
}

fn log_line(server: &str, line: &[u8], tail: &StderrTail) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    if text.is_empty() {
        return;
    }
    let shown: String = text.chars().take(500).collect();
    tracing::info!(target: "loom::mcp", server, "stderr: {shown}");
    tail.push(shown);
}

/// A stdio server's output on its way to rmcp, watched for
/// `notifications/tools/list_changed`. rmcp handles notifications in tasks
/// of their own, so the answer of the call that changed the list can reach
/// the run first; seeing the bytes here, before rmcp reads the answer that
/// follows them, lets the run wait for the new list.
///
/// The pattern includes the quotes: inside another JSON string they would
/// be escaped, so only a real `"method"` value matches.
struct ListChangedTap<R> {
    inner: R,
    carry: Vec<u8>,
    on_seen: Arc<dyn Fn() + Send + Sync>,
}

const LIST_CHANGED: &[u8] = b"\"notifications/tools/list_changed\"";

impl<R> ListChangedTap<R> {
    fn new(inner: R, on_seen: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self {
            inner,
            carry: Vec::new(),
            on_seen,
        }
    }

    /// Counts the pattern in `carry + bytes`, keeping the tail that could
    /// start the next one.
    fn scan(&mut self, bytes: &[u8]) {
        self.carry.extend_from_slice(bytes);
        let found = self
            .carry
            .windows(LIST_CHANGED.len())
            .filter(|w| *w == LIST_CHANGED)
            .count();
        for _ in 0..found {
            (self.on_seen)();
        }
        let keep = LIST_CHANGED.len() - 1;
        if self.carry.len() > keep {
            self.carry.drain(..self.carry.len() - keep);
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ListChangedTap<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            let read = buf.filled()[before..].to_vec();
            self.scan(&read);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn transport_errors_lose_their_type_names() {
        let rmcp = "Send message error Transport [rmcp::transport::async_rw::AsyncRwTransport<RoleClient, \
                    Tap<tokio::process::ChildStdout>, [u8]>] error: Broken pipe (os error 32), when send initialize request";
        assert_eq!(
            plain(rmcp),
            "Send message error Transport error: Broken pipe (os error 32), when send initialize request"
        );
        assert_eq!(plain("no brackets here"), "no brackets here");
        assert_eq!(
            plain("error sending request for url (http://[::1]:9000/mcp)"),
            "error sending request for url (http://[::1]:9000/mcp)"
        );
        assert_eq!(plain("cut [rmcp::Open<"), "cut [rmcp::Open<");
    }

    #[test]
    fn the_tap_sees_list_changed_across_reads_and_never_inside_a_string() {
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        let mut tap = ListChangedTap::new(
            (),
            Arc::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }),
        );
        tap.scan(br#"{"jsonrpc":"2.0","method": "notifications/tools/li"#);
        tap.scan(b"st_changed\"}\n");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        tap.scan(br#"{"result":{"content":[{"text":"say \"notifications/tools/list_changed\""}]}}"#);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }
}
