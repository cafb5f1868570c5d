//! `loom chat` driven through a real pseudo-terminal (util-linux `script`):
//! answers, a permission prompt, Ctrl-C during a prompt and during a slow
//! answer (the session goes on), a restart that continues the session,
//! `/new` and `/exit`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
#![cfg(unix)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const SCRIPT: &str = r#"[
  {"content": "Hello Ada, nice to meet you."},
  {"tool_calls": [{"name": "write_file", "arguments": {"path": "note.txt", "content": "Ada"}}]},
  {"content": "Saved note.txt."},
  {"tool_calls": [{"name": "write_file", "arguments": {"path": "secret.txt", "content": "no"}}]},
  {"content": "You are Ada, and note.txt holds your name."},
  {"content": "this answer is too slow", "delay_ms": 60000},
  {"content": "Still here, same conversation."},
  {"content": "Fresh start: I know nothing yet."}
]"#;

/// A `loom chat` on a pseudo-terminal, with its screen captured.
struct Terminal {
    child: Child,
    input: ChildStdin,
    screen: Arc<Mutex<String>>,
    /// Where the next `expect` starts looking.
    seen: usize,
}

impl Terminal {
    fn start(dir: &Path, extra: &str) -> Self {
        Self::start_with(dir, "script.json", extra)
    }

    fn start_with(dir: &Path, script: &str, extra: &str) -> Self {
        let args = format!(
            "chat --model scripted:{} --workspace {} {extra}",
            dir.join(script).display(),
            dir.join("ws").display()
        );
        let mut child = common::loom_on_a_terminal(&args, "-qfec")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux script");
        let input = child.stdin.take().unwrap();
        let mut output = child.stdout.take().unwrap();
        let screen = Arc::new(Mutex::new(String::new()));
        let sink = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = output.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Self {
            child,
            input,
            screen,
            seen: 0,
        }
    }

    fn type_text(&mut self, text: &str) {
        self.input.write_all(text.as_bytes()).unwrap();
        self.input.flush().unwrap();
    }

    /// Waits until `text` appears after what was already matched.
    fn expect(&mut self, text: &str) {
        if !self.appears_within(text, Duration::from_secs(30)) {
            panic!("never saw {text:?}; the screen:\n{}", self.screen());
        }
    }

    /// Whether `text` appears, after what was already matched, within `wait`.
    fn appears_within(&mut self, text: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            {
                let screen = self.screen.lock().unwrap();
                if let Some(at) = screen[self.seen..].find(text) {
                    self.seen += at + text.len();
                    return true;
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The session id from the banner.
    fn session(&self) -> String {
        let screen = self.screen();
        let start = screen.find("session ").unwrap() + "session ".len();
        screen[start..].split('.').next().unwrap().to_string()
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }

    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        (status.code(), self.screen())
    }
}

fn runs(dir: &Path) -> Vec<Value> {
    let out = common::loom_in(dir)
        .args(["runs", "list", "--json", "--workspace", "ws"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_chat_session_answers_asks_cancels_and_continues_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.json"), SCRIPT).unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();

    // First process: an answer, an allowed write, a cancelled permission prompt.
    let mut chat = Terminal::start(dir.path(), "");
    chat.expect("loom chat — session ");
    let session = chat.session();
    chat.type_text("My name is Ada.\n");
    chat.expect("Hello Ada, nice to meet you.");
    chat.type_text("Write my name into note.txt\n");
    chat.expect("allow write_file(content=Ada, path=note.txt)? [y]es / [n]o / [a]lways");
    chat.type_text("y\n");
    chat.expect("✓ write_file");
    chat.expect("Saved note.txt.");
    chat.type_text("Write secret.txt\n");
    chat.expect("allow write_file(content=no, path=secret.txt)?");
    chat.type_text("\x03");
    chat.expect("cancelled");
    chat.type_text("/exit\n");
    chat.expect(&format!("continue it with `loom chat --session {session}`"));
    let (code, screen) = chat.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(std::fs::read_to_string(dir.path().join("ws/note.txt")).unwrap(), "Ada");
    assert!(
        !dir.path().join("ws/secret.txt").exists(),
        "Ctrl-C at the prompt ran nothing"
    );

    // Second process: the session continues; Ctrl-C stops a slow answer and
    // the conversation goes on; /new starts another one.
    let mut chat = Terminal::start(dir.path(), &format!("--session {session}"));
    chat.expect("continuing the conversation");
    chat.type_text("Who am I?\n");
    chat.expect("You are Ada, and note.txt holds your name.");
    chat.type_text("Think about it slowly.\n");
    // Nothing shows while the model thinks: press Ctrl-C until it lands on
    // the answer (one pressed before the task started only prints a hint).
    let mut cancelled = false;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        chat.type_text("\x03");
        if chat.appears_within("cancelling this answer (the session goes on)", Duration::from_secs(3)) {
            cancelled = true;
            break;
        }
    }
    assert!(cancelled, "Ctrl-C never cancelled the answer:\n{}", chat.screen());
    chat.expect("loom: cancelled: interrupted by the user (Ctrl-C)");
    chat.type_text("Are you still there?\n");
    chat.expect("Still here, same conversation.");
    chat.type_text("/new\n");
    chat.expect("new conversation, session ");
    chat.type_text("Hello again\n");
    chat.expect("Fresh start: I know nothing yet.");
    chat.type_text("/exit\n");
    let (code, screen) = chat.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert!(!screen.contains("this answer is too slow"), "{screen}");

    // Everything was recorded: seven runs, five in the first session.
    let runs = runs(dir.path());
    let statuses: Vec<(&str, &str)> = runs
        .iter()
        .rev()
        .map(|r| (r["prompt"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("My name is Ada.", "DONE"),
            ("Write my name into note.txt", "DONE"),
            ("Write secret.txt", "CANCELED"),
            ("Who am I?", "DONE"),
            ("Think about it slowly.", "CANCELED"),
            ("Are you still there?", "DONE"),
            ("Hello again", "DONE"),
        ]
    );
    let in_session = runs.iter().filter(|r| r["sessionId"] == session.as_str()).count();
    assert_eq!(in_session, 6, "all but the /new run belong to the first session");
    let out = common::loom_in(dir.path())
        .args(["runs", "list", "--session", &session, "--workspace", "ws"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        table.lines().count(),
        7,
        "a header and the session's six runs:\n{table}"
    );
    assert!(!table.contains("Hello again"), "{table}");
}

#[test]
fn a_chat_killed_mid_task_resumes_its_task_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("write.json"),
        r#"[
          {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}}]},
          {"content": "Wrote a.txt after the restart."}
        ]"#,
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();

