//! Crash and resume through the binary: `loom run` killed with SIGKILL at
//! random points of a multi-step run that writes files, then
//! `loom runs resume`. Every trial prints its seed; rerun one with
//! `LOOM_KILL_SEED=<seed> cargo test -p loom-cli --test resume`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::loom_in;
use loom::{validate_history, Message};
use serde_json::{json, Value};

const STEPS: usize = 5;
const TRIALS: u64 = 30;

/// Each step writes its own file and appends `step-N` to log.txt (the
/// side-effect counter); some turns also read, in parallel.
fn script() -> Value {
    let mut turns = Vec::new();
    for step in 0..STEPS {
        let mut calls = vec![
            json!({"name": "write_file", "arguments": {"path": format!("out/step{step}.txt"), "content": format!("step {step}\n")}}),
            json!({"name": "write_file", "arguments": {"path": "log.txt", "content": format!("step-{step}\n"), "append": true}}),
        ];
        if step % 2 == 1 {
            calls.insert(0, json!({"name": "list_dir", "arguments": {"path": "."}}));
        }
        turns.push(json!({"tool_calls": calls, "delay_ms": 3 * step}));
    }
    turns.push(json!({"content": "all steps done"}));
    Value::Array(turns)
}

fn setup(dir: &Path) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, script().to_string()).unwrap();
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    format!("scripted:{}", path.display())
}

/// `loom run --json` of the script, writes allowed.
fn run_args(model: &str) -> [&str; 9] {
    [
        "run",
        "--json",
        "--model",
        model,
        "--workspace",
        "ws",
        "--allow",
        "write_file",
        "go",
    ]
}

/// Starts `loom run --json`, kills it with SIGKILL after `kill_after`
/// events (plus `extra_us`), and returns the run id if one was printed and
/// whether the run had already ended.
fn run_and_kill(dir: &Path, model: &str, kill_after: usize, extra_us: u64) -> (Option<String>, bool) {
    start_and_kill(dir, &run_args(model), kill_after, extra_us)
}

/// `loom ARGS` (printing JSON events), killed with SIGKILL after
/// `kill_after` events and `extra_us` more microseconds.
fn start_and_kill(dir: &Path, args: &[&str], kill_after: usize, extra_us: u64) -> (Option<String>, bool) {
    let mut child = loom_in(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut run_id = None;
    let mut ended = false;
    for (seen, line) in BufReader::new(stdout).lines().enumerate() {
        let Ok(line) = line else { break };
        let event: Value = serde_json::from_str(&line).unwrap();
        run_id.get_or_insert_with(|| event["runId"].as_str().unwrap().to_string());
        ended |= event["type"] == "lifecycle.end";
        if seen + 1 >= kill_after {
            break;
        }
    }
    std::thread::sleep(Duration::from_micros(extra_us));
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    (run_id, ended)
}

fn show(dir: &Path, run_id: &str) -> Value {
    let out = loom_in(dir)
        .args(["runs", "show", run_id, "--json", "--workspace", "ws"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Everything a finished, resumed run must satisfy.
fn check_complete(dir: &Path, run_id: &str, seed: u64) {
    let shown = show(dir, run_id);
    assert_eq!(shown["run"]["status"], "DONE", "seed {seed}: {shown}");
    assert_eq!(shown["run"]["content"], "all steps done", "seed {seed}");
    let messages: Vec<Message> = serde_json::from_value(shown["messages"].clone()).unwrap();
    validate_history(&messages, false).unwrap_or_else(|err| panic!("seed {seed}: invalid transcript: {err}"));
    let results: BTreeMap<String, String> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_call_id, content, ..
            } => Some((tool_call_id.clone(), content.clone())),
            _ => None,
        })
        .collect();
    let calls: Vec<_> = messages.iter().flat_map(|m| m.tool_calls().to_vec()).collect();
    let expected_calls = STEPS * 2 + STEPS / 2;
    assert_eq!(
        calls.len(),
        expected_calls,
        "seed {seed}: every step's calls are in the transcript"
    );

    // The counter: each step's append ran at most once; a step whose
    // append is missing from the log must have been reported interrupted.
    let log = std::fs::read_to_string(dir.join("ws/log.txt")).unwrap_or_default();
    for step in 0..STEPS {
        let line = format!("step-{step}");
        let count = log.lines().filter(|l| *l == line).count();
        assert!(count <= 1, "seed {seed}: {line} ran {count} times:\n{log}");
        let append = calls
            .iter()
            .find(|c| c.arguments["content"] == format!("{line}\n"))
            .unwrap();
        let result = &results[&append.id];
        if count == 0 {
            assert!(result.contains("interrupted"), "seed {seed}: {line} lost: {result}");
        }
        let file = dir.join(format!("ws/out/step{step}.txt"));
        let write = calls
            .iter()
            .find(|c| c.arguments["path"] == format!("out/step{step}.txt"))
            .unwrap();
        assert!(
            file.exists() || results[&write.id].contains("interrupted"),
            "seed {seed}: step {step}'s file is missing and nobody said so"
        );
    }

    // One event log, seq strictly increasing, closed by one lifecycle.end.
    let out = loom_in(dir)
        .args(["runs", "events", run_id, "--workspace", "ws"])
        .output()
        .unwrap();
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events.windows(2).all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64()),
        "seed {seed}"
    );
    assert_eq!(events.last().unwrap()["type"], "lifecycle.end", "seed {seed}");
    assert_eq!(
        events.iter().filter(|e| e["type"] == "lifecycle.end").count(),
        1,
        "seed {seed}"
    );
}

