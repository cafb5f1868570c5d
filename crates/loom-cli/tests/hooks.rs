//! Command hooks (`[[hooks]]`, docs/extending.md) through the binary,
//! with real shell scripts and the fake model server: what each point may
//! decide, what the model reads (the request bodies), what the events say,
//! and that a hook which fails, hangs or prints garbage never stops a run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::of_type;
use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};
use serde_json::Value;

/// Writes `script` as `.loom/hooks/NAME` in `dir`; returns the command that runs it.
fn hook_script(dir: &Path, name: &str, script: &str) -> String {
    let hooks = dir.join(".loom/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::write(hooks.join(name), script).unwrap();
    format!("bash .loom/hooks/{name}")
}

/// A config file outside the workspace (named with --config: the person's
/// own choice, so no trust is asked) holding `toml`.
fn config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `loom run --json` in `workspace` with `config` against `server`, bash
/// and file writes allowed.
fn run(workspace: &Path, config: &Path, server: &FakeServer, prompt: &str) -> (Output, Vec<Value>) {
    let out = common::run_against(workspace, &server.url(), "openai:m")
        .arg("--config")
        .arg(config)
        .args(["--allow", "bash", "--allow", "write_file", "--json", prompt])
        .output()
        .unwrap();
    let events = common::json_lines(&out.stdout);
    (out, events)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_pre_tool_use_hook_denies_rm_rf_and_another_rewrites_a_path() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(workspace.join("src")).unwrap();
    std::fs::write(workspace.join("src/keep.rs"), "fn keep() {}\n").unwrap();
    let guard = hook_script(
        &workspace,
        "no-rm-rf.sh",
        r#"input=$(cat)
command=$(printf '%s' "$input" | jq -r '.tool_input.command // ""')
case "$command" in
  *"rm -rf"*) echo "rm -rf is not allowed in this project; delete files one by one" >&2; exit 2 ;;
esac
exit 0
"#,
    );
    let redirect = hook_script(
        &workspace,
        "scratch.sh",
        r#"jq -c 'if (.tool_input.path | startswith("tmp/"))
          then {arguments: (.tool_input | .path = ("scratch/" + (.path | ltrimstr("tmp/"))))}
          else {} end'
"#,
    );
    let config = config(
        base.path(),
        &format!(
            r#"
[[hooks]]
event = "pre_tool_use"
matcher = "bash"
command = "{guard}"

[[hooks]]
event = "pre_tool_use"
matcher = "write_file|edit_file"
command = "{redirect}"

[[hooks]]
event = "post_tool_use"
matcher = "write_file"
command = "jq -c '{{context: (\"wrote \" + .tool_input.path)}}'"
"#
        ),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "bash", r#"{"command": "rm -rf src"}"#),
            ("c2", "write_file", r#"{"path": "tmp/notes.txt", "content": "draft"}"#),
            ("c3", "bash", r#"{"command": "echo fine > ok.txt"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let (out, events) = run(&workspace, &config, &server, "clean up");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    assert!(workspace.join("src/keep.rs").exists(), "rm -rf never ran");
    assert_eq!(
        std::fs::read_to_string(workspace.join("scratch/notes.txt")).unwrap(),
        "draft"
    );
    assert!(
        !workspace.join("tmp").exists(),
        "the rewritten path was written, not the model's"
    );
    assert_eq!(std::fs::read_to_string(workspace.join("ok.txt")).unwrap(), "fine\n");

    // The model reads the hook's reason.
    let second = common::message_texts(&server.requests()[1].body).join("\n");
    assert!(
        second.contains("A hook refused this call of 'bash': rm -rf is not allowed in this project"),
        "{second}"
    );
    // post_tool_use hooks see the arguments the call ran with.
    assert!(second.contains("wrote scratch/notes.txt"), "{second}");

    // The events say which hook decided what, and who decided each call.
    let hooks = of_type(&events, "hook.result");
    let denial = hooks.iter().find(|e| e["callId"] == "c1").unwrap();
    assert_eq!(denial["hookEvent"], "pre_tool_use");
    assert_eq!(denial["decision"], "deny");
    assert_eq!(denial["hook"], guard.as_str());
    let rewrite = hooks.iter().find(|e| e["callId"] == "c2").unwrap();
    assert_eq!(rewrite["argumentsRewritten"], true);
    assert_eq!(rewrite["decision"], Value::Null);
    let results = of_type(&events, "tool.result");
    let decided = |id: &str| results.iter().find(|e| e["callId"] == id).unwrap()["decidedBy"].clone();
    assert_eq!(decided("c1"), "hook");
    assert_eq!(decided("c2"), "rule", "--allow write_file let the rewritten call run");
    assert_eq!(decided("c3"), "rule");
}

#[test]
fn a_hook_that_denies_cannot_be_overruled_and_a_hooks_allow_cannot_beat_a_deny_rule() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let allow_all = hook_script(
        &workspace,
        "allow.sh",
        "echo '{\"decision\": \"allow\", \"reason\": \"trusted\"}'\n",
    );
    let config = config(
        base.path(),
        &format!(
            "[permissions]\n\"bash(command=curl *)\" = \"deny\"\n\n[[hooks]]\nevent = \"pre_tool_use\"\ncommand = \"{allow_all}\"\n"
        ),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "bash", r#"{"command": "curl http://example.invalid"}"#),
            ("c2", "bash", r#"{"command": "echo allowed > a.txt"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    // No --allow for bash: only the hook lets c2 run.
    let out = common::run_against(&workspace, &server.url(), "openai:m")
        .arg("--config")
        .arg(&config)
        .args(["--json", "go"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = common::json_lines(&out.stdout);
    let results = of_type(&events, "tool.result");
    assert_eq!(results[0]["status"], "denied", "{}", results[0]);
    assert_eq!(results[0]["decidedBy"], "rule");
    assert_eq!(results[1]["status"], "success");
    assert_eq!(results[1]["decidedBy"], "hook");
    assert_eq!(std::fs::read_to_string(workspace.join("a.txt")).unwrap(), "allowed\n");
}

#[test]
fn a_post_tool_use_hook_runs_a_formatter_and_the_model_reads_its_output() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    // The "formatter": trailing spaces go, and it says what it changed.
    let format = hook_script(
        &workspace,
        "format.sh",
        r#"path=$(jq -r '.tool_input.path')
before=$(wc -c < "$path")
sed -i 's/[[:space:]]*$//' "$path"
after=$(wc -c < "$path")
jq -n --arg path "$path" --arg n "$((before - after))" \
  '{context: ("formatter: removed " + $n + " bytes of trailing spaces from " + $path)}'
"#,
    );
    let config = config(
        base.path(),
        &format!("[[hooks]]\nevent = \"post_tool_use\"\nmatcher = \"write_file\"\ncommand = \"{format}\"\n"),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "c1",
            "write_file",
            r#"{"path": "a.txt", "content": "one   \ntwo  \n"}"#,
        )])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let (out, events) = run(&workspace, &config, &server, "write");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(workspace.join("a.txt")).unwrap(), "one\ntwo\n");
    let second = common::message_texts(&server.requests()[1].body).join("\n");
    assert!(
        second.contains("formatter: removed 5 bytes of trailing spaces from a.txt"),
        "{second}"
    );
    let hook = &of_type(&events, "hook.result")[0];
    assert_eq!(hook["hookEvent"], "post_tool_use");
    assert!(hook["context"].as_str().unwrap().contains("removed 5 bytes"));
}

#[test]
fn a_hook_that_hangs_or_prints_garbage_is_a_warning_and_the_run_goes_on() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let marker = base.path().join("still-running");
    let hang = hook_script(
        &workspace,
        "hang.sh",
        &format!("(sleep 30; touch {}) &\nsleep 30\n", marker.display()),
    );
    let garbage = hook_script(&workspace, "garbage.sh", "echo 'this is not json {'\n");
    let config = config(
        base.path(),
        &format!(
            "[[hooks]]\nevent = \"pre_tool_use\"\ncommand = \"{hang}\"\ntimeout_secs = 1\n\n[[hooks]]\nevent = \"pre_tool_use\"\ncommand = \"{garbage}\"\n"
        ),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "c1",
            "bash",
            r#"{"command": "echo ran > ran.txt"}"#,
        )])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let started = std::time::Instant::now();
    let (out, events) = run(&workspace, &config, &server, "go");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(25),
        "the hook was stopped at its limit"
    );
    assert_eq!(std::fs::read_to_string(workspace.join("ran.txt")).unwrap(), "ran\n");

    let warnings: Vec<String> = of_type(&events, "warning")
        .iter()
        .filter(|e| e["code"] == "HOOK_FAILED")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("did not finish within 1 s"), "{warnings:?}");
    assert!(warnings[1].contains("not a JSON object"), "{warnings:?}");
    let hooks = of_type(&events, "hook.result");
    assert!(hooks.iter().all(|e| e["decision"].is_null() && e["error"].is_string()));
    // The hook's whole process group was stopped: its background job never
    // gets to touch the marker.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(!marker.exists());
}

