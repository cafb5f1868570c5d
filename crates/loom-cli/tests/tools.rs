//! The shell and MCP tools through the `loom` binary: `[tools.bash]`, live
//! shell output on stderr and as `tool.output` events, MCP servers from
//! `[mcp.servers.NAME]` called by a scripted run, a deny rule on an MCP
//! tool, and `loom mcp list`. No server process outlives a command. And the
//! file tools of a real run against a directory swapped with a link to the
//! outside while the run goes on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::loom;
use loom_testkit::mcp_servers::{self, processes_with_env};
use loom_testkit::symlink_race::{changes, snapshot, Swapper};
use serde_json::Value;

const MARKER: &str = "LOOM_MCP_TEST_MARKER";

/// Writes `dir/name`; a loom.toml is then trusted, as the person who
/// wrote it would (its MCP servers and bash settings run commands).
fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    if name == "loom.toml" {
        common::trust(dir);
    }
    path.display().to_string()
}

fn events(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line.trim()).ok())
        .collect()
}

fn results(events: &[Value]) -> Vec<(String, String, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.result")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
                e["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `loom run ARGS` in `dir`, without a terminal.
fn loom_run(dir: &Path, args: &[&str]) -> std::process::Output {
    loom()
        .current_dir(dir)
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn assert_no_process_left(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_with_env(MARKER, marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "MCP server processes outlived loom: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_shell_streams_its_output_live_and_reports_how_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "script.json",
        r#"[
          {"tool_calls":[{"name":"bash","arguments":{"command":"echo building; echo key sk-abcdefghijklmnopqrstuvwxyz012345; echo warning: slow >&2; exit 2"}}]},
          {"content":"the build failed"}
        ]"#,
    );
    write(dir.path(), "loom.toml", "[tools.bash]\nenv = { BUILD_MODE = \"ci\" }\n");
    let output = loom_run(
        dir.path(),
        &[
            "--json",
            "--allow",
            "bash",
            "--model",
            &format!("scripted:{script}"),
            "build it",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = events(&output.stdout);
    let outputs: Vec<&Value> = events.iter().filter(|e| e["type"] == "tool.output").collect();
    // Quick lines may arrive in one piece: the stream as a whole is what counts.
    let stdout: String = outputs
        .iter()
        .filter(|e| e["stream"] == "stdout")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(stdout.starts_with("building\n"), "{outputs:?}");
    assert!(outputs
        .iter()
        .any(|e| e["stream"] == "stderr" && e["text"] == "warning: slow\n"));
    // Streamed output is redacted like results are.
    assert!(
        outputs
            .iter()
            .any(|e| e["text"].as_str().unwrap().contains("key [REDACTED]")),
        "{outputs:?}"
    );
    let leaked = events
        .iter()
        .filter(|e| e["type"] == "tool.output" || e["type"] == "tool.result")
        .any(|e| e.to_string().contains("sk-abcdefghij"));
    assert!(!leaked, "{events:?}");
    let result_seq = events.iter().find(|e| e["type"] == "tool.result").unwrap()["seq"]
        .as_u64()
        .unwrap();
    assert!(outputs.iter().all(|e| e["seq"].as_u64().unwrap() < result_seq));
    let (_, status, content) = &results(&events)[0];
    assert_eq!(status, "error");
    assert!(content.contains("exit code 2"), "{content}");

    // The terminal shows the output on stderr, under a bar.
    let human = loom_run(
        dir.path(),
        &["--allow", "bash", "--model", &format!("scripted:{script}"), "build it"],
    );
    let stderr = String::from_utf8_lossy(&human.stderr);
    assert!(stderr.contains("│ building"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&human.stdout).trim(), "the build failed");
}

#[test]
fn the_shell_asks_by_default_and_can_be_sandboxed_or_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "script.json",
        r#"[{"tool_calls":[{"name":"bash","arguments":{"command":"echo hi > made.txt"}}]},{"content":"ok"}]"#,
    );
    let model = format!("scripted:{script}");
    // No terminal to ask on: the ask is a deny.
    let asked = loom_run(dir.path(), &["--json", "--model", &model, "go"]);
    assert_eq!(results(&events(&asked.stdout))[0].1, "denied");
    assert!(!dir.path().join("made.txt").exists());

    if loom::tools::shell::landlock_available().is_ok() {
        write(dir.path(), "loom.toml", "[tools.bash]\nsandbox = \"landlock\"\n");
        let sandboxed = loom_run(dir.path(), &["--json", "--yes", "--model", &model, "go"]);
        let (_, status, content) = results(&events(&sandboxed.stdout))[0].clone();
        assert_eq!(status, "success", "{content}");
        assert!(
            content.contains("sandbox: namespaces + landlock") || content.contains("sandbox: landlock-only"),
            "{content}"
        );
        assert!(dir.path().join("made.txt").exists());
    } else {
        println!("sandbox part skipped: {:?}", loom::tools::shell::landlock_available());
    }

    write(dir.path(), "loom.toml", "[tools.bash]\nenabled = false\n");
    let off = loom_run(dir.path(), &["--json", "--yes", "--model", &model, "go"]);
    let (_, status, content) = results(&events(&off.stdout))[0].clone();
    assert_eq!(status, "error");
    assert!(content.contains("bash"), "{content}");
}

#[test]
fn a_scripted_run_calls_real_mcp_tools_and_reads_their_answers() {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid_like();
    let everything = mcp_servers::everything();
    write(
        dir.path(),
        "loom.toml",
        &everything.toml("everything", &[(MARKER, &marker)], ""),
    );
    let script = write(
        dir.path(),
        "script.json",
        r#"[
          {"tool_calls":[
            {"name":"everything__echo","arguments":{"message":"hello from loom"}},
            {"name":"everything__get-sum","arguments":{"a":19,"b":23}}
          ]},
          {"content":"done"}
        ]"#,
    );
    let output = loom_run(
        dir.path(),
        &[
            "--json",
            "--allow",
            "everything__*",
            "--model",
            &format!("scripted:{script}"),
            "use the tools",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = results(&events(&output.stdout));
    assert_eq!(
        results[0],
        (
            "everything__echo".into(),
            "success".into(),
            "Echo: hello from loom".into()
        )
    );
    assert_eq!(results[1].1, "success");
    assert!(results[1].2.contains("42"), "{:?}", results[1]);
    assert_no_process_left(&marker);
}

#[test]
fn an_mcp_tool_under_a_deny_rule_never_runs_and_mcp_tools_ask_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("notes.txt"), "kept notes").unwrap();
    let marker = uuid_like();
    let fs = mcp_servers::filesystem(&root);
    let config = format!(
        "{}\n[permissions]\n\"fs__write_file\" = \"deny\"\n",
        fs.toml("fs", &[(MARKER, &marker)], "")
    );
    write(dir.path(), "loom.toml", &config);
    let target = root.join("new.txt").display().to_string();
    let notes = root.join("notes.txt").display().to_string();
    let script = write(
        dir.path(),
        "script.json",
        &format!(
            r#"[
              {{"tool_calls":[{{"name":"fs__write_file","arguments":{{"path":{target:?},"content":"x"}}}}]}},
              {{"tool_calls":[{{"name":"fs__read_text_file","arguments":{{"path":{notes:?}}}}}]}},
              {{"content":"done"}}
            ]"#
        ),
    );
    let model = format!("scripted:{script}");
    // --yes approves asks, but no answer overrides a deny rule.
    let output = loom_run(dir.path(), &["--json", "--yes", "--model", &model, "write"]);
    let results = results(&events(&output.stdout));
    assert_eq!(results[0].1, "denied", "{results:?}");
    assert!(!root.join("new.txt").exists());
    assert_eq!(results[1].1, "success", "{results:?}");
    assert!(results[1].2.contains("kept notes"));

    // Without --yes and without a terminal, an MCP tool's ask is a deny.
    let unattended = loom_run(dir.path(), &["--json", "--model", &model, "write"]);
    let statuses: Vec<String> = self::results(&events(&unattended.stdout))
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(statuses, vec!["denied", "denied"]);
    assert_no_process_left(&marker);
}