    let mut chat = Terminal::start_with(dir.path(), "write.json", "");
    chat.expect("loom chat — session ");
    let session = chat.session();
    chat.type_text("Write a.txt\n");
    chat.expect("allow write_file(content=A, path=a.txt)?");
    // The process dies while it waits for the answer.
    let runs = runs(dir.path());
    let owner = runs[0]["owner"].as_str().unwrap();
    let pid = owner.split("/pid:").nth(1).unwrap().split('/').next().unwrap();
    assert!(Command::new("kill").args(["-KILL", pid]).status().unwrap().success());
    chat.finish();
    assert!(!dir.path().join("ws/a.txt").exists());

    // --continue picks the newest session, the one that died.
    let mut chat = Terminal::start_with(dir.path(), "write.json", "--continue");
    chat.expect(&format!("session {session}."));
    chat.expect("was interrupted when its process died; /resume continues it");
    chat.type_text("/resume\n");
    chat.expect("resuming run");
    chat.expect("allow write_file(content=A, path=a.txt)?");
    chat.type_text("y\n");
    chat.expect("Wrote a.txt after the restart.");
    chat.type_text("/exit\n");
    let (code, screen) = chat.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(std::fs::read_to_string(dir.path().join("ws/a.txt")).unwrap(), "A");
    let runs = self::runs(dir.path());
    assert_eq!(runs.len(), 1, "the task was resumed, not started again");
    assert_eq!(runs[0]["status"], "DONE");
}

/// `loom chat --mode plan`: the answer is a plan, approved on the terminal,
/// carried out by the next task in the default mode (which asks before
/// writing); a plan not approved leaves the chat in plan mode.
#[test]
fn a_plan_approved_on_the_terminal_is_carried_out_and_the_chat_goes_on_in_the_default_mode() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plan.json"),
        r#"[
          {"content": "PLAN-ONE: write plan.txt."},
          {"content": "PLAN-TWO: write it after all."},
          {"tool_calls": [{"name": "write_file", "arguments": {"path": "plan.txt", "content": "P"}}]},
          {"content": "Carried out."}
        ]"#,
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let mut chat = Terminal::start_with(dir.path(), "plan.json", "--mode plan");
    chat.expect("loom chat — session ");
    chat.type_text("Plan it\n");
    chat.expect("PLAN-ONE: write plan.txt.");
    chat.expect("carry out this plan? [y/N]: ");
    chat.type_text("n\n");
    chat.expect("the plan was not carried out");
    chat.type_text("Plan again\n");
    chat.expect("PLAN-TWO: write it after all.");
    chat.expect("carry out this plan? [y/N]: ");
    chat.type_text("y\n");
    chat.expect("carrying out the plan; the chat goes on in the default mode");
    chat.expect("allow write_file(content=P, path=plan.txt)?");
    chat.type_text("y\n");
    chat.expect("Carried out.");
    chat.type_text("/exit\n");
    let (code, screen) = chat.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(std::fs::read_to_string(dir.path().join("ws/plan.txt")).unwrap(), "P");
    let runs = self::runs(dir.path());
    assert_eq!(runs.len(), 3, "two plans and the run that carried one out");
}
