//! The `loom` command as every CLI test starts it.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

/// `loom`, with nothing from the developer's environment leaking in: no
/// model, no provider keys or addresses, a config directory that does not exist.
pub(crate) fn loom() -> Command {
    let mut cmd = Command::new(binary());
    isolate(&mut cmd);
    cmd
}

/// The binary under test: this build's `loom`, or `LOOM_BIN` (to run these
/// tests against another build, e.g. an older commit's).
fn binary() -> std::path::PathBuf {
    std::env::var_os("LOOM_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| assert_cmd::cargo::cargo_bin("loom"))
}

/// Removes the developer's model and provider settings from `cmd`.
fn isolate(cmd: &mut Command) {
    for var in [
        "LOOM_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "LOOM_REDIS_URL",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("XDG_CONFIG_HOME", "/nonexistent-loom-test");
    // Loom's state goes to a directory of this test process, not the
    // developer's ~/.local/state (each workspace has its own under it).
    cmd.env("LOOM_STATE_DIR", state_base());
    // The list of every Loom's places is this test process's own: the
    // machine's would gather every test's state base.
    cmd.env("LOOM_PLACES", state_base().join("places"));
}

/// The state base every `loom` of this test process uses.
pub(crate) fn state_base() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("loom-test-state-{}", std::process::id()))
}

/// The run database of `workspace` in Loom's state directory: under
/// `workspaces/`, the workspace's last component (other characters than
/// letters, digits, `-` and `_` as `_`) and 16 hex digits of the SHA-256
/// of its canonical path (docs/security.md).
pub(crate) fn database_of(workspace: &Path) -> std::path::PathBuf {
    use sha2::Digest;
    let real = workspace.canonicalize().unwrap();
    let name: String = real
        .file_name()
        .unwrap()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let digest = sha2::Sha256::digest(real.as_os_str().as_encoded_bytes());
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    state_base()
        .join("workspaces")
        .join(format!("{name}-{hash}"))
        .join("loom.db")
}

/// The same, run in `dir`, with `dir/xdg` as the user's config directory
/// and no standard input.
pub(crate) fn loom_in(dir: &Path) -> Command {
    let mut cmd = loom();
    cmd.current_dir(dir)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .stdin(Stdio::null());
    cmd
}

/// `loom ARGS` on a pseudo-terminal (util-linux `script`), with nothing from
/// the developer's environment leaking in; `loom_args` is shell-quoted by the
/// caller. `script` starts the command through `$SHELL -c`, and a shell that
/// stays as loom's parent (dash does) shares its process group, so Ctrl-C
/// would kill the shell and `script` would report 130 whatever loom did:
/// `exec` makes loom the terminal's only process, whichever shell runs it.
pub(crate) fn loom_on_a_terminal(loom_args: &str, script_flags: &str) -> Command {
    let loom = binary();
    let mut cmd = Command::new("script");
    cmd.args([
        script_flags,
        &format!("exec {} {loom_args}", loom.display()),
        "/dev/null",
    ])
    // The shell CI machines have: reproduce it everywhere.
    .env("SHELL", "/bin/sh");
    isolate(&mut cmd);
    cmd
}

/// The events of `events` of type `kind`.
pub(crate) fn of_type<'a>(events: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|event| event["type"] == kind).collect()
}

/// The JSON lines of `--json` output.
pub(crate) fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// Each `tool.result`'s (status, content), in order.
pub(crate) fn tool_results(events: &[serde_json::Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.result")
        .map(|e| {
            (
                e["status"].as_str().unwrap().to_string(),
                e["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Writes a scripted-model script to `dir/NAME` and returns `scripted:PATH`.
pub(crate) fn script_at(dir: &Path, name: &str, turns: &serde_json::Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, turns.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

/// Every text of a request body's messages (OpenAI `content` strings, or the
/// text of Anthropic content blocks), one per message.
pub(crate) fn message_texts(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|message| match &message["content"] {
                    serde_json::Value::String(text) => text.clone(),
                    serde_json::Value::Array(blocks) => blocks
                        .iter()
                        .map(|block| {
                            block["text"]
                                .as_str()
                                .or_else(|| block["content"].as_str())
                                .unwrap_or_default()
                                .to_string()
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How many marked reminders (guidance blocks) a request body carries.
pub(crate) fn reminders(body: &serde_json::Value) -> usize {
    body.to_string().matches("<system-reminder>").count()
}

/// Runs `cmd` and checks it exited 0, showing its stderr when it did not.
pub(crate) fn succeeded(cmd: &mut Command) -> std::process::Output {
    let output = cmd.output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}
pub(crate) mod gateway;

/// Trusts `dir/loom.toml` as a person would (`loom trust`), so that its
/// settings that run commands or widen permissions take effect when loom
/// runs in `dir` (docs/security.md).
pub(crate) fn trust(dir: &Path) {
    succeeded(loom_in(dir).args(["trust", "loom.toml"]));
}

/// `loom run --model MODEL --base-url URL/v1` in `dir`, against a fake
/// OpenAI-compatible server at `url`, with a key and no terminal on
/// stdin; the caller adds flags and the task.
pub(crate) fn run_against(dir: &Path, url: &str, model: &str) -> Command {
    let mut cmd = loom_in(dir);
    cmd.env("OPENAI_API_KEY", "sk-test")
        .args(["run", "--model", model, "--base-url"])
        .arg(format!("{url}/v1"))
        .stdin(Stdio::null());
    cmd
}

/// Reads a `loom serve`'s `stderr` on a thread of its own (so it never
/// fills); the receiver hears once it says it is listening.
pub(crate) fn listening(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx
}
