//! Rewind and fork through the binary (docs/rewind.md): a three-step run
//! against the fake OpenAI server — `write_file`, `edit_file`, and `bash`
//! creating, deleting and changing a file's mode — then the workspace
//! compared byte for byte and mode for mode with the state after step 1,
//! and the next run's request body read for the conversation it was sent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use common::{json_lines, loom_in};
use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};
use serde_json::{json, Value};

/// Every file beneath `root`: its content and mode.
fn tree(root: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                files.insert(
                    name,
                    (std::fs::read(&path).unwrap(), meta.permissions().mode() & 0o7777),
                );
            }
        }
    }
    files
}

fn file(content: &str, mode: u32) -> (Vec<u8>, u32) {
    (content.as_bytes().to_vec(), mode)
}

/// The workspace after step 1 of [`three_steps`].
fn after_step_one() -> BTreeMap<String, (Vec<u8>, u32)> {
    BTreeMap::from([
        ("a.txt".to_string(), file("A1\n", 0o644)),
        ("keep.txt".to_string(), file("old line\n", 0o644)),
        ("gone.txt".to_string(), file("bye\n", 0o644)),
        ("src/lib.rs".to_string(), file("fn f() {}\n", 0o644)),
    ])
}

struct Ran {
    dir: tempfile::TempDir,
    server: FakeServer,
    run_id: String,
    session_id: String,
}

impl Ran {
    fn ws(&self) -> std::path::PathBuf {
        self.dir.path().join("ws")
    }

    fn loom(&self) -> std::process::Command {
        let mut cmd = loom_in(&self.ws());
        cmd.env("OPENAI_API_KEY", "sk-test");
        cmd
    }

    /// `loom runs ARGS` in the workspace; its output.
    fn runs(&self, args: &[&str]) -> std::process::Output {
        self.loom().arg("runs").args(args).output().unwrap()
    }

    /// The next run of the session: `loom run --session`, whose request
    /// body is the server's last.
    fn next_run(&self, prompt: &str) -> Value {
        self.next_run_with(prompt, &[])
    }

    /// [`Ran::next_run`] with `args` besides.
    fn next_run_with(&self, prompt: &str, args: &[&str]) -> Value {
        let out = self
            .loom()
            .args(["run", "--yes", "--model", "openai:test", "--base-url"])
            .arg(self.server.url())
            .args(args)
            .args(["--session", &self.session_id, prompt])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        self.server.requests().last().unwrap().body.clone()
    }
}

/// A run of three steps: write a.txt; edit keep.txt; with bash create
/// made.txt, delete gone.txt and make a.txt executable. Then its answer,
/// and one more answer for a later run.
fn three_steps() -> Ran {
    three_steps_in(tempfile::tempdir().unwrap(), &[])
}

/// [`three_steps`] in `dir`, with `loom run` given `args` besides.
fn three_steps_in(dir: tempfile::TempDir, args: &[&str]) -> Ran {
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("keep.txt"), "old line\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("src/lib.rs"), "fn f() {}\n").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "write_file",
            r#"{"path": "a.txt", "content": "A1\n"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "call_2",
            "edit_file",
            r#"{"path": "keep.txt", "old_string": "old line", "new_string": "EDITED line"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "call_3",
            "bash",
            r#"{"command": "echo made > made.txt && rm gone.txt && chmod 755 a.txt && mkdir -p out && echo o > out/x"}"#,
        )])),
        Reply::Sse(openai_text("All three steps done.", 8)),
        Reply::Sse(openai_text("Continued after the rewind.", 8)),
        Reply::Sse(openai_text("A second answer.", 8)),
    ]);
    let out = loom_in(&ws)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["run", "--json", "--yes", "--model", "openai:test", "--base-url"])
        .arg(server.url())
        .args(args)
        .arg("first task")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events = json_lines(&out.stdout);
    let recorded: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "snapshot.recorded")
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(recorded, [0, 1, 2, 3], "step 0 before the first call, then each step");
    let step3 = events
        .iter()
        .find(|e| e["type"] == "snapshot.recorded" && e["step"] == 3)
        .unwrap();
    assert_eq!(step3["changed"], serde_json::json!(["a.txt", "made.txt", "out/x"]));
    assert_eq!(step3["removed"], serde_json::json!(["gone.txt"]));
    let run_id = events[0]["runId"].as_str().unwrap().to_string();
    assert_eq!(std::fs::read_to_string(ws.join("keep.txt")).unwrap(), "EDITED line\n");
    Ran {
        dir,
        server,
        session_id: run_id.clone(),
        run_id,
    }
}