/// `loom run --json` of the script, to its end.
fn whole_run(dir: &Path, model: &str) -> std::process::Output {
    loom_in(dir).args(run_args(model)).output().unwrap()
}

/// The number of events of an uninterrupted run, to spread kill points over.
fn events_of_a_whole_run() -> usize {
    let dir = tempfile::tempdir().unwrap();
    let model = setup(dir.path());
    let out = whole_run(dir.path(), &model);
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn sigkill_at_random_points_then_resume_loses_nothing_and_repeats_no_side_effect() {
    let total = events_of_a_whole_run();
    let seeds: Vec<u64> = match std::env::var("LOOM_KILL_SEED") {
        Ok(seed) => vec![seed.parse().expect("LOOM_KILL_SEED is a number")],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            (0..TRIALS).map(|i| base.wrapping_mul(31).wrapping_add(i)).collect()
        }
    };
    let mut interrupted_calls = 0;
    let mut restarted = 0;
    for seed in seeds {
        let mut rng = fastrand::Rng::with_seed(seed);
        let kill_after = rng.usize(1..total);
        let extra_us = rng.u64(0..3000);
        println!("trial seed {seed}: SIGKILL after {kill_after}/{total} events + {extra_us} µs");
        let dir = tempfile::tempdir().unwrap();
        let model = setup(dir.path());
        let (run_id, ended) = run_and_kill(dir.path(), &model, kill_after, extra_us);
        let run_id = run_id.unwrap_or_else(|| panic!("seed {seed}: no event before the kill"));

        let resume = [
            "runs",
            "resume",
            &run_id,
            "--workspace",
            "ws",
            "--allow",
            "write_file",
            "--json",
        ];
        // A third of the trials also kill the resumed process once.
        if !ended && rng.usize(0..3) == 0 {
            let kill_again = rng.usize(1..total / 2);
            println!("  and the resume after {kill_again} events");
            start_and_kill(dir.path(), &resume, kill_again, rng.u64(0..3000));
        }
        let out = loom_in(dir.path()).args(resume).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                let resumed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                assert_eq!(resumed[0]["type"], "lifecycle.start", "seed {seed}");
                assert_eq!(resumed[0]["resumed"], true, "seed {seed}");
                interrupted_calls += resumed
                    .iter()
                    .filter(|e| e["type"] == "tool.result" && e["content"].as_str().unwrap().contains("interrupted"))
                    .count();
            }
            // The kill landed before the run was recorded, or after it ended.
            Some(2) if stderr.contains("no run with id") => {
                restarted += 1;
                assert!(
                    !dir.path().join("ws/log.txt").exists(),
                    "seed {seed}: effects of an unrecorded run"
                );
                continue;
            }
            Some(2) if ended || stderr.contains("DONE") => {}
            code => panic!("seed {seed}: resume exited {code:?}: {stderr}"),
        }
        check_complete(dir.path(), &run_id, seed);
    }
    println!("{interrupted_calls} calls were reported interrupted; {restarted} kills came before the run was recorded");
}

