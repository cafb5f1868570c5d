//! The `bash` tool through its public `Tool` interface, with real processes:
//! output and exit status, process trees that never outlive a call, the
//! cleared environment, live output, and the sandbox (namespaces; the
//! Landlock layer inside them is checked through the `loom` binary).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use loom_core::{CancellationToken, OutputSink, OutputStream, Tool, ToolContext, ToolError};
use loom_tools::shell::{landlock_available, BashArgs};
use loom_tools::{Bash, BashSettings, SandboxMode};

fn ctx(root: &Path) -> ToolContext {
    ToolContext::new("c1", "r1".into(), Arc::from(root), CancellationToken::new())
}

fn command(text: &str, timeout_secs: Option<u64>) -> BashArgs {
    serde_json::from_value(serde_json::json!({"command": text, "timeout_secs": timeout_secs})).unwrap()
}

/// A `sleep` whose argument no other process has: commands run in a PID
/// namespace of their own, so the numbers they see (`$!`) are not this
/// process's; the test finds them on the host by this argument instead.
fn sleeper() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("sleep 300.{}{n:03}", std::process::id())
}

/// Whether a live process (not a zombie) runs `command` (as `sleeper` made it).
fn running(command: &str) -> bool {
    let wanted = command.replace(' ', "\0");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let dir = entry.path();
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let live = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()))
            .is_some_and(|state| !matches!(state, Some('Z' | 'X')));
        live && cmdline.trim_end_matches('\0') == wanted
    })
}

/// Waits up to 3 s for every process running `command` to be gone (init
/// reaps adopted grandchildren in its own time).
async fn gone(command: &str) -> bool {
    for _ in 0..150 {
        if !running(command) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn output_and_exit_status_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let ok = Bash::default()
        .call(command("echo hello; pwd", None), ctx(dir.path()))
        .await
        .unwrap();
    assert!(ok.content.starts_with("exit code 0"), "{}", ok.content);
    assert!(ok.content.contains("hello\n"));
    let canonical = dir.path().canonicalize().unwrap();
    assert!(
        ok.content.contains(&canonical.display().to_string()) || ok.content.contains(&dir.path().display().to_string())
    );
    assert!(ok.content.contains("sandbox: none"));

    let failed = Bash::default()
        .call(command("echo out; echo oops >&2; exit 3", None), ctx(dir.path()))
        .await
        .unwrap_err();
    let ToolError::Failed(text) = failed else {
        panic!("{failed:?}")
    };
    assert!(text.starts_with("exit code 3"), "{text}");
    assert!(text.contains("--- stdout ---\nout\n"), "{text}");
    assert!(text.contains("--- stderr ---\noops\n"), "{text}");

    // Stdin is closed: a command that reads it sees end of file at once.
    let read = Bash::default()
        .call(command("cat; echo after", Some(5)), ctx(dir.path()))
        .await
        .unwrap();
    assert!(read.content.contains("after"));
}

#[tokio::test]
async fn long_output_keeps_head_and_tail_with_the_count_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let settings = BashSettings {
        max_output_bytes: 1000,
        ..BashSettings::default()
    };
    let out = Bash::new(settings)
        .call(command("echo FIRST; seq 1 100000; echo LAST", None), ctx(dir.path()))
        .await
        .unwrap();
    assert!(out.content.contains("FIRST"));
    assert!(out.content.contains("LAST"));
    assert!(out.content.contains("bytes dropped"), "{}", out.content);
    assert!(out.content.len() < 1500, "{}", out.content.len());
}

#[tokio::test]
async fn a_timeout_kills_the_whole_tree_even_a_grandchild_holding_the_pipe() {
    let dir = tempfile::tempdir().unwrap();
    // The grandchild keeps stdout open: without a group kill, reading the
    // pipe would hang until it exits.
    let (grandchild, child) = (sleeper(), sleeper());
    let script = format!("{grandchild} & bash -c '{child}' & echo started; wait");
    let started = std::time::Instant::now();
    let err = Bash::default()
        .call(command(&script, Some(3)), ctx(dir.path()))
        .await
        .unwrap_err();
    let ToolError::Failed(text) = err else {
        panic!("{err:?}")
    };
    assert!(text.starts_with("timed out after 3 s"), "{text}");
    assert!(text.contains("started"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(60), "the call hung");
    for sleeper in [grandchild, child] {
        assert!(gone(&sleeper).await, "{sleeper} outlived the timeout");
    }
}

#[tokio::test]
async fn a_background_job_left_behind_is_stopped_when_the_command_ends() {
    let dir = tempfile::tempdir().unwrap();
    let job = sleeper();
    let out = Bash::default()
        .call(command(&format!("{job} & echo done"), Some(60)), ctx(dir.path()))
        .await
        .unwrap();
    assert!(out.content.starts_with("exit code 0"), "{}", out.content);
    assert!(gone(&job).await, "the background job ({job}) outlived the call");
}

#[tokio::test]
async fn cancel_stops_the_command_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let context = ctx(dir.path());
    let cancel = context.cancel.clone();
    let pid_file = dir.path().join("sleeper.pid");
    let watcher = {
        let pid_file = pid_file.clone();
        tokio::spawn(async move {
            while !pid_file.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cancel.cancel();
        })
    };
    let sleeping = sleeper();
    let err = Bash::default()
        .call(
            command(&format!("{sleeping} & echo $! > sleeper.pid; wait"), Some(120)),
            context,
        )
        .await
        .unwrap_err();
    watcher.await.unwrap();
    assert_eq!(err, ToolError::Cancelled);
    assert!(gone(&sleeping).await, "{sleeping} outlived the cancel");
}