/// The messages a request body sent, texts and calls alike.
fn texts(body: &Value) -> String {
    body["messages"].to_string()
}

#[test]
fn a_rewind_to_step_one_restores_the_files_and_the_next_chat_turn_sees_the_conversation_up_to_it() {
    let ran = three_steps();
    let ws = ran.ws();
    let before = tree(&ws);

    // A dry run lists and changes nothing.
    let dry = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--dry-run"]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let listed = String::from_utf8_lossy(&dry.stdout);
    for line in [
        "would restore: a.txt",
        "would restore: gone.txt",
        "would restore: keep.txt",
        "would remove: made.txt",
        "would remove: out/x",
    ] {
        assert!(listed.contains(line), "{line} in {listed}");
    }
    assert_eq!(tree(&ws), before, "a dry run changes nothing");

    let out = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tree(&ws), after_step_one(), "byte for byte and mode for mode");
    assert!(!ws.join("out").exists(), "a folder the rewind emptied goes");
    assert_eq!(report["event"]["type"], "run.rewound");
    assert_eq!(report["event"]["toStep"], 1);

    // The run's log shows the rewind, after its end.
    let events = json_lines(&ran.runs(&["events", &ran.run_id]).stdout);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run.rewound");
    assert_eq!(last["continuedBy"], report["continuedBy"]);

    // The next chat turn is sent the conversation as of step 1.
    let mut chat = ran
        .loom()
        .args(["chat", "--yes", "--model", "openai:test", "--base-url"])
        .arg(ran.server.url())
        .args(["--session", &ran.session_id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let asked = ran.server.requests().len();
    let mut input = chat.stdin.take().unwrap();
    input.write_all(b"what now?\n").unwrap();
    let started = std::time::Instant::now();
    while ran.server.requests().len() == asked && started.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    input.write_all(b"/exit\n").unwrap();
    drop(input);
    let out = chat.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let body = ran.server.requests().last().unwrap().body.clone();
    let sent = texts(&body);
    assert!(sent.contains("first task") && sent.contains("call_1"), "{sent}");
    assert!(
        !sent.contains("call_2") && !sent.contains("EDITED"),
        "step 2 is gone: {sent}"
    );
    assert!(!sent.contains("All three steps done"), "{sent}");
    // Step 1's result, then the new prompt (which this server is sent
    // inside the tool message that ends the history: docs/context.md).
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{sent}");
    let last = messages.last().unwrap();
    assert_eq!(last["tool_call_id"], "call_1");
    assert!(last["content"].to_string().contains("what now?"), "{sent}");
}

#[test]
fn files_only_and_conversation_only_rewind_one_side() {
    let ran = three_steps();
    let ws = ran.ws();
    let finished = tree(&ws);

    // The conversation only: the files stay as the run left them.
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "0", "--conversation"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&ws), finished);
    let sent = texts(&ran.next_run("start over"));
    assert!(
        !sent.contains("first task"),
        "step 0 is before the run's prompt: {sent}"
    );

    // The files only: back to step 1, and the session goes on from where
    // it was (its last run).
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--files"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&ws), after_step_one());
    let sent = texts(&ran.next_run("and again"));
    assert!(sent.contains("start over") && !sent.contains("first task"), "{sent}");
}

#[test]
fn a_rewind_refuses_when_a_file_changed_outside_loom_unless_forced() {
    let ran = three_steps();
    let ws = ran.ws();
    std::fs::write(ws.join("keep.txt"), "a person's edit\n").unwrap();
    let changed = tree(&ws);
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("keep.txt") && said.contains("--force"), "{said}");
    assert_eq!(tree(&ws), changed, "nothing restored");
    let events = json_lines(&ran.runs(&["events", &ran.run_id]).stdout);
    assert_ne!(
        events.last().unwrap()["type"],
        "run.rewound",
        "a refusal is not a rewind"
    );

    let out = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--force"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&ws), after_step_one());

    // Unknown steps and runs are refused too.
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no step 9"));
}

