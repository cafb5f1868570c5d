//! Permissions in `loom run`: the prompt on a real pseudo-terminal, `--yes`,
//! no terminal at all, `--allow/--deny` over loom.toml, and redaction.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::loom;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

fn write_script(dir: &Path, body: &str) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, body).unwrap();
    format!("scripted:{}", path.display())
}

const TWO_WRITES: &str = r#"[
  {"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"A"}}]},
  {"tool_calls":[{"name":"write_file","arguments":{"path":"b.txt","content":"B"}}]},
  {"content":"done"}
]"#;

fn events(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line.trim()).ok())
        .collect()
}

fn statuses(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.result")
        .map(|e| e["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn without_a_terminal_an_ask_is_a_clear_deny() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_script(dir.path(), TWO_WRITES);
    let output = loom()
        .args(["run", "--json", "--model", &model, "--workspace"])
        .arg(dir.path())
        .arg("write")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(!dir.path().join("a.txt").exists());
    let events = events(&output.stdout);
    assert_eq!(statuses(&events), vec!["denied", "denied"]);
    let content = events.iter().find(|e| e["type"] == "tool.result").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(content.contains("without a terminal"), "{content}");
    assert!(content.contains("--yes or --allow"), "{content}");
    assert!(
        !events.iter().any(|e| e["type"] == "permission.request"),
        "nobody is asked"
    );
}

#[test]
fn yes_approves_every_ask_and_the_events_show_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_script(dir.path(), TWO_WRITES);
    let output = loom()
        .args(["run", "--json", "--yes", "--model", &model, "--workspace"])
        .arg(dir.path())
        .arg("write")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(dir.path().join("b.txt")).unwrap(), "B");
    let events = events(&output.stdout);
    assert_eq!(statuses(&events), vec!["success", "success"]);
    let resolved: Vec<&Value> = events.iter().filter(|e| e["type"] == "permission.resolved").collect();
    assert_eq!(resolved.len(), 2);
    assert!(resolved.iter().all(|e| e["decision"] == "allow"));
    let request = events.iter().find(|e| e["type"] == "permission.request").unwrap();
    assert_eq!(request["tool"], "write_file");
    assert_eq!(request["args"]["path"], "a.txt");
    assert!(request["requestId"].as_str().unwrap().starts_with("perm_"));
}

#[test]
fn deny_and_allow_flags_override_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let model = write_script(
        dir.path(),
        r#"[
          {"tool_calls":[
            {"name":"write_file","arguments":{"path":"docs/guide.md","content":"G"}},
            {"name":"write_file","arguments":{"path":"src.txt","content":"S"}},
            {"name":"read_file","arguments":{"path":"notes.txt"}}
          ]},
          {"content":"done"}
        ]"#,
    );
    std::fs::write(
        dir.path().join("loom.toml"),
        "[permissions]\n\"write_file(path=docs/**)\" = \"allow\"\nwrite_file = \"ask\"\n",
    )
    .unwrap();
    // Its allow rule widens permissions: the person trusts the file.
    common::trust(dir.path());
    let run = |extra: &[&str]| {
        let output = loom()
            .current_dir(dir.path())
            .args(["run", "--json", "--model", &model])
            .args(extra)
            .arg("go")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        statuses(&events(&output.stdout))
    };
    // The file's docs/** rule allows; the other write asks and, with no
    // terminal, is denied; reads are allowed by default.
    assert_eq!(run(&[]), vec!["success", "denied", "success"]);
    // --deny over everything the file says; --allow over an ask.
    assert_eq!(
        run(&["--deny", "write_file", "--deny", "read_file"]),
        vec!["denied", "denied", "denied"]
    );
    assert_eq!(run(&["--allow", "write_file"]), vec!["success", "success", "success"]);
    assert_eq!(
        run(&["--ask", "read_file(path=notes.txt)"]),
        vec!["success", "denied", "denied"]
    );
}