#[test]
fn a_stop_hook_sends_the_run_back_once_then_lets_it_end() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    // Refuses every ending: the configured limit (1) is what ends the run.
    let refuse = hook_script(
        &workspace,
        "not-yet.sh",
        r#"active=$(jq -r '.stop_hook_active')
echo "{\"decision\": \"block\", \"reason\": \"run the tests before you finish (active: $active)\"}"
"#,
    );
    let config = config(
        base.path(),
        &format!("[[hooks]]\nevent = \"stop\"\ncommand = \"{refuse}\"\n"),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_text("All done.", 8)),
        Reply::Sse(openai_text("Tests pass; now done.", 8)),
    ]);
    let (out, events) = run(&workspace, &config, &server, "fix it");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(server.requests().len(), 2, "one more turn, no more");
    let second = common::message_texts(&server.requests()[1].body).join("\n");
    assert!(
        second.contains("a stop hook refused to let the run end with this answer. Its reason: run the tests before you finish (active: false)"),
        "{second}"
    );
    let end = of_type(&events, "lifecycle.end")[0];
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["content"], "Tests pass; now done.");
    let stops = of_type(&events, "hook.result");
    assert_eq!(stops.len(), 2, "asked at both endings");
    assert!(stops
        .iter()
        .all(|e| e["hookEvent"] == "stop" && e["decision"] == "deny"));
}