#[test]
fn loom_mcp_list_shows_each_server_its_state_and_tools() {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid_like();
    let config = format!(
        "{}{}{}[mcp.servers.off]\ncommand = \"false\"\nenabled = false\n",
        mcp_servers::fixture().toml("fixture", &[(MARKER, &marker)], ""),
        mcp_servers::time().toml("time", &[(MARKER, &marker)], ""),
        "[mcp.servers.broken]\ncommand = \"/nonexistent/mcp-server\"\nstartup_timeout_secs = 5\n\
         [mcp.servers.dies]\ncommand = \"bash\"\n\
         args = [\"-c\", \"echo 'Error: no config found' >&2; echo 'tool v1.0' >&2; exit 3\"]\n",
    );
    write(dir.path(), "loom.toml", &config);
    let output = loom().current_dir(dir.path()).args(["mcp", "list"]).output().unwrap();
    // A server that did not start makes the listing fail, for scripts.
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("fixture  ready"), "{text}");
    assert!(text.contains("  fixture__echo"), "{text}");
    assert!(text.contains("skipped: tool 'bad_schema'"), "{text}");
    assert!(text.contains("time  ready"), "{text}");
    assert!(text.contains("time__get_current_time"), "{text}");
    assert!(
        text.contains("broken  down: could not start `/nonexistent/mcp-server`"),
        "{text}"
    );
    assert!(text.contains("off  disabled"), "{text}");
    // A server that exits says how, with what it said on stderr.
    assert!(
        text.contains(
            "dies  down: the server exited (exit status: 3) before it answered `initialize` \
             (stderr: Error: no config found … tool v1.0)"
        ),
        "{text}"
    );
    assert!(
        text.contains("  stderr: Error: no config found\n  stderr: tool v1.0"),
        "{text}"
    );

    let json = loom()
        .current_dir(dir.path())
        .args(["mcp", "list", "--json"])
        .output()
        .unwrap();
    let lines = events(&json.stdout);
    let fixture = lines.iter().find(|line| line["server"] == "fixture").unwrap();
    assert_eq!(fixture["state"], "ready");
    assert!(fixture["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|tool| tool["name"] == "fixture__echo"));
    assert_no_process_left(&marker);
}

#[test]
fn a_signal_during_mcp_list_stops_the_servers_and_what_they_forked() {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid_like();
    // A server that never answers `initialize` and has forked a child.
    write(
        dir.path(),
        "loom.toml",
        &format!(
            "[mcp.servers.slow]\ncommand = \"bash\"\nargs = [\"-c\", \"sleep 300 & cat > /dev/null\"]\n\
             env = {{ {MARKER} = \"{marker}\" }}\n"
        ),
    );
    for (signal, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let mut child = loom()
            .current_dir(dir.path())
            .args(["mcp", "list"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while processes_with_env(MARKER, &marker).len() < 2 {
            assert!(Instant::now() < deadline, "the server and its child never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: a plain signal to the child we started.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code));
        assert_no_process_left(&marker);
    }
}

fn uuid_like() -> String {
    format!("{}-{}", std::process::id(), fastrand::u64(..))
}

#[test]
fn the_model_is_offered_mcp_tools_and_reads_their_results() {
    use loom_testkit::{PromptModel, PromptModelOptions};
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid_like();
    let config = format!(
        "model = \"openai:fake\"\n[provider]\nbase_url = \"{}\"\n{}",
        model.url(),
        mcp_servers::fixture().toml("fixture", &[(MARKER, &marker)], "")
    );
    write(dir.path(), "loom.toml", &config);
    let output = loom()
        .current_dir(dir.path())
        .env("OPENAI_API_KEY", "sk-test")
        .args(["run", "--allow", "fixture__env", "steps=1 tool=fixture__env"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bodies = model.bodies();
    // What the model sees: the tools by their prefixed names, with the
    // server's schema (no `$schema`), and the bad one left out.
    let offered: Vec<&Value> = bodies[0]["tools"].as_array().unwrap().iter().collect();
    let env_tool = offered
        .iter()
        .find(|tool| tool["function"]["name"] == "fixture__env")
        .expect("fixture__env offered");
    assert_eq!(env_tool["function"]["parameters"]["type"], "object");
    assert!(offered
        .iter()
        .all(|tool| tool["function"]["name"] != "fixture__bad_schema"));
    assert!(offered.iter().any(|tool| tool["function"]["name"] == "bash"));
    // The tool's real answer is in the next request.
    let messages = bodies[1]["messages"].as_array().unwrap();
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap();
    // The server got its `env` (a value that looks like no key, so it is
    // not redacted: docs/cli.md, "Output safety").
    assert!(result.contains(&format!("{MARKER}={marker}")), "{result}");
    assert!(!result.contains("OPENAI_API_KEY"), "{result}");
    assert_no_process_left(&marker);
}

#[test]
fn a_tool_a_server_adds_mid_run_is_offered_from_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid_like();
    write(
        dir.path(),
        "loom.toml",
        &mcp_servers::fixture().toml("fixture", &[(MARKER, &marker)], ""),
    );
    let script = write(
        dir.path(),
        "script.json",
        r#"[
          {"tool_calls":[{"name":"fixture__add_tool","arguments":{}}]},
          {"tool_calls":[{"name":"fixture__added","arguments":{}}]},
          {"content":"done"}
        ]"#,
    );
    let output = loom_run(
        dir.path(),
        &[
            "--json",
            "--allow",
            "fixture__*",
            "--model",
            &format!("scripted:{script}"),
            "grow",
        ],
    );
    let results = results(&events(&output.stdout));
    assert_eq!(
        results[1],
        ("fixture__added".into(), "success".into(), "added works".into()),
        "{results:?}"
    );
    assert_no_process_left(&marker);
}

/// A hostile workspace: while a real `loom run` makes hundreds of file tool
/// calls (several per turn, reads in parallel), this test's own thread swaps
/// a directory in the workspace with a link to an outside directory, in a
/// tight loop. Judged from outside: no result shows the outside's secret or
/// names, and nothing outside was created or changed.
#[test]
fn file_tools_of_a_run_never_escape_through_a_swapped_link() {
    const SECRET: &str = "OUTSIDE-SECRET-c41d";
    const OUTSIDE_NAME: &str = "outside-only-name.txt";
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::write(outside.path().join(OUTSIDE_NAME), format!("{SECRET} too\n")).unwrap();
    std::fs::write(outside.path().join("edit.txt"), "alpha\nALPHA\n").unwrap();
    std::fs::create_dir(outside.path().join("nested")).unwrap();
    std::fs::write(outside.path().join("nested/secret.txt"), format!("{SECRET}\n")).unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("swap/nested")).unwrap();
    std::fs::write(root.join("swap/secret.txt"), "inside text\n").unwrap();
    std::fs::write(root.join("swap/edit.txt"), "alpha\n").unwrap();
    std::fs::write(root.join("swap/nested/secret.txt"), "inside text\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();

    let call = |name: &str, arguments: Value| serde_json::json!({"name": name, "arguments": arguments});
    let mut turns = Vec::new();
    for turn in 0..8 {
        // Each turn spells its paths differently (`./` repeated), so the
        // recursion monitor sees no call repeated from turn to turn.
        let here = "./".repeat(turn);
        let at = |path: &str| format!("{here}{path}");
        let mut calls = Vec::new();
        for n in 0..10 {
            calls.push(call("read_file", serde_json::json!({"path": at("swap/secret.txt")})));
            if n % 2 == 0 {
                calls.push(call(
                    "read_file",
                    serde_json::json!({"path": at("link/nested/secret.txt")}),
                ));
            }
        }
        for n in 0..8 {
            let path = at(&format!("swap/new-{n}.txt"));
            calls.push(call("write_file", serde_json::json!({"path": path, "content": "x"})));
        }
        calls.push(call(
            "write_file",
            serde_json::json!({"path": at("swap/nested/deeper/new.txt"), "content": "x"}),
        ));
        calls.push(call(
            "write_file",
            serde_json::json!({"path": at("link/edit.txt"), "content": "alpha\n"}),
        ));
        calls.push(call(
            "edit_file",
            serde_json::json!({"path": at("swap/edit.txt"), "old_string": "alpha\n", "new_string": "beta\n"}),
        ));
        calls.push(call(
            "edit_file",
            serde_json::json!({"path": at("swap/edit.txt"), "old_string": "beta\n", "new_string": "alpha\n"}),
        ));
        for path in ["swap", "link", "link/nested"] {
            calls.push(call("list_dir", serde_json::json!({"path": at(path)})));
            calls.push(call(
                "glob",
                serde_json::json!({"pattern": "**/*.txt", "path": at(path)}),
            ));
            calls.push(call(
                "grep",
                serde_json::json!({"pattern": "SECRET|text", "path": at(path)}),
            ));
        }
        calls.push(call("glob", serde_json::json!({"pattern": "**/*", "path": at(".")})));
        calls.push(call(
            "grep",
            serde_json::json!({"pattern": "SECRET|text", "path": at(".")}),
        ));
        turns.push(serde_json::json!({"tool_calls": calls}));
    }
    turns.push(serde_json::json!({"content": "done"}));
    let model = common::script_at(scripts.path(), "script.json", &Value::Array(turns));
    let before = snapshot(outside.path());

    let swapper = Swapper::start(&root.join("swap"), &root.join("link"));
    let output = common::loom_in(root)
        .args([
            "run",
            "--json",
            "--yes",
            "--max-steps",
            "20",
            "--model",
            &model,
            "poke around",
        ])
        .output()
        .unwrap();
    let swaps = swapper.swaps();
    drop(swapper);

    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}\n{}",
        &stderr[stderr.len().saturating_sub(2000)..],
        &stdout[stdout.len().saturating_sub(2000)..]
    );
    let events = events(&output.stdout);
    let results = results(&events);
    assert_eq!(results.len(), 8 * 38, "every call ran");
    let leaked: Vec<&(String, String, String)> = results
        .iter()
        .filter(|(_, _, content)| content.contains(SECRET) || content.contains(OUTSIDE_NAME))
        .collect();
    let changed = changes(&before, &snapshot(outside.path()));
    assert!(
        leaked.is_empty() && changed.is_empty() && !stdout.contains(SECRET) && !stdout.contains(OUTSIDE_NAME),
        "{} results showed the outside: {:?}\ncreated or changed outside ({}): {:?}",
        leaked.len(),
        &leaked[..leaked.len().min(5)],
        changed.len(),
        &changed[..changed.len().min(10)]
    );
    assert!(swaps > 100, "the swapper hardly ran ({swaps} swaps)");
    let inside_reads = results
        .iter()
        .filter(|(name, status, content)| name == "read_file" && status == "success" && content.contains("inside text"))
        .count();
    assert!(inside_reads > 0, "read_file never read the inside file");
    println!(
        "{} calls, {swaps} swaps, {inside_reads} inside reads, no escape",
        results.len()
    );
}

#[test]
fn optional_parameters_are_offered_without_null_and_an_explicit_null_is_accepted() {
    use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "first line\nsecond line\n").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call00001",
            "read_file",
            r#"{"path": "notes.txt", "offset": null, "limit": null}"#,
        )])),
        Reply::Sse(openai_text("Read it.", 4)),
    ]);
    let output = common::succeeded(
        common::loom_in(dir.path())
            .args(["run", "--json", "--model", "openai:local", "--base-url"])
            .arg(server.url())
            .arg("read the notes"),
    );
    let events = common::json_lines(&output.stdout);
    let results = common::tool_results(&events);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "success", "{results:?}");
    assert!(results[0].1.contains("second line"), "{results:?}");

    // What the model was offered: no type lists, no null, optional
    // parameters outside `required`.
    let tools = &server.requests()[0].body["tools"];
    let text = tools.to_string();
    assert!(!text.contains("null"), "{text}");
    let read = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["function"]["name"] == "read_file")
        .unwrap();
    let parameters = &read["function"]["parameters"];
    assert_eq!(parameters["properties"]["limit"]["type"], "integer");
    assert_eq!(parameters["required"], serde_json::json!(["path"]));
    for tool in tools.as_array().unwrap() {
        for (name, property) in tool["function"]["parameters"]["properties"].as_object().unwrap() {
            assert!(
                property["type"].is_string() || property.get("type").is_none(),
                "{name}: {property}"
            );
        }
    }
}
