//! The tool pipeline through the library API: permissions (deny, argument
//! rules, ask round trips), hooks, the parallel scheduler, per-call
//! timeouts, and the format stage (redaction, truncation).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom::tools::WriteFile;
use loom::{
    async_trait, validate_history, Agent, Decision, Event, EventKind, HookCall, HookDecision, PermissionDecision,
    PermissionPolicy, Redactor, RunHandle, RunStatus, Tool, ToolCall, ToolContext, ToolError, ToolHook, ToolOutput,
    ToolResult,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use support::*;

fn policy(rules: &[(&str, Decision)], default: Decision) -> PermissionPolicy {
    let mut policy = PermissionPolicy::new(default);
    for (pattern, decision) in rules {
        policy.add_rule(pattern, *decision).unwrap();
    }
    policy
}

/// Reads events until `permission.request`, returning its request id.
async fn next_request(handle: &mut RunHandle, seen: &mut Vec<Event>) -> String {
    while let Some(event) = handle.next_event().await {
        let id = match &event.kind {
            EventKind::PermissionRequest { request_id, .. } => Some(request_id.clone()),
            _ => None,
        };
        seen.push(event);
        if let Some(id) = id {
            return id;
        }
    }
    panic!("the run ended without asking");
}

fn resolutions(events: &[Event]) -> Vec<(String, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::PermissionResolved { decision, reason, .. } => {
                Some((decision.to_string(), reason.map(|r| r.to_string())))
            }
            _ => None,
        })
        .collect()
}

// ---- permissions ----

