//! No program Loom starts gets a privilege, and nothing of Loom's own can
//! be read from one (docs/security.md, "A hostile model"): run as root,
//! as Loom is in most containers, a command (`bash`, sandboxed or not) and
//! a stdio MCP server have no capability, `no_new_privs`, a PID namespace
//! of their own, and the kernel's settings read-only — a root command
//! that could write `/proc/sys/kernel/core_pattern` would have the kernel
//! run its program as real root outside every namespace. Loom itself is
//! not dumpable: another process of its user cannot read its environment.
//! A served gateway sandboxes commands unless its operator says otherwise.
//! Judged from outside: what the commands print, what a server wrote.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;
use std::time::Duration;

use common::gateway::{config, Gateway, ALICE};
use common::{json_lines, loom_in, tool_results};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::json;

const API_KEY: &str = "sk-privilegemarker0123456789abcdefgh";
const GATEWAY_TOKEN: &str = "token-privilege-marker-4444444444";

fn require_bwrap() {
    let found = std::process::Command::new("bwrap").arg("--version").output();
    assert!(
        found.is_ok_and(|out| out.status.success()),
        "bwrap is not installed: these tests need `apt-get install -y bubblewrap` (.ci/run does it)"
    );
}

fn is_root() -> bool {
    // SAFETY: a plain system call.
    unsafe { libc::geteuid() == 0 }
}

/// What a command finds of its privileges and of the kernel's settings,
/// one `NAME VALUE` line each. `[ -w ]` asks the kernel (a read-only
/// mount answers no, even to root); the write puts back the value that is
/// there, so on a machine where it lands nothing changes.
const PROBE: &str = "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; \
    for f in /proc/sys/kernel/core_pattern /proc/sysrq-trigger /proc/sys/kernel/modprobe /sys/kernel/uevent_helper /sys/kernel/mm; do \
      if [ -w \"$f\" ]; then echo \"writable $f\"; fi; done; \
    v=$(cat /proc/sys/kernel/core_pattern); \
    if (printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern) 2>/dev/null; then echo 'wrote core_pattern'; fi; \
    for d in /opt /srv; do if [ -n \"$(ls -A $d 2>/dev/null)\" ]; then echo \"sees $d\"; fi; done; \
    echo \"pid $$\"";

/// The probe's findings that say a privilege was had.
fn privileges_seen(output: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for line in output.lines() {
        let line = line.trim();
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            match name {
                "NoNewPrivs" if value != "1" => seen.push(line.to_string()),
                "CapEff" | "CapPrm" | "CapBnd" | "CapAmb" if value != "0000000000000000" => seen.push(line.to_string()),
                _ => {}
            }
        }
        if line.starts_with("writable ") || line.starts_with("wrote ") {
            seen.push(line.to_string());
        }
    }
    seen
}

#[test]
fn no_command_gets_a_privilege_nor_writes_the_kernels_settings_in_any_mode() {
    require_bwrap();
    for sandbox in ["landlock", "none"] {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let config_path = dir.path().join("loom.toml");
        std::fs::write(&config_path, format!("[tools.bash]\nsandbox = \"{sandbox}\"\n")).unwrap();
        let script = dir.path().join("s.json");
        let turns = json!([
            {"tool_calls": [{"name": "bash", "arguments": {"command": PROBE}}]},
            {"content": "done"}
        ]);
        std::fs::write(&script, turns.to_string()).unwrap();
        let output = loom_in(&ws)
            .env("LOOM_STATE_DIR", dir.path().join("state"))
            .args(["run", "--json", "--yes", "--config"])
            .arg(&config_path)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .arg("probe")
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let results = tool_results(&json_lines(&output.stdout));
        let content = &results[0].1;
        assert!(content.contains("CapEff:"), "{sandbox}: the probe ran: {content}");
        assert_eq!(
            privileges_seen(content),
            Vec::<String>::new(),
            "{sandbox} (root: {}): {content}",
            is_root()
        );
        assert!(
            content.lines().any(|line| line == "pid 1" || line == "pid 2"),
            "{sandbox}: own PID namespace: {content}"
        );
        if sandbox == "landlock" {
            // The sandboxed view holds the system's programs, no one's files.
            assert!(!content.contains("sees "), "{sandbox}: {content}");
        }
    }
}