#[test]
fn a_fork_into_a_copy_leaves_the_original_as_it_was_and_continues_from_step_one() {
    let ran = three_steps();
    let ws = ran.ws();
    let original = tree(&ws);
    let copy = ran.dir.path().join("copy");
    let out = ran
        .loom()
        .args(["runs", "fork", &ran.run_id, "--step", "1", "--into"])
        .arg(&copy)
        .args([
            "--prompt",
            "carry on in the copy",
            "--json",
            "--yes",
            "--model",
            "openai:test",
            "--base-url",
        ])
        .arg(ran.server.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&ws), original, "the original workspace is untouched");
    assert_eq!(tree(&copy), after_step_one(), "the copy is the workspace as of step 1");

    let events = json_lines(&out.stdout);
    let start = &events[0];
    assert_eq!(start["type"], "lifecycle.start");
    assert_eq!(start["forkedFrom"]["runId"], ran.run_id.as_str());
    assert_eq!(start["forkedFrom"]["step"], 1);
    let fork_session = start["runId"].as_str().unwrap();
    assert_ne!(fork_session, ran.session_id);
    let sent = texts(&ran.server.requests().last().unwrap().body);
    assert!(
        sent.contains("first task") && sent.contains("call_1") && !sent.contains("call_2"),
        "{sent}"
    );
    assert!(sent.contains("carry on in the copy"));

    // The original's log links to the fork.
    let events = json_lines(&ran.runs(&["events", &ran.run_id]).stdout);
    let forked = events.last().unwrap();
    assert_eq!(forked["type"], "run.forked");
    assert_eq!(forked["forkRunId"], fork_session);

    // A copy goes only into a new or empty folder.
    let out = ran
        .loom()
        .args(["runs", "fork", &ran.run_id, "--step", "1", "--into"])
        .arg(&copy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `/undo` and `/rewind` in `loom chat`: the last task's file goes and
/// the next task is not told of it; the list shows each task's steps with
/// their files, and the pick takes the workspace before the first task.
#[test]
fn chat_undo_takes_the_last_task_back_and_rewind_goes_to_the_point_picked() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "mine\n").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_a",
            "write_file",
            r#"{"path": "one.txt", "content": "1"}"#,
        )])),
        Reply::Sse(openai_text("Wrote one.", 8)),
        Reply::Sse(openai_tool_calls(&[(
            "call_b",
            "write_file",
            r#"{"path": "two.txt", "content": "2"}"#,
        )])),
        Reply::Sse(openai_text("Wrote two.", 8)),
        Reply::Sse(openai_text("Third answer.", 8)),
    ]);
    let mut chat = loom_in(&ws)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["chat", "--yes", "--model", "openai:test", "--base-url"])
        .arg(server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines are taken one at a time: each task ends before the next line.
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"first task\nsecond task\n/undo\nthird task\n/rewind\n1\n/exit\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("back to before «second task»; removed two.txt"), "{said}");
    let third = &server.requests()[4].body;
    let sent = texts(third);
    assert!(sent.contains("first task") && sent.contains("third task"), "{sent}");
    assert!(
        !sent.contains("second task") && !sent.contains("call_b"),
        "undone: {sent}"
    );
    assert!(said.contains("1) before «first task»"), "{said}");
    assert!(said.contains("2) «first task» after step 1: one.txt"), "{said}");
    assert!(
        !said.contains("before «second task»\n"),
        "an undone task is not listed: {said}"
    );
    assert!(said.contains("3) before «third task»"), "{said}");
    assert!(said.contains("back to before «first task»; removed one.txt"), "{said}");
    assert_eq!(
        tree(&ws),
        BTreeMap::from([("notes.txt".to_string(), file("mine\n", 0o644))])
    );
}