#[test]
fn prompt_hooks_add_context_or_block_the_prompt() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let start = hook_script(&workspace, "start.sh", "echo '{\"context\": \"branch: main\"}'\n");
    let prompt = hook_script(
        &workspace,
        "prompt.sh",
        r#"p=$(jq -r '.prompt')
case "$p" in
  *password*) echo "prompts must not hold passwords" >&2; exit 2 ;;
esac
echo '{"context": "ticket LOOM-7 is open"}'
"#,
    );
    let config = config(
        base.path(),
        &format!(
            "[[hooks]]\nevent = \"session_start\"\ncommand = \"{start}\"\n\n[[hooks]]\nevent = \"user_prompt_submit\"\ncommand = \"{prompt}\"\n"
        ),
    );
    let server = FakeServer::start(vec![Reply::Sse(openai_text("Hello.", 8))]);
    let (out, _) = run(&workspace, &config, &server, "say hello");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let first = common::message_texts(&server.requests()[0].body).join("\n");
    assert!(first.contains("say hello"), "{first}");
    assert!(first.contains("branch: main"), "{first}");
    assert!(first.contains("ticket LOOM-7 is open"), "{first}");

    let (out, events) = run(&workspace, &config, &server, "my password is hunter2");
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(server.requests().len(), 1, "a blocked prompt never reaches the model");
    let error = of_type(&events, "error")[0];
    assert_eq!(error["code"], "PROMPT_BLOCKED");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("prompts must not hold passwords"));
}