#[test]
fn a_stdio_mcp_server_sees_neither_loom_nor_its_environment_and_has_no_privilege() {
    require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let state = dir.path().join("state");
    let found = dir.path().join("found.txt");
    // The server reads its parent's environment and command line (Loom's,
    // were it the parent) and every process's it can see, then its own
    // privileges; then exits (its start fails, which is fine).
    let snoop = format!(
        "{{ cat /proc/$PPID/environ /proc/$PPID/cmdline; for f in /proc/[0-9]*/environ; do cat $f; done; \
         ls {state}; {PROBE}; }} > {found} 2>&1",
        state = state.display(),
        found = found.display()
    );
    let config_path = dir.path().join("operator.toml");
    std::fs::write(
        &config_path,
        format!(
            "[mcp.servers.snoop]\ncommand = \"sh\"\nargs = [\"-c\", {}]\nstartup_timeout_secs = 5\n",
            serde_json::to_string(&snoop).unwrap()
        ),
    )
    .unwrap();
    let output = loom_in(&ws)
        .env("LOOM_STATE_DIR", &state)
        .env("OPENAI_API_KEY", API_KEY)
        .env("LOOM_TOKEN", GATEWAY_TOKEN)
        .args(["mcp", "list", "--config"])
        .arg(&config_path)
        .arg("--workspace")
        .arg(&ws)
        .output()
        .unwrap();
    let seen = std::fs::read_to_string(&found).unwrap_or_else(|err| {
        panic!(
            "the server did not run ({err}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    for secret in [API_KEY, GATEWAY_TOKEN, "--config"] {
        assert!(!seen.contains(secret), "{secret} reached the MCP server:\n{seen}");
    }
    assert!(seen.contains("CapEff:"), "{seen}");
    assert_eq!(privileges_seen(&seen), Vec::<String>::new(), "{seen}");
    // Loom's state is an empty mount in its view (its path is no secret:
    // bwrap's arguments name it).
    assert!(!seen.lines().any(|line| line.trim() == "workspaces"), "{seen}");
}

/// The same user without capabilities (as any non-root user is, and as a
/// program Loom starts is): for such a pair only Loom's being dumpable
/// decides whether one may read the other's `/proc/PID/environ` (a root
/// reader with `CAP_SYS_PTRACE` always may; a reader without it never may
/// read a process that has capabilities it lacks).
fn without_capabilities(program: &std::ffi::OsStr) -> std::process::Command {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"])
        .arg(program);
    cmd
}

/// `loom serve` without capabilities, `LOOM_TOKEN` in its environment;
/// its pid.
fn serving(dir: &Path) -> (std::process::Child, u32) {
    std::fs::write(dir.join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    let loom = std::env::var_os("LOOM_BIN").unwrap_or_else(|| assert_cmd::cargo::cargo_bin("loom").into_os_string());
    let mut child = without_capabilities(&loom)
        .current_dir(dir)
        .env_remove("OPENAI_API_KEY")
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("LOOM_STATE_DIR", dir.join("state"))
        .env("LOOM_PLACES", dir.join("places"))
        .env("LOOM_TOKEN", GATEWAY_TOKEN)
        .env("OPENAI_API_KEY", API_KEY)
        .args(["serve", "--addr", "127.0.0.1:0", "--model", "scripted:s.json"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = common::listening(child.stderr.take().unwrap());
    assert!(
        rx.recv_timeout(Duration::from_secs(30)).is_ok(),
        "loom serve did not start"
    );
    // setpriv execs loom: the same process.
    let pid = child.id();
    (child, pid)
}

#[test]
fn another_process_of_the_user_cannot_read_looms_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, pid) = serving(dir.path());
    let read = without_capabilities(std::ffi::OsStr::new("cat"))
        .arg(format!("/proc/{pid}/environ"))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let environ = String::from_utf8_lossy(&read.stdout);
    assert!(!environ.contains(GATEWAY_TOKEN), "LOOM_TOKEN was read: {environ}");
    assert!(!environ.contains(API_KEY), "the API key was read: {environ}");
    assert!(!read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_gateways_commands_are_sandboxed_unless_its_operator_says_none() {
    require_bwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    // Default: bash allowed, nothing said of the sandbox.
    let dir = tempfile::tempdir().unwrap();
    let config_path = config(dir.path(), &model.url(), "");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, format!("{text}\n[permissions]\nbash = \"allow\"\n")).unwrap();
    let gateway = Gateway::start(dir.path(), &[]);
    assert!(
        !gateway.log_text().contains("sandbox = \"none\""),
        "{}",
        gateway.log_text()
    );
    let mut client = gateway.ws(ALICE).await;
    let started = client
        .ok(
            "agent.run",
            json!({"prompt": "steps=1 tool=bash bash=ls+-d+/opt+/proc/self"}),
        )
        .await;
    let run_id = started["runId"].as_str().unwrap().to_string();
    let result = client.until(&run_id, "tool.result").await;
    let content = result["payload"]["content"].as_str().unwrap();
    assert!(content.contains("sandbox: namespaces + landlock"), "{content}");
    assert!(
        content.contains("/proc/self") && !content.contains("/opt\n"),
        "{content}"
    );
    drop(client);
    drop(gateway);

    // The operator's `sandbox = "none"`: taken, with a warning at start.
    let dir = tempfile::tempdir().unwrap();
    let config_path = config(dir.path(), &model.url(), "");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        format!("{text}\n[permissions]\nbash = \"allow\"\n[tools.bash]\nsandbox = \"none\"\n"),
    )
    .unwrap();
    let gateway = Gateway::start(dir.path(), &[]);
    let log = gateway.log_text();
    assert!(
        log.contains("sandbox = \"none\"") && log.contains("unconfined"),
        "no warning at start: {log}"
    );
    let mut client = gateway.ws(ALICE).await;
    let started = client
        .ok("agent.run", json!({"prompt": "steps=1 tool=bash bash=true"}))
        .await;
    let run_id = started["runId"].as_str().unwrap().to_string();
    let result = client.until(&run_id, "tool.result").await;
    let content = result["payload"]["content"].as_str().unwrap();
    assert!(content.contains("sandbox: none (own PID namespace"), "{content}");
}

#[test]
fn a_hook_gets_no_privilege_either() {
    require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let found = dir.path().join("found.txt");
    let config_path = dir.path().join("operator.toml");
    std::fs::write(
        &config_path,
        format!(
            "[[hooks]]\nevent = \"session_start\"\ncommand = {}\n",
            serde_json::to_string(&format!("{{ {PROBE}; }} > {} 2>&1", found.display())).unwrap()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("s.json"), r#"[{"content":"done"}]"#).unwrap();
    let output = loom_in(&ws)
        .env("LOOM_STATE_DIR", dir.path().join("state"))
        .args(["run", "--config"])
        .arg(&config_path)
        .arg("--model")
        .arg(format!("scripted:{}", dir.path().join("s.json").display()))
        .arg("x")
        .output()
        .unwrap();
    let seen = std::fs::read_to_string(&found).unwrap_or_else(|err| {
        panic!(
            "the hook did not run ({err}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert!(seen.contains("CapEff:"), "{seen}");
    assert_eq!(privileges_seen(&seen), Vec::<String>::new(), "{seen}");
}

/// A hidden place that is a link (an operator's `--config` linked from
/// elsewhere, a state base reached through a link) is hidden where it
/// leads; it keeps no stdio MCP server from starting.
#[test]
fn an_mcp_server_starts_when_a_hidden_place_is_a_link() {
    require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir_all(real.join("state")).unwrap();
    std::fs::write(
        real.join("operator.toml"),
        loom_testkit::mcp_servers::fixture().toml("fixture", &[], ""),
    )
    .unwrap();
    std::os::unix::fs::symlink(real.join("operator.toml"), dir.path().join("operator.toml")).unwrap();
    std::os::unix::fs::symlink(real.join("state"), dir.path().join("state")).unwrap();
    let output = loom_in(&ws)
        .env("LOOM_STATE_DIR", dir.path().join("state"))
        .args(["mcp", "list", "--config"])
        .arg(dir.path().join("operator.toml"))
        .arg("--workspace")
        .arg(&ws)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("fixture  ready"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_hooks_run_unconfined_says_so_even_without_bash() {
    let model = PromptModel::start(PromptModelOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let config_path = config(dir.path(), &model.url(), "");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        format!("{text}\n[tools.bash]\nenabled = false\nsandbox = \"none\"\n[[hooks]]\nevent = \"stop\"\ncommand = \"true\"\n"),
    )
    .unwrap();
    let gateway = Gateway::start(dir.path(), &[]);
    let log = gateway.log_text();
    assert!(
        log.contains("sandbox = \"none\"") && log.contains("hooks"),
        "no warning at start: {log}"
    );
}
