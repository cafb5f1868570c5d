//! The command line never panics and never leaves a run looking alive:
//! absurd limits saturate, a base URL that is not http(s) is a usage error,
//! SIGTERM, SIGHUP and a closed stdout stop a run resumably, the task can
//! come from stdin or a file, a malformed script names its bad turn, and
//! every JSON Loom prints is camelCase.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{json_lines, loom, loom_in, script_at, succeeded};

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loom_testkit::{openai_text, FakeServer, Reply};
use serde_json::{json, Value};

fn wait(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("loom did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn absurd_time_limits_saturate_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let huge = i64::MAX;
    std::fs::write(
        dir.path().join("loom.toml"),
        format!(
            "run_timeout_secs = {huge}\nstep_timeout_secs = {huge}\npermission_timeout_secs = {huge}\n\
             [scheduler]\ntool_timeout_secs = {huge}\n[provider]\nbreaker_open_secs = {huge}\n\
             connect_timeout_secs = {huge}\nfirst_byte_timeout_secs = {huge}\nidle_timeout_secs = {huge}\nretry_max_secs = 0\n"
        ),
    )
    .unwrap();
    let model = script_at(
        dir.path(),
        "script.json",
        &json!([{"tool_calls": [{"name": "list_dir", "arguments": {}}]}, {"content": "listed"}]),
    );
    for timeout in ["18446744073709551615", "9223372036854775807", "0"] {
        let output = loom_in(dir.path())
            .args(["run", "--model", &model, "--timeout", timeout, "list"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "--timeout {timeout}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    // An absurd Retry-After from the server: ignored, the call retried. With
    // one failed call allowed (and no retry) the breaker opens "for good",
    // without overflowing.
    let rate_limited = || Reply::Status {
        status: 429,
        headers: vec![("Retry-After".into(), "1e300".into())],
        body: json!({"error": {"message": "slow down"}}).to_string(),
    };
    for (breaker, code) in [("", 0), ("breaker_failures = 1\nmax_attempts = 1\n", 1)] {
        let config = std::fs::read_to_string(dir.path().join("loom.toml")).unwrap();
        std::fs::write(dir.path().join("loom.toml"), format!("{config}{breaker}")).unwrap();
        let server = FakeServer::start(vec![rate_limited(), Reply::Sse(openai_text("fine", 4))]);
        let output = loom_in(dir.path())
            .args(["run", "--model", "openai:m", "--base-url"])
            .arg(server.url())
            .arg("hi")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(output.status.code(), Some(code), "{stderr}");
        if code == 1 {
            assert!(stderr.contains("circuit open"), "{stderr}");
        }
    }
}

#[test]
fn a_base_url_that_is_not_http_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for url in ["localhost:11434/v1", "ftp://example.com/v1", "http://", "not a url"] {
        let started = Instant::now();
        let output = loom_in(dir.path())
            .args(["run", "--model", "openai:m", "--base-url", url, "hi"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("invalid base URL") && stderr.contains(url), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(5), "no retries");
    }
    let output = loom_in(dir.path())
        .env("ANTHROPIC_BASE_URL", "api.anthropic.com")
        .env("ANTHROPIC_API_KEY", "k")
        .args(["run", "--model", "anthropic:claude", "hi"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn the_task_comes_from_an_argument_stdin_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = script_at(dir.path(), "script.json", &json!([{"content": "ok"}]));
    let prompt_of = |args: &[&str], stdin: Option<&str>| {
        let mut child = loom_in(dir.path())
            .args(["run", "--json", "--model", &model])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        match output.status.code() {
            Some(0) => Ok(json_lines(&output.stdout)[0]["prompt"].as_str().unwrap().to_string()),
            code => Err((code, stderr)),
        }
    };
    assert_eq!(
        prompt_of(&["-"], Some("summarize the logs\n")).unwrap(),
        "summarize the logs"
    );
    assert_eq!(
        prompt_of(&[], Some("a task\nover two lines\n")).unwrap(),
        "a task\nover two lines"
    );
    std::fs::write(dir.path().join("task.md"), "# Task\n\nFix the build.\n").unwrap();
    assert_eq!(
        prompt_of(&["--prompt-file", "task.md"], None).unwrap(),
        "# Task\n\nFix the build."
    );
    assert_eq!(
        prompt_of(&["as an argument"], Some("ignored")).unwrap(),
        "as an argument"
    );
    for (args, stdin, words) in [
        (vec!["-"], Some("   \n"), "the task is empty"),
        (vec![], None, "the task is empty"),
        (vec!["  "], None, "the task is empty"),
        (
            vec!["--prompt-file", "missing.md"],
            None,
            "cannot read the prompt file missing.md",
        ),
        (vec!["x", "--prompt-file", "task.md"], None, "not both"),
    ] {
        let (code, stderr) = prompt_of(&args, stdin).unwrap_err();
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(words), "{args:?}: {stderr}");
    }
}

#[test]
fn a_malformed_script_names_its_bad_turn() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.json"),
        r#"[{"content": "one"}, {"tool_calls": [{"name": "list_dir"}]}, {"contnet": "three"}]"#,
    )
    .unwrap();
    let output = loom_in(dir.path())
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("invalid script s.json: turn 3: unknown field `contnet`"),
        "{stderr}"
    );
}

#[test]
fn runs_list_json_is_camel_case_like_every_json_loom_prints() {
    let dir = tempfile::tempdir().unwrap();
    let model = script_at(dir.path(), "script.json", &json!([{"content": "ok"}]));
    let output = loom_in(dir.path())
        .args(["run", "--model", &model, "--session", "s1", "hi"])
        .output()
        .unwrap();
    assert!(output.status.success());
    for args in [
        vec!["runs", "list", "--json"],
        vec!["runs", "list", "--json", "--session", "s1"],
    ] {
        let listed = loom_in(dir.path()).args(&args).output().unwrap();
        let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
        let run = &runs[0];
        for key in [
            "runId",
            "sessionId",
            "prompt",
            "model",
            "status",
            "owner",
            "startedMs",
            "endedMs",
            "metrics",
        ] {
            assert!(run.get(key).is_some(), "{key} missing: {run}");
        }
        assert!(run.get("run_id").is_none() && run.get("started_ms").is_none(), "{run}");
        let id = run["runId"].as_str().unwrap();
        let shown = loom_in(dir.path())
            .args(["runs", "show", id, "--json"])
            .output()
            .unwrap();
        let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(shown["run"]["sessionId"], "s1");
    }
    // A closed stdout ends a listing quietly.
    let mut child = loom_in(dir.path())
        .args(["runs", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&output.stderr).contains("panicked"));
}

// ---- signals and a closed stdout ----

/// A run that writes a file, then waits for a slow model: stopped while it
/// waits, it has a side effect behind it and an answer ahead.
fn slow_run(dir: &std::path::Path) -> (String, String) {
    let slow = script_at(
        dir,
        "slow.json",
        &json!([
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "written once\n", "append": true}}]},
            {"content": "done", "delay_ms": 1500}
        ]),
    );
    // What a resumed process plays: the history shows the first turn played.
    let quick = script_at(
        dir,
        "quick.json",
        &json!([
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "written once\n", "append": true}}]},
            {"content": "done"}
        ]),
    );
    (slow, quick)
}