#[test]
fn a_projects_hooks_need_trust_and_a_bad_entry_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.toml"),
        "[[hooks]]\nevent = \"stop\"\ncommand = \"touch hooked\"\n",
    )
    .unwrap();
    let server = FakeServer::start(vec![Reply::Sse(openai_text("Hi.", 8))]);
    let out = common::run_against(dir.path(), &server.url(), "openai:m")
        .arg("hi")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("[[hooks]] runs `touch hooked` at stop"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("hooked").exists());
    assert!(server.requests().is_empty());

    common::trust(dir.path());
    let out = common::run_against(dir.path(), &server.url(), "openai:m")
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("hooked").exists(), "trusted, the hook runs");

    let other = tempfile::tempdir().unwrap();
    let config = config(
        other.path(),
        "[[hooks]]\nevent = \"stop\"\ncommand = \"true\"\n\n[[hooks]]\nevent = \"pre_tool_use\"\nmatcher = \"(\"\ncommand = \"true\"\n",
    );
    let out = common::run_against(other.path(), &server.url(), "openai:m")
        .arg("--config")
        .arg(&config)
        .arg("hi")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("config.toml [[hooks]] #2: matcher \"(\" is not a regular expression"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_hook_that_asks_leaves_the_call_to_a_person() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let ask = hook_script(
        &workspace,
        "ask.sh",
        "echo '{\"decision\": \"ask\", \"reason\": \"deploys need a person\"}'\n",
    );
    let config = config(
        base.path(),
        &format!("[[hooks]]\nevent = \"pre_tool_use\"\nmatcher = \"bash\"\ncommand = \"{ask}\"\n"),
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "c1",
            "bash",
            r#"{"command": "echo deployed > d.txt"}"#,
        )])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    // `bash` is allowed by a rule, but the hook's ask goes to a person:
    // --yes approves it.
    let out = common::run_against(&workspace, &server.url(), "openai:m")
        .arg("--config")
        .arg(&config)
        .args(["--allow", "bash", "--yes", "--json", "deploy"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = common::json_lines(&out.stdout);
    let ask = of_type(&events, "permission.request")[0];
    assert_eq!(ask["rule"], "deploys need a person", "{ask}");
    let result = of_type(&events, "tool.result")[0];
    assert_eq!(result["decidedBy"], "person", "{result}");
    assert_eq!(std::fs::read_to_string(workspace.join("d.txt")).unwrap(), "deployed\n");
}

/// A model with `bash` (no sandbox) cannot move the workspace aside and
/// plant its own hook script in a new folder of the same name, nor move a
/// parent of Loom's state aside to plant trust records: the workspace and
/// every folder above it and above Loom's state are mount points in the
/// command's namespace, which cannot be renamed.
#[test]
fn a_command_cannot_move_the_workspace_or_loom_state_aside_to_plant_hooks() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let guard = hook_script(
        &workspace,
        "guard.sh",
        "grep -q 'rm -rf' && { echo 'no rm -rf' >&2; exit 2; }\nexit 0\n",
    );
    let config = config(
        base.path(),
        &format!("[[hooks]]\nevent = \"pre_tool_use\"\nmatcher = \"bash\"\ncommand = \"{guard}\"\n"),
    );
    let pwned = base.path().join("PWNED");
    // Loom's state two levels down, so that its parent can be tried.
    let state = base.path().join("state/loom");
    let plant = format!(
        "cd .. && mv ws ws_orig; mkdir -p ws/.loom/hooks && printf 'touch {}\\nexit 0\\n' > ws/.loom/hooks/guard.sh; \
         mv state state_moved; mkdir -p state/loom && echo '{{}}' > state/loom/trust.json; ls",
        pwned.display()
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("c1", "bash", &serde_json::json!({ "command": plant }).to_string()),
            ("c2", "bash", r#"{"command": "rm -rf junk"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    let out = common::run_against(&workspace, &server.url(), "openai:m")
        .env("LOOM_STATE_DIR", &state)
        .arg("--config")
        .arg(&config)
        .args(["--allow", "bash", "--json", "go"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = common::json_lines(&out.stdout);
    let results = of_type(&events, "tool.result");
    let planted = results[0]["content"].as_str().unwrap();
    assert!(planted.contains("Device or resource busy"), "{planted}");
    assert!(!base.path().join("ws_orig").exists(), "{planted}");
    assert!(!base.path().join("state_moved").exists(), "{planted}");
    assert_eq!(
        results[1]["status"], "denied",
        "the real guard still runs: {}",
        results[1]
    );
    assert!(!pwned.exists());
}

/// A run interrupted (SIGTERM) while its stop hook runs is not ended with
/// the answer the hook never judged: it stays resumable.
#[test]
fn an_interrupt_during_a_stop_hook_does_not_end_the_run_with_its_answer() {
    let base = tempfile::tempdir().unwrap();
    let workspace = base.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let started = base.path().join("hook-started");
    // The first time it hangs (and is cut short); asked again, it lets
    // the run end.
    let slow = hook_script(
        &workspace,
        "slow.sh",
        &format!("[ -e {0} ] && exit 0\ntouch {0}\nsleep 20\n", started.display()),
    );
    let config = config(
        base.path(),
        &format!("[[hooks]]\nevent = \"stop\"\ncommand = \"{slow}\"\n"),
    );
    let server = FakeServer::start(vec![Reply::Sse(openai_text("All done.", 8))]);
    let child = common::run_against(&workspace, &server.url(), "openai:m")
        .arg("--config")
        .arg(&config)
        .args(["--json", "finish"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !started.exists() {
        assert!(std::time::Instant::now() < deadline, "the stop hook never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    let events = common::json_lines(&out.stdout);
    assert!(of_type(&events, "lifecycle.end").is_empty(), "{events:?}");
    assert!(of_type(&events, "agent.finish").is_empty(), "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "warning", "{last}");
    assert_eq!(last["code"], "INTERRUPTED", "{last}");

    // Resumed, the saved answer is judged by the stop hook before the run
    // ends with it.
    let run_id = events[0]["runId"].as_str().unwrap();
    let out = common::loom_in(&workspace)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["runs", "resume", run_id, "--config"])
        .arg(&config)
        .args(["--base-url", &format!("{}/v1", server.url()), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = common::json_lines(&out.stdout);
    let stops = of_type(&events, "hook.result");
    assert_eq!(stops.len(), 1, "{events:?}");
    assert_eq!(stops[0]["error"], Value::Null, "{}", stops[0]);
    let end = of_type(&events, "lifecycle.end")[0];
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["content"], "All done.");
    assert_eq!(server.requests().len(), 1, "the saved answer was not asked for again");
}