#[tokio::test]
async fn a_dropped_call_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleeper.pid");
    let bash = Bash::default();
    let sleeping = sleeper();
    let call = bash.call(
        command(&format!("{sleeping} & echo $! > sleeper.pid; wait"), Some(120)),
        ctx(dir.path()),
    );
    let dropped_after_start = async {
        while !pid_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = call => panic!("the command ended by itself"),
        _ = dropped_after_start => {}
    }
    assert!(gone(&sleeping).await, "{sleeping} outlived the dropped call");
}

#[tokio::test]
async fn variables_with_secret_names_never_reach_the_command() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY (edition 2021: safe): set before the command starts; no other
    // test reads these names.
    std::env::set_var("LOOM_TEST_API_KEY", "sk-test-not-for-commands");
    std::env::set_var("LOOM_TEST_HARMLESS", "visible-only-if-configured");
    let settings = BashSettings {
        env: [
            ("CONFIGURED".to_string(), "yes".to_string()),
            ("DEPLOY_TOKEN".to_string(), "configured-but-secret".to_string()),
        ]
        .into(),
        ..BashSettings::default()
    };
    let out = Bash::new(settings)
        .call(command("env | sort", None), ctx(dir.path()))
        .await
        .unwrap();
    assert!(out.content.contains("PATH="), "{}", out.content);
    assert!(out.content.contains("CONFIGURED=yes"));
    assert!(out.content.contains("TMPDIR="));
    for absent in [
        "LOOM_TEST_API_KEY",
        "sk-test-not-for-commands",
        "LOOM_TEST_HARMLESS",
        "DEPLOY_TOKEN",
    ] {
        assert!(!out.content.contains(absent), "{absent} leaked:\n{}", out.content);
    }
}

#[tokio::test]
async fn output_streams_while_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, mut output) = OutputSink::channel();
    let mut context = ctx(dir.path());
    context.output = Some(sink);
    // The command waits for a file the test writes only after it has seen
    // the first line streamed: were output not live, it would time out.
    let script = "echo first; echo warn >&2; while [ ! -f go ]; do sleep 0.02; done; echo second";
    let bash = Bash::default();
    let call = bash.call(command(script, Some(30)), context);
    tokio::pin!(call);
    let mut seen = Vec::new();
    let go = dir.path().join("go");
    let result = loop {
        tokio::select! {
            Some((stream, text)) = output.recv() => {
                if text.contains("first") {
                    std::fs::write(&go, "").unwrap();
                }
                seen.push((stream, text));
            }
            result = &mut call => break result,
        }
    };
    while let Some(piece) = output.try_recv() {
        seen.push(piece);
    }
    let result = result.unwrap();
    assert!(result.content.contains("second"), "{}", result.content);
    assert!(
        seen.contains(&(OutputStream::Stdout, "first\n".to_string())),
        "{seen:?}"
    );
    assert!(seen.contains(&(OutputStream::Stderr, "warn\n".to_string())), "{seen:?}");
    assert!(seen.iter().any(|(_, text)| text == "second\n"), "{seen:?}");
}

#[tokio::test]
async fn the_timeout_argument_is_bounded_by_the_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let err = Bash::default()
        .call(command("true", Some(601)), ctx(dir.path()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::InvalidArguments(ref text) if text.contains("600")),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_sandbox_allows_writes_in_the_workspace_only() {
    let abi = match landlock_available() {
        Ok(abi) => abi,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let bash = Bash::new(BashSettings {
        sandbox: SandboxMode::Landlock,
        ..BashSettings::default()
    });
    let inside = bash
        .call(
            command(
                "echo in > inside.txt && echo tmp > \"$TMPDIR/t\" && cat inside.txt",
                None,
            ),
            ctx(workspace.path()),
        )
        .await
        .unwrap();
    // No Landlock helper here (the `loom` binary is one): the namespaces
    // alone; the binary's tests check the Landlock layer inside them.
    assert!(inside.content.contains("sandbox: namespaces"), "{}", inside.content);
    assert!(inside.content.contains("in\n"));
    assert!(workspace.path().join("inside.txt").exists());

    let target = outside.path().join("escape.txt");
    let escaped = bash
        .call(
            command(&format!("echo out > '{}'", target.display()), None),
            ctx(workspace.path()),
        )
        .await
        .unwrap_err();
    let ToolError::Failed(text) = escaped else {
        panic!("{escaped:?}")
    };
    // The outside directory is not even there (an empty private /tmp).
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(!target.exists(), "the sandbox let a write through");

    // The system directories can be read (and run from), not written.
    let read = bash
        .call(
            command("head -c 4 /etc/passwd; echo; touch /usr/x", None),
            ctx(workspace.path()),
        )
        .await
        .unwrap_err();
    let ToolError::Failed(text) = read else {
        panic!("{read:?}")
    };
    assert!(text.contains("root"), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");

    if abi >= 4 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connect = bash
            .call(
                command(&format!("exec 3<>/dev/tcp/127.0.0.1/{port}"), Some(10)),
                ctx(workspace.path()),
            )
            .await
            .unwrap_err();
        let ToolError::Failed(text) = connect else {
            panic!("{connect:?}")
        };
        assert!(text.contains("no network"), "{text}");
        // Its own network namespace: nothing listens on its loopback.
        assert!(text.contains("Connection refused"), "{text}");
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "the host's listener took a connection");
    } else {
        println!("network rules skipped: Landlock ABI {abi} < 4");
    }
}