#[tokio::test]
async fn deny_is_enforced_and_the_file_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        call("write_file", json!({"path": "out.txt", "content": "x"})),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(WriteFile)
        .workspace(dir.path())
        .permissions(policy(&[("write_file", Decision::Deny)], Decision::Allow))
        .build()
        .unwrap();
    let (events, outcome) = agent.run("write").collect().await;
    assert_contract(&events);
    assert!(!dir.path().join("out.txt").exists(), "a denied call never runs");
    let results = tool_results(&events);
    assert_eq!(results[0].1, "denied");
    assert!(results[0].2.contains("rule 'write_file' forbids"), "{}", results[0].2);
    assert_eq!(outcome.status, RunStatus::Done);
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn argument_rules_allow_docs_and_ask_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        call("write_file", json!({"path": "docs/guide.md", "content": "guide"})),
        call("write_file", json!({"path": "src/main.rs", "content": "fn main() {}"})),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(WriteFile)
        .workspace(dir.path())
        .permissions(policy(
            &[
                ("write_file", Decision::Ask),
                ("write_file(path=docs/**)", Decision::Allow),
            ],
            Decision::Deny,
        ))
        .build()
        .unwrap();
    let mut handle = agent.run("write");
    let mut seen = Vec::new();
    let request = next_request(&mut handle, &mut seen).await;
    assert!(
        dir.path().join("docs/guide.md").exists(),
        "docs/** was allowed without asking"
    );
    let asked = seen.iter().rev().find_map(|e| match &e.kind {
        EventKind::PermissionRequest { tool, args, rule, .. } => Some((tool.clone(), args.clone(), rule.clone())),
        _ => None,
    });
    let (tool, args, rule) = asked.unwrap();
    assert_eq!(tool, "write_file");
    assert_eq!(args["path"], "src/main.rs");
    assert_eq!(rule.as_deref(), Some("write_file"));
    handle.respond_permission(&request, PermissionDecision::Deny).unwrap();
    let (rest, outcome) = handle.collect().await;
    seen.extend(rest);
    assert_contract(&seen);
    assert!(!dir.path().join("src/main.rs").exists());
    let statuses: Vec<String> = tool_results(&seen).into_iter().map(|r| r.1).collect();
    assert_eq!(statuses, vec!["success", "denied"]);
    assert_eq!(resolutions(&seen), vec![("deny".to_string(), None)]);
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn ask_allow_runs_the_call_and_status_shows_the_wait() {
    let model = scripted(vec![call("echo", json!({"text": "hi"})), answer("ok")]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .permissions(PermissionPolicy::new(Decision::Ask))
        .build()
        .unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    let request = next_request(&mut handle, &mut seen).await;
    assert_eq!(handle.status(), RunStatus::WaitingPermission);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
    assert!(handle
        .respond_permission("perm_bogus", PermissionDecision::Allow)
        .is_err());
    handle.respond_permission(&request, PermissionDecision::Allow).unwrap();
    let (rest, outcome) = handle.collect().await;
    seen.extend(rest);
    assert_contract(&seen);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
    assert_eq!(tool_results(&seen)[0].1, "success");
    assert_eq!(resolutions(&seen), vec![("allow".to_string(), None)]);
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn ask_always_is_not_asked_again_in_the_session() {
    // One script for three runs of the same agent: the model is shared.
    let model = scripted(vec![
        call("echo", json!({"text": "one"})),
        call("echo", json!({"text": "two"})),
        answer("first run"),
        call("echo", json!({"text": "three"})),
        answer("second run"),
        call("echo", json!({"text": "four"})),
        answer("third run"),
    ]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .permissions(PermissionPolicy::new(Decision::Ask))
        // No timeout: an ask waits for its answer however slow the test's
        // thread (a 200 ms one could run out before the answer came).
        .permission_timeout(None)
        .build()
        .unwrap();
    let in_session = |session: &str| loom::RunRequest {
        prompt: "go".into(),
        session_id: Some(session.into()),
        ..Default::default()
    };
    let asks = |events: &[Event]| events.iter().filter(|e| e.kind.name() == "permission.request").count();

    let mut handle = agent.run(in_session("s1"));
    let mut seen = Vec::new();
    let request = next_request(&mut handle, &mut seen).await;
    handle.respond_permission(&request, PermissionDecision::Always).unwrap();
    let (rest, _) = handle.collect().await;
    seen.extend(rest);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
    assert_eq!(asks(&seen), 1, "the second call is not asked");
    assert_eq!(resolutions(&seen), vec![("always".to_string(), None)]);

    // A later run of the same session keeps the grant...
    let (events, _) = agent.run(in_session("s1")).collect().await;
    assert_eq!(asks(&events), 0);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 3);

    // ...another session does not: it is asked again (and denied).
    let mut handle = agent.run(in_session("s2"));
    let mut events = Vec::new();
    let request = next_request(&mut handle, &mut events).await;
    handle.respond_permission(&request, PermissionDecision::Deny).unwrap();
    let (rest, _) = handle.collect().await;
    events.extend(rest);
    assert_eq!(asks(&events), 1);
    assert_eq!(tool_results(&events)[0].1, "denied");
    assert_eq!(echo.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn ask_deny_and_timeout_become_denied_results() {
    let model = scripted(vec![
        call("echo", json!({"text": "first"})),
        call("echo", json!({"text": "second"})),
        answer("ok"),
    ]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .permissions(PermissionPolicy::new(Decision::Ask))
        // Long enough that the first ask is answered before it runs out
        // however slow the test's thread; the second waits it out.
        .permission_timeout(Some(Duration::from_secs(2)))
        .build()
        .unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    let request = next_request(&mut handle, &mut seen).await;
    handle.respond_permission(&request, PermissionDecision::Deny).unwrap();
    // The second request is left unanswered: it times out into a deny.
    let (rest, outcome) = handle.collect().await;
    seen.extend(rest);
    assert_contract(&seen);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
    let results = tool_results(&seen);
    assert_eq!(results[0].1, "denied");
    assert!(results[0].2.contains("The user denied"), "{}", results[0].2);
    assert_eq!(results[1].1, "denied");
    assert!(results[1].2.contains("not given in time"), "{}", results[1].2);
    assert_eq!(
        resolutions(&seen),
        vec![
            ("deny".to_string(), None),
            ("deny".to_string(), Some("timeout".to_string()))
        ]
    );
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn cancel_while_waiting_for_permission_ends_the_wait_at_once() {
    let model = scripted(vec![call("echo", json!({"text": "x"})), answer("unreachable")]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(Echo::default())
        .permissions(PermissionPolicy::new(Decision::Ask))
        .permission_timeout(None)
        .build()
        .unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    next_request(&mut handle, &mut seen).await;
    let started = Instant::now();
    handle.cancel("no time to answer");
    let (rest, outcome) = handle.collect().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    seen.extend(rest);
    assert_contract(&seen);
    assert_eq!(outcome.status, RunStatus::Canceled);
    assert_eq!(tool_results(&seen)[0].1, "cancelled");
    validate_history(&outcome.messages, false).unwrap();
}

// ---- hooks ----

struct Guard;

#[async_trait]
impl ToolHook for Guard {
    async fn before_tool(&self, call: HookCall<'_>) -> HookDecision {
        match call.args["text"].as_str() {
            Some("forbidden") => HookDecision::Deny("the guard refused".into()),
            Some("shout") => HookDecision::Rewrite(json!({"text": "SHOUT"})),
            Some("broken") => HookDecision::Rewrite(json!({"text": 1})),
            Some("trusted") => HookDecision::Allow,
            _ => HookDecision::Continue,
        }
    }

    async fn after_tool(&self, _call: &ToolCall, mut result: ToolResult) -> ToolResult {
        result.content = format!("[checked] {}", result.content);
        result
    }
}

#[tokio::test]
async fn hooks_deny_rewrite_allow_and_rewrite_results() {
    let model = scripted(vec![
        calls(&[
            ("echo", json!({"text": "forbidden"})),
            ("echo", json!({"text": "shout"})),
            ("echo", json!({"text": "broken"})),
            ("echo", json!({"text": "trusted"})),
            ("echo", json!({"text": "plain"})),
        ]),
        answer("ok"),
    ]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .hook(Guard)
        // The policy's default denies echo, but a hook's Allow comes first.
        .permissions(policy(&[], Decision::Deny))
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    assert_contract(&events);
    let results = tool_results(&events);
    let decided: Vec<Value> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { decided_by, .. } => Some(serde_json::to_value(decided_by).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(
        decided,
        [
            json!("hook"),
            json!("default"),
            Value::Null,
            json!("hook"),
            json!("default")
        ]
    );
    assert_eq!(results[0].1, "denied");
    assert!(results[0].2.contains("the guard refused"));
    assert_eq!(
        results[1],
        ("echo".into(), "denied".into(), results[1].2.clone()),
        "rewritten, then the policy denies"
    );
    assert_eq!(results[2].1, "error", "a rewrite is validated again");
    assert_eq!(results[3].1, "success");
    assert_eq!(results[3].2, "[checked] trusted");
    assert_eq!(results[4].1, "denied", "the policy decides after the hooks");
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
}

/// A hook's Allow skips asking, never an explicit deny rule.
#[tokio::test]
async fn a_hooks_allow_does_not_beat_an_explicit_deny_rule() {
    let model = scripted(vec![calls(&[("echo", json!({"text": "trusted"}))]), answer("ok")]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .hook(Guard)
        .permissions(policy(&[("echo", Decision::Deny)], Decision::Allow))
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    let results = tool_results(&events);
    assert_eq!(results[0].1, "denied");
    assert!(results[0].2.contains("the rule 'echo' forbids"), "{}", results[0].2);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_rewrite_changes_what_the_tool_receives() {
    let model = scripted(vec![call("echo", json!({"text": "shout"})), answer("ok")]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(Echo::default())
        .hook(Guard)
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    assert_eq!(tool_results(&events)[0].2, "[checked] SHOUT");
}

// ---- scheduler ----

#[derive(Debug, Deserialize, JsonSchema)]
struct WaitArgs {
    /// Milliseconds to sleep.
    ms: u64,
    /// Label returned as output.
    label: String,
}

/// Sleeps, counting how many calls run at once.
#[derive(Clone, Default)]
struct Gauge {
    safe: bool,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    barrier: Option<Arc<tokio::sync::Barrier>>,
}

impl Tool for Gauge {
    type Args = WaitArgs;
    fn name(&self) -> &str {
        if self.safe {
            "read_gauge"
        } else {
            "write_gauge"
        }
    }
    fn description(&self) -> &str {
        "Sleeps and reports."
    }
    fn concurrency_safe(&self) -> bool {
        self.safe
    }
    async fn call(&self, args: WaitArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if let Some(barrier) = &self.barrier {
            barrier.wait().await;
        }
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(args.label.into())
    }
}

#[tokio::test]
async fn ten_safe_calls_run_in_parallel() {
    let barrier = Arc::new(tokio::sync::Barrier::new(10));
    let gauge = Gauge {
        safe: true,
        barrier: Some(barrier),
        ..Gauge::default()
    };
    let list: Vec<(&str, serde_json::Value)> = (0..10)
        .map(|i| ("read_gauge", json!({"ms": 0, "label": format!("r{i}")})))
        .collect();
    let model = scripted(vec![calls(&list), answer("ok")]);
    // Run one by one, the first call would wait at the barrier forever: the
    // tool timeout turns that into a failure instead of a hang.
    let agent = Agent::builder()
        .model_arc(model)
        .tool(gauge.clone())
        .tool_timeout(Some(Duration::from_secs(10)))
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 10);
    assert!(results.iter().all(|r| r.1 == "success"), "{results:?}");
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 10);
    let labels: Vec<String> = outcome
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .map(|m| m.content().to_string())
        .collect();
    assert_eq!(labels, (0..10).map(|i| format!("r{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_cap_of_two_keeps_call_order_when_the_first_call_is_slowest() {
    let gauge = Gauge {
        safe: true,
        ..Gauge::default()
    };
    let model = scripted(vec![
        calls(&[
            ("read_gauge", json!({"ms": 400, "label": "slow"})),
            ("read_gauge", json!({"ms": 20, "label": "b"})),
            ("read_gauge", json!({"ms": 20, "label": "c"})),
            ("read_gauge", json!({"ms": 20, "label": "d"})),
            ("read_gauge", json!({"ms": 20, "label": "e"})),
        ]),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(gauge.clone())
        .max_concurrency(2)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    assert_contract(&events);
    assert_eq!(
        gauge.peak.load(Ordering::SeqCst),
        2,
        "at most two at once, and two did overlap"
    );
    let finished: Vec<String> = tool_results(&events).into_iter().map(|r| r.2).collect();
    assert_eq!(
        finished.last().map(String::as_str),
        Some("slow"),
        "the slow call finished last: {finished:?}"
    );
    let in_history: Vec<String> = outcome
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .map(|m| m.content().to_string())
        .collect();
    assert_eq!(
        in_history,
        vec!["slow", "b", "c", "d", "e"],
        "the history keeps call order"
    );
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn serial_tools_never_overlap_anything() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak_seen_by_serial = Arc::new(AtomicUsize::new(0));
    let safe = Gauge {
        safe: true,
        running: running.clone(),
        ..Gauge::default()
    };
    let serial = Gauge {
        safe: false,
        running: running.clone(),
        peak: peak_seen_by_serial.clone(),
        ..Gauge::default()
    };
    let model = scripted(vec![
        calls(&[
            ("read_gauge", json!({"ms": 50, "label": "r1"})),
            ("read_gauge", json!({"ms": 50, "label": "r2"})),
            ("write_gauge", json!({"ms": 50, "label": "w1"})),
            ("write_gauge", json!({"ms": 50, "label": "w2"})),
            ("read_gauge", json!({"ms": 50, "label": "r3"})),
        ]),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(safe.clone())
        .tool(serial)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    assert_contract(&events);
    assert_eq!(peak_seen_by_serial.load(Ordering::SeqCst), 1, "a serial call ran alone");
    assert_eq!(
        safe.peak.load(Ordering::SeqCst),
        2,
        "the two reads before the writes overlapped"
    );
    let finished: Vec<String> = tool_results(&events).into_iter().map(|r| r.2).collect();
    assert_eq!(
        finished[2..],
        ["w1", "w2", "r3"],
        "calls after a serial call wait for it"
    );
    let in_history: Vec<String> = outcome
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .map(|m| m.content().to_string())
        .collect();
    assert_eq!(in_history, vec!["r1", "r2", "w1", "w2", "r3"]);
}

#[tokio::test]
async fn a_call_after_a_serial_one_reports_its_own_duration_not_its_wait() {
    let running = Arc::new(AtomicUsize::new(0));
    let safe = Gauge {
        safe: true,
        running: running.clone(),
        ..Gauge::default()
    };
    let serial = Gauge {
        safe: false,
        running,
        ..Gauge::default()
    };
    let model = scripted(vec![
        calls(&[
            ("write_gauge", json!({"ms": 1000, "label": "slow"})),
            ("read_gauge", json!({"ms": 0, "label": "quick"})),
        ]),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(safe)
        .tool(serial)
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    let durations: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { duration_ms, .. } => Some(*duration_ms),
            _ => None,
        })
        .collect();
    assert!(durations[0] >= 1000, "{durations:?}");
    // The quick call waited a second for the slow one; that wait is not its
    // duration (a margin of 0.9 s for a call that takes microseconds).
    assert!(durations[1] < 900, "{durations:?}");
}

#[tokio::test]
async fn a_call_past_its_timeout_gets_a_timeout_result_and_the_run_goes_on() {
    let slow = Slow::default();
    let model = scripted(vec![
        calls(&[("slow", json!({})), ("echo", json!({"text": "fast"}))]),
        answer("went on"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(slow.clone())
        .tool(Echo::default())
        .tool_timeout(Some(Duration::from_secs(30)))
        .tool_timeout_for("slow", Duration::from_millis(150))
        .build()
        .unwrap();
    let started = Instant::now();
    let (events, outcome) = agent.run("go").collect().await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_contract(&events);
    let results = tool_results(&events);
    assert_eq!(results[0].1, "timeout");
    assert!(results[0].2.contains("did not finish within 0.1 s"), "{}", results[0].2);
    assert_eq!(results[1].1, "success");
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("went on"));
}

// ---- format ----

#[derive(Debug, Deserialize, JsonSchema)]
struct SayArgs {
    /// Text to print.
    text: String,
    /// Times to repeat it.
    times: usize,
}

struct Say;

impl Tool for Say {
    type Args = SayArgs;
    fn name(&self) -> &str {
        "say"
    }
    fn description(&self) -> &str {
        "Repeats text."
    }
    async fn call(&self, args: SayArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(args.text.repeat(args.times).into())
    }
}

#[tokio::test]
async fn output_is_redacted_and_truncated_visibly() {
    let openai_key = format!("sk-{}", "A".repeat(48));
    let github = format!("ghp_{}", "b".repeat(36));
    let leak = format!("key={openai_key} gh={github} Authorization: Bearer eyJhbGciOi.abc pw=correct-horse-battery ");
    let model = scripted(vec![
        calls(&[
            ("say", json!({"text": leak, "times": 1})),
            ("say", json!({"text": "0123456789", "times": 100})),
        ]),
        answer("ok"),
    ]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(Say)
        .redactor(Redactor::with_secrets(vec!["correct-horse-battery".to_string()]))
        .max_output_chars(300)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    let results = tool_results(&events);
    let redacted = &results[0].2;
    for secret in [
        openai_key.as_str(),
        github.as_str(),
        "eyJhbGciOi",
        "correct-horse-battery",
    ] {
        assert!(!redacted.contains(secret), "{secret} leaked: {redacted}");
    }
    assert_eq!(redacted.matches("[REDACTED]").count(), 4, "{redacted}");
    let cut = &results[1].2;
    assert!(cut.contains("output truncated: 700 of 1000 characters cut"), "{cut}");
    assert!(cut.len() < 400);
    // The model reads exactly what the events show.
    let tool_messages: Vec<&str> = outcome
        .messages
        .iter()
        .filter(|m| m.role() == "tool")
        .map(|m| m.content())
        .collect();
    assert_eq!(tool_messages, vec![redacted.as_str(), cut.as_str()]);
    let stages = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { stages, .. } => Some(*stages),
        _ => None,
    });
    assert!(stages.is_some());
}

#[tokio::test]
async fn a_persons_time_does_not_count_against_the_run_or_step_limit() {
    // Limits of 600 ms a step and 1.2 s a run; the person answers after
    // 1.5 s. (The run's own work takes milliseconds: the limits leave it
    // half a second at least, so a slow machine does not run them out.)
    let model = scripted(vec![call("echo", json!({"text": "hi"})), answer("done")]);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .permissions(PermissionPolicy::new(Decision::Ask))
        .step_timeout(Some(Duration::from_millis(600)))
        .run_timeout(Some(Duration::from_millis(1200)))
        .permission_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    let request = next_request(&mut handle, &mut seen).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    handle.respond_permission(&request, PermissionDecision::Allow).unwrap();
    let (rest, outcome) = handle.collect().await;
    seen.extend(rest);
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(tool_results(&seen)[0].1, "success");

    // Unanswered, the ask is denied at its own timeout (1 s), long after
    // the step limit (500 ms), and the model is told.
    let model = scripted(vec![call("echo", json!({"text": "hi"})), answer("no permission")]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(Echo::default())
        .permissions(PermissionPolicy::new(Decision::Ask))
        .step_timeout(Some(Duration::from_millis(500)))
        .permission_timeout(Some(Duration::from_secs(1)))
        .build()
        .unwrap();
    let started = Instant::now();
    let (events, outcome) = agent.run("go").collect().await;
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    let (_, status, content) = &tool_results(&events)[0];
    assert_eq!(status, "denied");
    assert!(content.contains("not given in time"), "{content}");

    // A paused run's clocks stop too: paused for 1 s of a 600 ms limit
    // (the model takes 50 ms of it).
    let model = scripted(vec![delayed(call("echo", json!({"text": "a"})), 50), answer("done")]);
    let agent = Agent::builder()
        .model_arc(model)
        .tool(Echo::default())
        .run_timeout(Some(Duration::from_millis(600)))
        .build()
        .unwrap();
    let handle = agent.run("go");
    handle.pause();
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.unpause();
    let (_, outcome) = handle.collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
}