#[test]
fn resume_refuses_finished_unknown_and_live_runs_and_cancel_closes_an_interrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = setup(dir.path());
    let out = whole_run(dir.path(), &model);
    let first: Value = serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    let done_id = first["runId"].as_str().unwrap().to_string();

    let resume = |id: &str| {
        loom_in(dir.path())
            .args(["runs", "resume", id, "--workspace", "ws"])
            .output()
            .unwrap()
    };
    let out = resume(&done_id);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is DONE"), "{out:?}");
    let out = resume("nope");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run with id 'nope'"));

    // Kill a run mid-way; `runs list` shows it INTERRUPTED; cancel closes it.
    std::fs::remove_dir_all(dir.path().join("ws")).unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let (run_id, _) = run_and_kill(dir.path(), &model, 12, 0);
    let run_id = run_id.unwrap();
    let out = loom_in(dir.path())
        .args(["runs", "list", "--workspace", "ws"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with(&run_id)).unwrap();
    assert!(row.contains("INTERRUPTED"), "{table}");
    let out = loom_in(dir.path())
        .args(["runs", "show", &run_id, "--workspace", "ws"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("loom runs resume {run_id}")),
        "{out:?}"
    );
    let out = loom_in(dir.path())
        .args(["runs", "cancel", &run_id, "--workspace", "ws", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["status"], "CANCELED");
    let out = loom_in(dir.path())
        .args(["runs", "events", &run_id, "--workspace", "ws"])
        .output()
        .unwrap();
    let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "lifecycle.end");
    assert_eq!(last["status"], "CANCELED");
    let out = loom_in(dir.path())
        .args(["runs", "cancel", &run_id, "--workspace", "ws"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a second cancel: already ended");
}

#[test]
fn cancel_stops_a_live_run_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("slow.json");
    std::fs::write(&script, r#"[{"content": "too late", "delay_ms": 60000}]"#).unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let mut child = loom_in(dir.path())
        .args([
            "run",
            "--json",
            "--model",
            &format!("scripted:{}", script.display()),
            "--workspace",
            "ws",
            "wait",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut run_id = String::new();
    // Wait until the model call is under way (and the run is recorded).
    for line in lines.by_ref() {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        run_id = event["runId"].as_str().unwrap().to_string();
        if event["type"] == "llm.start" {
            break;
        }
    }
    let out = loom_in(dir.path())
        .args(["runs", "cancel", &run_id, "--workspace", "ws"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CANCELED"));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "the owner ended the run as cancelled");
    let rest: Vec<Value> = lines.map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    assert_eq!(rest.last().unwrap()["status"], "CANCELED");
}

#[test]
fn resume_from_elsewhere_works_in_the_recorded_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let model = setup(dir.path());
    let (run_id, _) = run_and_kill(dir.path(), &model, 12, 0);
    let run_id = run_id.unwrap();
    let db = common::database_of(&dir.path().join("ws"));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = loom_in(elsewhere.path())
        .args([
            "runs",
            "resume",
            &run_id,
            "--db",
            db.to_str().unwrap(),
            "--allow",
            "write_file",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("all steps done"));
    assert!(dir.path().join(format!("ws/out/step{}.txt", STEPS - 1)).exists());
    let left: Vec<_> = std::fs::read_dir(elsewhere.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "nothing written where resume was started: {left:?}");
}

#[test]
fn sigkill_while_a_sub_agent_runs_then_resume_continues_the_child_and_finishes_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    // Sub-agents offered, to the run and to its resumption (docs/subagents.md).
    std::fs::write(dir.path().join("loom.toml"), "[tools]\ntask = true\n").unwrap();
    let first = dir.path().join("first.json");
    std::fs::write(
        &first,
        json!([
            {"tool_calls": [{"name": "task", "arguments": {
                "description": "look", "prompt": "List the workspace.", "tools": ["list_dir"]}}]},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}]},
            // The child's second call: the process is killed while it waits.
            {"content": "never", "delay_ms": 60000}
        ])
        .to_string(),
    )
    .unwrap();
    let mut child = loom_in(dir.path())
        .args(["run", "--json", "--workspace", "ws", "--model"])
        .arg(format!("scripted:{}", first.display()))
        .arg("go")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut parent_id = None;
    let mut sub_agent = None;
    let mut seen_llm_starts = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        parent_id.get_or_insert_with(|| event["runId"].as_str().unwrap().to_string());
        if event["depth"] == 1 && event["type"] == "llm.start" {
            sub_agent = Some(event["runId"].as_str().unwrap().to_string());
            seen_llm_starts += 1;
            // Its second call began: its first turn is checkpointed.
            if seen_llm_starts == 2 {
                break;
            }
        }
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    let (parent_id, sub_agent) = (parent_id.unwrap(), sub_agent.unwrap());
    // A sub-agent resumes with its parent (which knows its tools and
    // budgets), not on its own.
    let alone = loom_in(dir.path())
        .args(["runs", "resume", &sub_agent, "--workspace", "ws", "--model"])
        .arg(format!("scripted:{}", first.display()))
        .output()
        .unwrap();
    assert_eq!(alone.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&alone.stderr).contains(&format!("is a sub-agent of run {parent_id}")));

    // The scripted model of the resumed process skips as many turns as the
    // first request it sees has answers in its history (the child's one
    // turn): the placeholder stands for it.
    let rest = dir.path().join("rest.json");
    std::fs::write(
        &rest,
        json!([
            {"content": "placeholder for the child's first turn"},
            {"content": "The child finished after the resume."},
            {"content": "The parent is done."}
        ])
        .to_string(),
    )
    .unwrap();
    let resumed = loom_in(dir.path())
        .args(["runs", "resume", &parent_id, "--json", "--workspace", "ws", "--model"])
        .arg(format!("scripted:{}", rest.display()))
        .output()
        .unwrap();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let events = common::json_lines(&resumed.stdout);
    let child_start = events
        .iter()
        .find(|e| e["type"] == "lifecycle.start" && e["depth"] == 1)
        .unwrap();
    assert_eq!(
        child_start["resumed"], true,
        "the child continues, it does not start over"
    );
    assert_eq!(child_start["runId"], sub_agent.as_str());
    let end = events.last().unwrap();
    assert_eq!(end["runId"], parent_id.as_str());
    assert_eq!(end["status"], "DONE");
    assert_eq!(end["content"], "The parent is done.");

    // The child's whole log: its one list_dir ran once, its seq has no gap,
    // and it answered.
    let log = loom_in(dir.path())
        .args(["runs", "events", &sub_agent, "--workspace", "ws"])
        .output()
        .unwrap();
    let log = common::json_lines(&log.stdout);
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(log.iter().filter(|e| e["type"] == "tool.result").count(), 1);
    let child_end = log.last().unwrap();
    assert_eq!(child_end["status"], "DONE");
    assert_eq!(child_end["content"], "The child finished after the resume.");
    // The parent's task call got the child's answer.
    let result = events
        .iter()
        .find(|e| e["type"] == "tool.result" && e["depth"] == 0)
        .unwrap();
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("completed\nanswer:\nThe child finished after the resume."),
        "{result}"
    );
}