fn start(dir: &std::path::Path, model: &str) -> Child {
    loom_in(dir)
        .args([
            "run",
            "--json",
            "--allow",
            "write_file",
            "--model",
            model,
            "write and wait",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Resumes `run_id` and checks it ends DONE without repeating the write.
fn resume_finishes(dir: &std::path::Path, run_id: &str, model: &str) {
    let listed = loom_in(dir).args(["runs", "list", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(runs[0]["runId"], run_id);
    assert_eq!(runs[0]["status"], "INTERRUPTED", "{runs}");
    let output = succeeded(loom_in(dir).args([
        "runs",
        "resume",
        run_id,
        "--json",
        "--allow",
        "write_file",
        "--model",
        model,
    ]));
    let events = json_lines(&output.stdout);
    assert_eq!(events.last().unwrap()["status"], "DONE");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "written once\n",
        "the side effect ran once"
    );
}

#[cfg(unix)]
#[test]
fn sigterm_and_sighup_stop_a_run_resumably() {
    for (signal, code) in [("TERM", 143), ("HUP", 129)] {
        let dir = tempfile::tempdir().unwrap();
        let (slow, quick) = slow_run(dir.path());
        let mut child = start(dir.path(), &slow);
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut run_id = String::new();
        let mut calls = 0;
        // The second model call is in flight once its llm.start is out.
        for line in lines.by_ref() {
            let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
            run_id = event["runId"].as_str().unwrap().to_string();
            if event["type"] == "llm.start" {
                calls += 1;
                if calls == 2 {
                    break;
                }
            }
        }
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let rest: Vec<Value> = lines.map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
        assert_eq!(wait(&mut child, Duration::from_secs(20)), Some(code), "SIG{signal}");
        let last = rest.last().unwrap();
        assert_eq!(last["type"], "warning", "SIG{signal}: {last}");
        assert_eq!(last["code"], "INTERRUPTED");
        assert!(
            !rest.iter().any(|e| e["type"] == "lifecycle.end"),
            "the run is not over"
        );
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(stderr.contains(&format!("loom runs resume {run_id}")), "{stderr}");
        resume_finishes(dir.path(), &run_id, &quick);
    }
}

#[cfg(unix)]
#[test]
fn a_closed_stdout_stops_the_run_resumably() {
    let dir = tempfile::tempdir().unwrap();
    let (slow, quick) = slow_run(dir.path());
    // `loom run --json … | head -1`.
    let mut child = start(dir.path(), &slow);
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    // Dropping the reader closes the pipe.
    let event: Value = serde_json::from_str(&first).unwrap();
    let run_id = event["runId"].as_str().unwrap().to_string();
    assert_eq!(wait(&mut child, Duration::from_secs(20)), Some(141));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    resume_finishes(dir.path(), &run_id, &quick);
}

#[test]
fn loom_without_a_subcommand_or_task_says_so() {
    let output = loom().args(["run"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
}