#[test]
fn secrets_from_the_environment_are_redacted_from_tool_output() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "prod-db-password-8231";
    std::fs::write(
        dir.path().join(".env.example"),
        format!("DB_TOKEN={secret}\nKEY=sk-{}\n", "x".repeat(40)),
    )
    .unwrap();
    let model = write_script(
        dir.path(),
        r#"[{"tool_calls":[{"name":"read_file","arguments":{"path":".env.example"}}]},{"content":"done"}]"#,
    );
    let output = loom()
        .env("DEPLOY_DB_TOKEN", secret)
        .args(["run", "--json", "--model", &model, "--workspace"])
        .arg(dir.path())
        .arg("read")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains(secret), "the secret leaked: {stdout}");
    assert!(!stdout.contains("sk-xxxx"), "the key leaked");
    assert!(stdout.contains("DB_TOKEN=[REDACTED]"), "{stdout}");
}

/// Runs loom on a pseudo-terminal (util-linux `script`), typing `input`.
fn on_a_terminal(dir: &Path, model: &str, input: &str) -> (Option<i32>, String) {
    let args = format!("run --json --model {model} --workspace {} write", dir.display());
    let mut child = common::loom_on_a_terminal(&args, "-qec")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux script");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[cfg(unix)]
#[test]
fn the_terminal_prompt_answers_yes_no_and_always() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_script(dir.path(), TWO_WRITES);

    let (code, screen) = on_a_terminal(dir.path(), &model, "y\nn\n");
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("loom: allow write_file(content=A, path=a.txt)? [y]es / [n]o / [a]lways"),
        "{screen}"
    );
    assert!(dir.path().join("a.txt").exists(), "y allowed the first write");
    assert!(!dir.path().join("b.txt").exists(), "n denied the second");
    assert_eq!(statuses(&events(screen.as_bytes())), vec!["success", "denied"]);

    std::fs::remove_file(dir.path().join("a.txt")).unwrap();
    let model = write_script(dir.path(), TWO_WRITES);
    let (code, screen) = on_a_terminal(dir.path(), &model, "a\n");
    assert_eq!(code, Some(0), "{screen}");
    assert!(dir.path().join("a.txt").exists() && dir.path().join("b.txt").exists());
    assert_eq!(
        screen.matches("loom: allow write_file").count(),
        1,
        "always: asked once: {screen}"
    );
}

/// On a real terminal, an ask nobody answers: the step clock stops while
/// the person is asked (step_timeout_secs = 1 would end the run otherwise),
/// and the ask is denied at its own timeout (permission_timeout_secs = 3);
/// the model is told, and finishes.
#[cfg(unix)]
#[test]
fn an_unanswered_ask_is_denied_at_its_own_timeout_not_the_steps() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.toml"),
        "step_timeout_secs = 1\npermission_timeout_secs = 3\n",
    )
    .unwrap();
    let model = write_script(
        dir.path(),
        r#"[
          {"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"A"}}]},
          {"content":"I could not write a.txt: permission was not given."}
        ]"#,
    );
    let args = format!(
        "run --json --config {} --model {model} --workspace {} write",
        dir.path().join("loom.toml").display(),
        dir.path().display()
    );
    let mut child = common::loom_on_a_terminal(&args, "-qec")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux script");
    // Nobody types; the terminal stays open until loom is done.
    let keyboard = child.stdin.take().unwrap();
    let started = std::time::Instant::now();
    let output = child.wait_with_output().unwrap();
    drop(keyboard);
    let screen = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{screen}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(3),
        "denied at 3 s, not before"
    );
    assert!(
        screen.contains("loom: allow write_file(content=A, path=a.txt)?"),
        "{screen}"
    );
    assert!(screen.contains("no answer in time: write_file was denied"), "{screen}");
    assert!(!screen.contains("STEP_TIMEOUT"), "{screen}");
    assert!(!dir.path().join("a.txt").exists());
    let events = events(screen.as_bytes());
    assert_eq!(statuses(&events), vec!["denied"]);
    let result = events.iter().find(|e| e["type"] == "tool.result").unwrap();
    assert!(
        result["content"].as_str().unwrap().contains("was not given in time"),
        "the model is told: {result}"
    );
    let resolved = events.iter().find(|e| e["type"] == "permission.resolved").unwrap();
    assert_eq!(resolved["reason"], "timeout");
    let end = events.last().unwrap();
    assert_eq!(end["type"], "lifecycle.end");
    assert_eq!(end["status"], "DONE");
}