/// A hostile step: the model swaps a folder for a link to a folder outside
/// the workspace. The rewind puts the folder back and writes nothing
/// outside; `.loom/` and a run database kept in the workspace are never
/// in a snapshot and never touched.
#[test]
fn a_rewind_never_writes_through_a_link_out_of_the_workspace_nor_touches_loom_state() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(ws.join(".loom")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(ws.join("sub/a.txt"), "inside\n").unwrap();
    std::fs::write(ws.join(".loom/notes.md"), "project notes\n").unwrap();
    std::fs::write(outside.join("a.txt"), "OUTSIDE\n").unwrap();
    let swap = format!("rm -rf sub && ln -s {} sub", outside.display());
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "write_file",
            r#"{"path": "sub/b.txt", "content": "B\n"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "call_2",
            "bash",
            &serde_json::json!({ "command": swap }).to_string(),
        )])),
        Reply::Sse(openai_text("Swapped.", 8)),
    ]);
    let out = loom_in(&ws)
        .env("OPENAI_API_KEY", "sk-test")
        .args([
            "run",
            "--json",
            "--yes",
            "--db",
            "loom.db",
            "--model",
            "openai:test",
            "--base-url",
        ])
        .arg(server.url())
        .arg("swap it")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events = json_lines(&out.stdout);
    for recorded in events.iter().filter(|e| e["type"] == "snapshot.recorded") {
        let named = recorded.to_string();
        assert!(
            !named.contains("loom.db") && !named.contains("loom-snapshots"),
            "{named}"
        );
        assert!(!named.contains(".loom/"), "{named}");
    }
    let run_id = events[0]["runId"].as_str().unwrap().to_string();
    assert!(std::fs::symlink_metadata(ws.join("sub")).unwrap().is_symlink());
    std::fs::write(ws.join(".loom/later.md"), "written after the run\n").unwrap();
    let outside_before = tree(&outside);
    let loom_before = tree(&ws.join(".loom"));

    let out = loom_in(&ws)
        .args(["runs", "--db", "loom.db", "rewind", &run_id, "--step", "1", "--files"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        std::fs::symlink_metadata(ws.join("sub")).unwrap().is_dir(),
        "a folder again"
    );
    assert_eq!(std::fs::read_to_string(ws.join("sub/a.txt")).unwrap(), "inside\n");
    assert_eq!(std::fs::read_to_string(ws.join("sub/b.txt")).unwrap(), "B\n");
    assert_eq!(tree(&outside), outside_before, "nothing written outside");
    assert_eq!(tree(&ws.join(".loom")), loom_before, ".loom/ untouched");
    // The database in the workspace is whole: it still reads.
    let listed = loom_in(&ws).args(["runs", "--db", "loom.db", "list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&run_id));
}

/// Two rewinds at once (two processes): each file comes from one of the
/// two steps' restores as a whole workspace — never a mix — and both
/// rewinds are in the run's log, each with its own `seq`. And files are
/// not restored under a run that is executing in the workspace.
#[test]
fn rewinds_at_once_do_not_mix_and_none_restores_under_a_live_run() {
    let ran = three_steps();
    let ws = ran.ws();
    let mut after_step_zero = after_step_one();
    after_step_zero.remove("a.txt");
    let spawn = |step: &str| {
        ran.loom()
            .args([
                "runs",
                "rewind",
                &ran.run_id,
                "--step",
                step,
                "--files",
                "--force",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (one, zero) = (spawn("1"), spawn("0"));
    let (one, zero) = (one.wait_with_output().unwrap(), zero.wait_with_output().unwrap());
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    assert!(zero.status.success(), "{}", String::from_utf8_lossy(&zero.stderr));
    let now = tree(&ws);
    assert!(
        now == after_step_one() || now == after_step_zero,
        "a mix of two steps: {now:?}"
    );
    let events = json_lines(&ran.runs(&["events", &ran.run_id]).stdout);
    let rewound: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "run.rewound")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(rewound.len(), 2, "both rewinds are in the log: {rewound:?}");
    assert_ne!(rewound[0], rewound[1]);

    // A run that is executing in the workspace (a long shell command).
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("slow.json");
    std::fs::write(
        &script,
        r#"[{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 4"}}]}, {"content": "slept"}]"#,
    )
    .unwrap();
    let mut live = ran
        .loom()
        .args(["run", "--yes", "--model"])
        .arg(format!("scripted:{}", script.display()))
        .arg("sleep a while")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let refused = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--files", "--force"]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("executing in this workspace"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(live.wait().unwrap().success());
}

/// Runs recorded in the cluster's Redis keep their snapshots there
/// (docs/rewind.md): `loom runs rewind --redis` on the machine the run
/// worked on restores its files; a run another machine executed is
/// refused here (its files are there).
#[test]
fn a_run_recorded_in_redis_is_rewound_from_the_snapshots_kept_there() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("redis-files")).unwrap();
    let redis = loom_testkit::redis_server::RedisServer::start(&dir.path().join("redis-files"))
        .unwrap_or_else(|err| panic!("{err}"));
    let url = redis.url(0);
    let ran = three_steps_in(dir, &["--redis", &url]);
    let ws = ran.ws();
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "1", "--redis", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&ws), after_step_one());
    let sent = texts(&ran.next_run_with("go on", &["--redis", &url]));
    assert!(
        sent.contains("first task") && sent.contains("call_1") && !sent.contains("call_2"),
        "{sent}"
    );

    // The run as if another machine's worker had executed it.
    let owner = std::process::Command::new("redis-cli")
        .args([
            "-u",
            &url,
            "HSET",
            &format!("loom:run:{}", ran.run_id),
            "owner",
            "elsewhere#0123456789ab/pid:7",
        ])
        .output()
        .unwrap();
    assert!(owner.status.success(), "{}", String::from_utf8_lossy(&owner.stderr));
    let before = tree(&ws);
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "0", "--redis", &url]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("another machine") && said.contains("elsewhere"), "{said}");
    assert_eq!(tree(&ws), before);
    // Its conversation alone is the store's, rewound from anywhere.
    let out = ran.runs(&["rewind", &ran.run_id, "--step", "0", "--conversation", "--redis", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Where an attacker who reaches the snapshot store writes: the delta of
/// a step of a run (a shared Redis's record, or the SQLite file's row),
/// and contents by hash.
enum Records {
    Redis(String),
    Sqlite(std::path::PathBuf),
}

impl Records {
    fn redis(url: &str, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-u", url])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn sqlite(db: &Path) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        conn
    }

    /// The delta of `step` of `run`, as stored.
    fn delta(&self, run: &str, step: u32) -> Value {
        match self {
            Self::Redis(url) => {
                let record = Self::redis(url, &["HGET", &format!("loom:snap-point:{run}"), &step.to_string()]);
                serde_json::from_str::<Value>(record.trim()).unwrap()["delta"].clone()
            }
            Self::Sqlite(db) => {
                let text: String = Self::sqlite(db)
                    .query_row(
                        "SELECT delta FROM snapshot_points WHERE run_id = ?1 AND step = ?2",
                        rusqlite::params![run, step],
                        |row| row.get(0),
                    )
                    .unwrap();
                serde_json::from_str(&text).unwrap()
            }
        }
    }

    fn set_delta(&self, run: &str, step: u32, delta: &Value) {
        match self {
            Self::Redis(url) => {
                let (key, field) = (format!("loom:snap-point:{run}"), step.to_string());
                let mut record: Value = serde_json::from_str(Self::redis(url, &["HGET", &key, &field]).trim()).unwrap();
                record["delta"] = delta.clone();
                Self::redis(url, &["HSET", &key, &field, &record.to_string()]);
            }
            Self::Sqlite(db) => {
                Self::sqlite(db)
                    .execute(
                        "UPDATE snapshot_points SET delta = ?3 WHERE run_id = ?1 AND step = ?2",
                        rusqlite::params![run, step, delta.to_string()],
                    )
                    .unwrap();
            }
        }
    }

    fn put_content(&self, hash: &str, content: &[u8]) {
        match self {
            Self::Redis(url) => {
                let text = std::str::from_utf8(content).unwrap();
                Self::redis(url, &["SET", &format!("loom:snap-content:{hash}"), text]);
            }
            Self::Sqlite(db) => {
                Self::sqlite(db)
                    .execute(
                        "INSERT OR REPLACE INTO snapshot_contents (hash, data) VALUES (?1, ?2)",
                        rusqlite::params![hash, content],
                    )
                    .unwrap();
            }
        }
    }

    /// A record of `path` in step 0 of `run`, gone again at step 1 (as if
    /// the run had removed it): the workspace as Loom last recorded it
    /// does not hold it, so a rewind to step 0 sees no change made
    /// outside Loom, and would write it without `--force`.
    fn plant(&self, run: &str, original: &[Value; 2], path: &str, entry: &Value) {
        let mut zero = original[0].clone();
        zero["changed"][path] = entry.clone();
        self.set_delta(run, 0, &zero);
        let mut one = original[1].clone();
        let removed = one["removed"].as_array_mut().unwrap();
        removed.push(json!(path));
        self.set_delta(run, 1, &one);
    }

    fn put_back(&self, run: &str, original: &[Value; 2]) {
        self.set_delta(run, 0, &original[0]);
        self.set_delta(run, 1, &original[1]);
    }
}

fn sha256(content: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Records an attacker wrote into the store (docs/security.md, "A crafted
/// snapshot record"): each one refuses `loom runs rewind RUN --step 0`
/// (no `--force`), naming it, and the workspace is left byte for byte and
/// mode for mode as it was — no `.git/hooks` file, no setuid bit. The
/// record put back as the run's scan wrote it, the rewind goes through.
fn crafted_records_refuse_the_rewind(ran: &Ran, records: &Records, args: &[&str]) {
    let ws = ran.ws();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let original = [records.delta(&ran.run_id, 0), records.delta(&ran.run_id, 1)];
    let hook: &[u8] = b"#!/bin/sh\nid > /tmp/loom-crafted-snapshot-pwned\n";
    let entry = |content: &[u8], mode: u32| json!({"hash": sha256(content), "size": content.len(), "mode": mode});
    let claimed: &[u8] = b"what the record claims";
    let cases: Vec<(&str, Value, &[u8], &str)> = vec![
        (".git/hooks/pre-commit", entry(hook, 0o755), hook, "no snapshot holds"),
        (
            "lib/.git/hooks/post-checkout",
            entry(hook, 0o755),
            hook,
            "no snapshot holds",
        ),
        ("root-shell", entry(hook, 0o6755), hook, "0o6755"),
        ("fifo", entry(hook, 0o010_644), hook, "file type"),
        (".loom/x", entry(hook, 0o644), hook, "no snapshot holds"),
        ("loom.toml", entry(hook, 0o644), hook, "no snapshot holds"),
        (
            "wrong-hash.txt",
            entry(claimed, 0o644),
            b"what the record CLAIMS",
            "does not hash",
        ),
        (
            "wrong-size.txt",
            json!({"hash": sha256(hook), "size": 7, "mode": 0o644}),
            hook,
            "the record says 7",
        ),
        (
            "escape",
            json!({"hash": sha256(b"/etc"), "size": 4, "mode": 0o777, "link": true}),
            b"/etc",
            "leads out",
        ),
    ];
    let before = tree(&ws);
    for (path, entry, content, why) in cases {
        records.plant(&ran.run_id, &original, path, &entry);
        records.put_content(entry["hash"].as_str().unwrap(), content);
        let out = ran.runs(&[&["rewind", &ran.run_id, "--step", "0"], args].concat());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path}: the rewind went through: {said}");
        assert!(said.contains(path) && said.contains(why), "{path}: {said}");
        assert_eq!(tree(&ws), before, "{path}: the workspace changed");
    }
    assert!(!ws.join(".git/hooks/pre-commit").exists());
    assert!(
        tree(&ws).values().all(|(_, mode)| mode & 0o7000 == 0),
        "no setuid, setgid or sticky bit"
    );

    // `/undo` in `loom chat` is refused the same way.
    records.plant(&ran.run_id, &original, ".git/hooks/pre-commit", &entry(hook, 0o755));
    records.put_content(&sha256(hook), hook);
    let mut chat = ran
        .loom()
        .args(["chat", "--yes", "--model", "openai:test", "--base-url"])
        .arg(ran.server.url())
        .args(args)
        .args(["--session", &ran.session_id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin.take().unwrap().write_all(b"/undo\n/exit\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(".git/hooks/pre-commit") && said.contains("refused"),
        "{said}"
    );
    assert_eq!(tree(&ws), before, "/undo changed the workspace");

    records.put_back(&ran.run_id, &original);
    let out = ran.runs(&[&["rewind", &ran.run_id, "--step", "0", "--files"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut step_zero = after_step_one();
    step_zero.remove("a.txt");
    step_zero.insert(".git/config".to_string(), before[".git/config"].clone());
    assert_eq!(tree(&ws), step_zero);
}

/// A run recorded with its snapshots in the cluster's Redis; then whoever
/// reaches that Redis writes snapshot records.
#[test]
fn crafted_snapshot_records_in_redis_refuse_the_rewind_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("redis-files")).unwrap();
    let redis = loom_testkit::redis_server::RedisServer::start(&dir.path().join("redis-files"))
        .unwrap_or_else(|err| panic!("{err}"));
    let url = redis.url(0);
    let ran = three_steps_in(dir, &["--redis", &url]);
    crafted_records_refuse_the_rewind(&ran, &Records::Redis(url.clone()), &["--redis", &url]);
}

/// The same, written into the SQLite file the snapshots are kept in.
#[test]
fn crafted_snapshot_records_in_sqlite_refuse_the_rewind_and_write_nothing() {
    let ran = three_steps();
    let db = common::database_of(&ran.ws()).with_file_name("loom-snapshots.db");
    crafted_records_refuse_the_rewind(&ran, &Records::Sqlite(db), &[]);
}

/// `.git/` is in no snapshot: a step that changed `.git/config` is
/// rewound, and `.git/` stays as the step left it.
#[test]
fn a_rewind_leaves_git_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "bash",
            r#"{"command": "printf '[user]\\n' >> .git/config && echo y > b.txt"}"#,
        )])),
        Reply::Sse(openai_text("Changed.", 8)),
    ]);
    let out = loom_in(&ws)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["run", "--json", "--yes", "--model", "openai:test", "--base-url"])
        .arg(server.url())
        .arg("change git's config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events = json_lines(&out.stdout);
    for recorded in events.iter().filter(|e| e["type"] == "snapshot.recorded") {
        assert!(!recorded.to_string().contains(".git/"), "{recorded}");
    }
    let run_id = events[0]["runId"].as_str().unwrap().to_string();
    let git_before = tree(&ws.join(".git"));
    assert_eq!(git_before["config"].0, b"[core]\n[user]\n");
    let out = loom_in(&ws)
        .args(["runs", "rewind", &run_id, "--step", "0", "--files"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!ws.join("b.txt").exists());
    assert_eq!(tree(&ws.join(".git")), git_before, ".git/ untouched");
}

/// `--into` through a link the model planted in the workspace, to the
/// user's configuration folder, is refused and writes nothing there; so is
/// `--into` the configuration or Loom's state directly.
#[test]
fn a_fork_into_a_planted_link_or_the_users_configuration_or_state_is_refused() {
    let ran = three_steps();
    let ws = ran.ws();
    let home = ran.dir.path().join("home");
    let xdg = ran.dir.path().join("xdg");
    let config = xdg.join("loom");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(home.join(".config/loom")).unwrap();
    std::os::unix::fs::symlink(&config, ws.join("planted")).unwrap();
    std::os::unix::fs::symlink(home.join(".config"), ws.join("planted-home")).unwrap();
    let state = common::state_base().join("copy");
    let fork_into = |into: &Path| {
        ran.loom()
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", &xdg)
            .args(["runs", "fork", &ran.run_id, "--step", "1", "--into"])
            .arg(into)
            .output()
            .unwrap()
    };
    let (link, config_there, state_there) = ("symbolic link", "your Loom configuration", "Loom's state");
    for (into, why) in [
        (ws.join("planted"), link),
        (ws.join("planted/agents"), link),
        (ws.join("planted-home/loom"), link),
        (config.clone(), config_there),
        (config.join("agents"), config_there),
        (home.join(".config/loom"), config_there),
        (home.join(".config"), config_there),
        (state.clone(), state_there),
        (common::state_base(), state_there),
    ] {
        let out = fork_into(&into);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {said}", into.display());
        assert!(said.contains(why), "{}: {said}", into.display());
    }
    assert_eq!(std::fs::read_dir(&config).unwrap().count(), 0, "nothing written there");
    assert_eq!(std::fs::read_dir(home.join(".config/loom")).unwrap().count(), 0);
    assert!(!state.exists());
    // Into a real folder elsewhere, the fork goes through.
    let out = fork_into(&ran.dir.path().join("copy"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
