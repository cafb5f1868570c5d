//! The engine through the library API: the acceptance tests of the turn loop,
//! the termination matrix, error results the model recovers from, and the
//! controls of a live run. The scripted model stands in for the remote model.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom::models::{ScriptTurn, ScriptedModel};
use loom::{validate_history, Agent, EventKind, Message, RunStatus, StopReason, TimeoutKind};
use serde_json::json;
use support::*;

fn agent(model: &Arc<ScriptedModel>, max_steps: u32) -> loom::AgentBuilder {
    Agent::builder()
        .model_arc(model.clone())
        .max_steps(max_steps)
        .workspace(std::env::temp_dir())
}

// ---- acceptance tests of the turn loop ----

#[tokio::test]
async fn base_case_without_tools_finishes_in_one_turn() {
    let model = scripted(vec![answer("Final answer")]);
    let agent = agent(&model, 10).build().unwrap();
    let (events, outcome) = agent.run("test").collect().await;

    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("Final answer"));
    let finishes: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AgentFinish { content, turns, .. } => Some((content.clone(), *turns)),
            _ => None,
        })
        .collect();
    assert_eq!(finishes, vec![("Final answer".to_string(), 1)]);
    let iterations: Vec<u32> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::IterationStart { iteration } => Some(iteration),
            _ => None,
        })
        .collect();
    assert_eq!(iterations, vec![0], "no recursion without tools");
    assert!(!names(&events).contains(&"recursion"));
    assert!(
        !names(&events).contains(&"step.completed"),
        "no step.completed without tools"
    );
    assert_eq!(model.played(), 1);
    // The text streamed as deltas that add up to the answer.
    let streamed: String = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::LlmDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, "Final answer");
}

#[tokio::test]
async fn recursion_with_a_tool_takes_two_turns() {
    let model = scripted(vec![
        call("echo", json!({"text": "tool result"})),
        answer("Final answer after tool"),
    ]);
    let echo = Echo::default();
    let agent = agent(&model, 10).tool(echo.clone()).build().unwrap();
    let (events, outcome) = agent.run("test").collect().await;

    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    let iterations: Vec<u32> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::IterationStart { iteration } => Some(iteration),
            _ => None,
        })
        .collect();
    assert_eq!(iterations, vec![0, 1]);
    let recursions: Vec<_> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Recursion {
                from_turn,
                to_turn,
                recursion_depth,
            } => Some((from_turn, to_turn, recursion_depth)),
            _ => None,
        })
        .collect();
    assert_eq!(recursions, vec![(0, 1, 1)]);
    assert_eq!(model.played(), 2, "the model is called twice");
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        tool_results(&events),
        vec![("echo".into(), "success".into(), "tool result".into())]
    );

    // The turn chain is traceable: each turn's parent is the turn before it.
    let first_turn = events[0].turn_id.clone();
    let second = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::IterationStart { iteration: 1 }))
        .unwrap();
    assert_eq!(second.parent_turn_id.as_ref(), Some(&first_turn));
    assert!(names(&events).contains(&"step.completed"));
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn depth_limit_reached_then_final_answer_without_tools() {
    // The model would call tools forever; the fourth call is offered no tools.
    let mut turns: Vec<ScriptTurn> = (0..3).map(|_| call("echo", json!({"text": "again"}))).collect();
    let mut last = call("echo", json!({"text": "never"}));
    last.content = Some("Best answer with what I have".into());
    turns.push(last);
    let model = scripted(turns);
    let echo = Echo::default();
    let agent = agent(&model, 3).tool(echo.clone()).build().unwrap();
    let (events, outcome) = agent.run("loop forever").collect().await;

    assert_contract(&events);
    let reached: Vec<_> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::MaxIterationsReached {
                turn_counter,
                max_iterations,
            } => Some((turn_counter, max_iterations)),
            _ => None,
        })
        .collect();
    assert_eq!(reached, vec![(3, 3)]);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 3, "no tool runs after the limit");
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("Best answer with what I have"));
    let final_call = events
        .iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::LlmStart { tools_offered, .. } => Some(tools_offered),
            _ => None,
        })
        .unwrap();
    assert!(!final_call, "the final call offers no tools");
    let steps: Vec<u32> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::StepCompleted { step, max_steps, .. } => {
                assert_eq!(max_steps, 3);
                Some(step)
            }
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn cancelled_before_start_never_calls_the_model() {
    let model = scripted(vec![answer("never")]);
    let agent = agent(&model, 10).build().unwrap();
    let handle = agent.run("test");
    handle.cancel("stopped early");
    let (events, outcome) = handle.collect().await;

    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Canceled);
    assert_eq!(model.played(), 0);
    assert!(!names(&events).contains(&"llm.start"));
    let reasons: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ExecutionCancelled { reason } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, vec!["stopped early".to_string()]);
}

// ---- termination matrix (docs/architecture.md), one test per row ----

#[tokio::test]
async fn matrix_answer_without_tools_is_done() {
    let model = scripted(vec![answer("2")]);
    let (events, outcome) = agent(&model, 10).build().unwrap().run("1+1?").collect().await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    match &events.last().unwrap().kind {
        EventKind::LifecycleEnd { status, content, .. } => {
            assert_eq!(*status, RunStatus::Done);
            assert_eq!(content.as_deref(), Some("2"));
        }
        other => panic!("last event {other:?}"),
    }
}

#[tokio::test]
async fn matrix_max_steps_without_answer_is_an_error_with_its_own_reason() {
    let model = scripted(vec![call("echo", json!({"text": "x"})), answer("")]);
    let (events, outcome) = agent(&model, 1)
        .tool(Echo::default())
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    assert_eq!(outcome.stop_reason, Some(StopReason::MaxStepsWithoutAnswer));
    assert_eq!(outcome.status, RunStatus::Error);
    assert!(events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code.as_str() == "MAX_STEPS_NO_ANSWER")));
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn matrix_run_timeout_stops_a_slow_tool() {
    let model = scripted(vec![call("slow", json!({})), answer("unreachable")]);
    let slow = Slow::default();
    let agent = agent(&model, 10)
        .tool(slow.clone())
        .run_timeout(Some(Duration::from_millis(300)))
        .step_timeout(None)
        .build()
        .unwrap();
    let started = Instant::now();
    let (events, outcome) = agent.run("go").collect().await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the run must not wait for the tool"
    );
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Timeout);
    assert_eq!(outcome.stop_reason, Some(StopReason::Timeout(TimeoutKind::Run)));
    assert!(slow.saw_cancel.load(Ordering::SeqCst), "the tool observed its token");
    assert_eq!(tool_results(&events)[0].1, "timeout");
    assert!(events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code.as_str() == "RUN_TIMEOUT")));
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn matrix_step_timeout_stops_a_slow_model() {
    let model = scripted(vec![delayed(answer("too late"), 30_000)]);
    let agent = agent(&model, 10)
        .step_timeout(Some(Duration::from_millis(200)))
        .build()
        .unwrap();
    let started = Instant::now();
    let (events, outcome) = agent.run("go").collect().await;
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Timeout);
    assert_eq!(outcome.stop_reason, Some(StopReason::Timeout(TimeoutKind::Step)));
    assert!(events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code.as_str() == "STEP_TIMEOUT")));
}

#[tokio::test]
async fn matrix_external_cancel_during_a_slow_model_stream() {
    let model = scripted(vec![delayed(answer("too late"), 30_000)]);
    let agent = agent(&model, 10).build().unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    while let Some(event) = handle.next_event().await {
        let is_llm_start = event.kind.name() == "llm.start";
        seen.push(event);
        if is_llm_start {
            break;
        }
    }
    let started = Instant::now();
    handle.cancel("user pressed stop");
    handle.cancel("pressed again");
    let (rest, outcome) = handle.collect().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel must stop the stream promptly"
    );
    seen.extend(rest);
    assert_contract(&seen);
    assert_eq!(outcome.status, RunStatus::Canceled);
    assert_eq!(
        outcome.stop_reason,
        Some(StopReason::Cancelled("user pressed stop".into())),
        "the first cancel's reason wins"
    );
}

#[tokio::test]
async fn matrix_external_cancel_during_a_slow_tool() {
    let model = scripted(vec![
        calls(&[("slow", json!({})), ("echo", json!({"text": "after"}))]),
        answer("unreachable"),
    ]);
    let slow = Slow::default();
    let echo = Echo::default();
    let agent = agent(&model, 10).tool(slow.clone()).tool(echo.clone()).build().unwrap();
    let mut handle = agent.run("go");
    let mut seen = Vec::new();
    while let Some(event) = handle.next_event().await {
        let tools_started = event.kind.name() == "tool_calls.start";
        seen.push(event);
        if tools_started {
            break;
        }
    }
    while !slow.started.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    handle.cancel("stop");
    let (rest, outcome) = handle.collect().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    seen.extend(rest);
    assert_contract(&seen);
    assert_eq!(outcome.status, RunStatus::Canceled);
    assert!(
        slow.saw_cancel.load(Ordering::SeqCst),
        "the running tool observed its token"
    );
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0, "calls not started never run");
    let statuses: Vec<String> = tool_results(&seen).into_iter().map(|r| r.1).collect();
    assert_eq!(statuses, vec!["cancelled", "cancelled"]);
    // Every call has its result, so the transcript can be sent to a provider.
    validate_history(&outcome.messages, false).unwrap();
    assert_eq!(model.played(), 1);
}

#[tokio::test]
async fn matrix_tool_failure_continues_the_run() {
    // An answer right after a failed call is sent back once with guidance
    // (docs/context.md, "An error echoed as the answer"); the second is the answer.
    let model = scripted(vec![
        call("faulty", json!({"mode": "fail"})),
        answer("The call failed with an error."),
        answer("recovered"),
    ]);
    let (events, outcome) = agent(&model, 10)
        .tool(Faulty)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("recovered"));
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Warning { code, .. } if code.as_str() == "ERROR_ECHO")),
        "the first answer was sent back"
    );
    assert!(
        !outcome
            .messages
            .iter()
            .any(|m| m.content() == "The call failed with an error."),
        "and is not stored"
    );
    let results = tool_results(&events);
    assert_eq!(results[0].1, "error");
    assert!(results[0].2.contains("disk on fire"));
    assert_eq!(outcome.metrics.tool_failures, 1);
}

// ---- error results the model can act on ----

#[tokio::test]
async fn unknown_tool_names_the_available_tools_and_the_model_recovers() {
    let model = scripted(vec![
        call("read_fiel", json!({"path": "x"})),
        call("echo", json!({"text": "ok"})),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .tool(Faulty)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    let results = tool_results(&events);
    assert_eq!(results[0].1, "error");
    assert!(results[0].2.contains("no tool named 'read_fiel'"), "{}", results[0].2);
    assert!(
        results[0].2.contains("Available tools: echo, faulty"),
        "{}",
        results[0].2
    );
    assert_eq!(results[1].1, "success");
    assert_eq!(outcome.status, RunStatus::Done);
    // The model saw the error as the tool message of that call.
    let tool_messages: Vec<&Message> = outcome.messages.iter().filter(|m| m.role() == "tool").collect();
    assert!(tool_messages[0].content().contains("Available tools"));
}

#[tokio::test]
async fn invalid_arguments_are_reported_with_what_is_wrong() {
    let model = scripted(vec![
        calls(&[
            ("echo", json!({"txt": "typo"})),
            ("echo", json!({"text": 5})),
            ("echo", json!("{not json")),
        ]),
        answer("done"),
    ]);
    let echo = Echo::default();
    let (events, _) = agent(&model, 10)
        .tool(echo.clone())
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r.1 == "error"));
    assert!(
        results[0].2.contains("\"text\" is a required property"),
        "{}",
        results[0].2
    );
    assert!(results[1].2.contains("is not of type \"string\""), "{}", results[1].2);
    assert!(results[2].2.contains("not valid JSON"), "{}", results[2].2);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0, "invalid calls never run");
}

#[tokio::test]
async fn panics_and_empty_output_become_results() {
    let model = scripted(vec![
        calls(&[
            ("faulty", json!({"mode": "panic"})),
            ("faulty", json!({"mode": "empty"})),
        ]),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, 10)
        .tool(Faulty)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    let results = tool_results(&events);
    assert_eq!(results[0].1, "error");
    assert!(results[0].2.contains("crashed (panic: tool bug)"), "{}", results[0].2);
    assert_eq!(results[1].1, "warning");
    assert!(results[1].2.contains("without output"));
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn tool_results_follow_call_order_and_carry_timings() {
    let model = scripted(vec![
        calls(&[
            ("echo", json!({"text": "1"})),
            ("echo", json!({"text": "2"})),
            ("echo", json!({"text": "3"})),
        ]),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    let contents: Vec<String> = tool_results(&events).into_iter().map(|r| r.2).collect();
    assert_eq!(contents, vec!["1", "2", "3"]);
    let json = serde_json::to_value(events.iter().find(|e| e.kind.name() == "tool.result").unwrap()).unwrap();
    assert!(json["durationMs"].is_u64());
    assert!(json["stages"]["executeUs"].is_u64());
    assert_eq!(json["callId"], "call_0_0");
    let start = events.iter().find(|e| e.kind.name() == "tool_calls.start").unwrap();
    let json = serde_json::to_value(start).unwrap();
    assert_eq!(json["calls"][2]["args"]["text"], "3");
    let complete = events.iter().find_map(|e| match e.kind {
        EventKind::ToolCallsComplete { count } => Some(count),
        _ => None,
    });
    assert_eq!(complete, Some(3));
    validate_history(&outcome.messages, false).unwrap();
}

// ---- controls of a live run ----

#[tokio::test]
async fn steer_adds_a_user_message_at_the_next_turn_boundary() {
    let model = scripted(vec![
        delayed(call("echo", json!({"text": "looked"})), 200),
        answer("done, in French"),
    ]);
    let agent = agent(&model, 10).tool(Echo::default()).build().unwrap();
    let handle = agent.run("go");
    handle.steer("answer in French").unwrap();
    let (events, outcome) = handle.collect().await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    let roles: Vec<&str> = outcome.messages.iter().map(|m| m.role()).collect();
    // The steer follows the tool results (guidance is never stored).
    assert_eq!(roles, vec!["system", "user", "assistant", "tool", "user", "assistant"]);
    assert_eq!(outcome.messages[4].content(), "answer in French");
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn steer_during_a_final_answer_gets_another_turn() {
    let model = scripted(vec![delayed(answer("first answer"), 200), answer("revised answer")]);
    let agent = agent(&model, 10).build().unwrap();
    let handle = agent.run("go");
    handle.steer("actually, be brief").unwrap();
    let (events, outcome) = handle.collect().await;
    assert_contract(&events);
    assert_eq!(outcome.content.as_deref(), Some("revised answer"));
    assert_eq!(model.played(), 2);
}

#[tokio::test]
async fn pause_holds_the_run_until_unpause() {
    let model = scripted(vec![answer("done")]);
    let agent = agent(&model, 10).build().unwrap();
    let mut handle = agent.run("go");
    handle.pause();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(model.played(), 0, "a paused run does not call the model");
    assert_eq!(handle.status(), RunStatus::Running);
    let first = handle.next_event().await.unwrap();
    assert_eq!(first.kind.name(), "lifecycle.start");
    handle.unpause();
    let (mut rest, outcome) = handle.collect().await;
    rest.insert(0, first);
    assert_contract(&rest);
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn cancel_while_paused_ends_the_run() {
    let model = scripted(vec![answer("done")]);
    let agent = agent(&model, 10).build().unwrap();
    let handle = agent.run("go");
    handle.pause();
    tokio::time::sleep(Duration::from_millis(50)).await;
    handle.cancel("changed my mind");
    let (events, outcome) = handle.collect().await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Canceled);
    assert_eq!(model.played(), 0);
}

#[tokio::test]
async fn an_exhausted_script_ends_the_run_with_a_clear_error() {
    let model = scripted(vec![call("echo", json!({"text": "x"}))]);
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Error);
    let error = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Error { code, message, .. } => Some((*code, message.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(error.0.as_str(), "SCRIPT_EXHAUSTED");
    assert!(error.1.contains("all 1 turns"), "{}", error.1);
}

#[tokio::test]
async fn steering_a_finished_run_is_refused() {
    let model = scripted(vec![answer("done")]);
    let agent = agent(&model, 10).build().unwrap();
    let handle = agent.run("go");
    let controller = handle.controller();
    let _ = handle.outcome().await;
    assert!(controller.steer("too late").is_err());
    controller.cancel("after the end is harmless");
    assert_eq!(controller.status(), RunStatus::Done);
}

#[tokio::test]
async fn an_unavailable_tool_is_reported_and_never_runs() {
    struct Offline;
    impl loom::Tool for Offline {
        type Args = NoArgs;
        fn name(&self) -> &str {
            "offline"
        }
        fn description(&self) -> &str {
            "Needs a service that is down."
        }
        fn check_available(&self) -> Result<(), String> {
            Err("the search index is still building".into())
        }
        async fn call(&self, _args: NoArgs, _ctx: loom::ToolContext) -> Result<loom::ToolOutput, loom::ToolError> {
            panic!("an unavailable tool must not run")
        }
    }
    let model = scripted(vec![call("offline", json!({})), answer("ok")]);
    let (events, outcome) = agent(&model, 10)
        .tool(Offline)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    let results = tool_results(&events);
    assert_eq!(results[0].1, "error");
    assert!(
        results[0]
            .2
            .contains("not available right now: the search index is still building"),
        "{}",
        results[0].2
    );
    assert_eq!(outcome.status, RunStatus::Done);
}

#[tokio::test]
async fn duplicate_and_badly_named_tools_are_refused_at_build() {
    let model = scripted(vec![]);
    let err = agent(&model, 10)
        .tool(Echo::default())
        .tool(Echo::default())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("already registered"), "{err}");
    let err = agent(&model, 0).build().unwrap_err();
    assert!(err.to_string().contains("max_steps"), "{err}");
}

#[tokio::test]
async fn a_continued_answer_is_stored_once_or_not_at_all() {
    let cut = |text: &str| ScriptTurn {
        content: Some(text.into()),
        finish_reason: Some("length".into()),
        ..ScriptTurn::default()
    };
    // Continued to its end: one assistant message holds the whole answer.
    let model = scripted(vec![cut("The answer "), cut("is "), answer("42.")]);
    let (events, outcome) = agent(&model, 5).build().unwrap().run("q").collect().await;
    assert_contract(&events);
    assert_eq!(outcome.content.as_deref(), Some("The answer is 42."));
    let roles: Vec<&str> = outcome.messages.iter().map(|m| m.role()).collect();
    assert_eq!(roles, ["system", "user", "assistant"]);
    assert_eq!(outcome.messages[2].content(), "The answer is 42.");

    // Cancelled while the continuation is asked for: the piece so far is
    // not left in the history (a resume would take it for the answer).
    let model = scripted(vec![cut("The answer "), delayed(answer("is 42."), 2000)]);
    let handle = agent(&model, 5).build().unwrap().run("q");
    let controller = handle.controller();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        controller.cancel("stop");
    });
    let (_, outcome) = handle.collect().await;
    assert_eq!(outcome.status, RunStatus::Canceled);
    let roles: Vec<&str> = outcome.messages.iter().map(|m| m.role()).collect();
    assert_eq!(roles, ["system", "user"]);
}

// ---- budgets ----

fn costing(mut turn: loom::models::ScriptTurn, input: u64, output: u64) -> loom::models::ScriptTurn {
    turn.usage = Some(loom::models::ScriptUsage {
        input_tokens: input,
        output_tokens: output,
        ..loom::models::ScriptUsage::default()
    });
    turn
}

/// `count` turns that each call `echo` (with different text) and report usage.
fn echo_turns(count: usize, input: u64, output: u64) -> Vec<loom::models::ScriptTurn> {
    (0..count)
        .map(|i| costing(call("echo", json!({"text": format!("t{i}")})), input, output))
        .collect()
}

fn warnings_and_errors(events: &[loom::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Warning { code, .. } => Some(format!("warning {code}")),
            EventKind::Error { code, .. } => Some(format!("error {code}")),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_run_stops_when_its_token_budget_is_used_up_after_a_warning_at_80_percent() {
    // 300 tokens a turn against a budget of 1 000: warned before the
    // fourth call (900 used), stopped before the fifth (1 200 used).
    let model = scripted(echo_turns(6, 250, 50));
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .max_tokens(1000)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Error);
    assert_eq!(
        outcome.stop_reason,
        Some(StopReason::BudgetExhausted(loom::BudgetKind::Tokens))
    );
    assert_eq!(model.played(), 4, "no model call once the budget is used up");
    assert_eq!(outcome.metrics.input_tokens + outcome.metrics.output_tokens, 1200);
    assert_eq!(
        warnings_and_errors(&events),
        ["warning BUDGET_LOW", "error BUDGET_EXHAUSTED"]
    );
    let message = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    assert!(message.contains("1200 of 1000 tokens"), "{message}");
    // Every call that ran has its result: the history stays valid.
    validate_history(&outcome.messages, false).unwrap();
}

#[tokio::test]
async fn a_cost_budget_counts_at_the_model_prices_and_needs_them() {
    // $1 per million tokens both ways: 1 000 tokens a turn = $0.001.
    let model = scripted(echo_turns(4, 500, 500));
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .pricing(loom::Pricing {
            input_per_mtok: 1.0,
            output_per_mtok: 1.0,
        })
        .max_cost_usd(0.0024)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_eq!(
        outcome.stop_reason,
        Some(StopReason::BudgetExhausted(loom::BudgetKind::Cost))
    );
    assert_eq!(model.played(), 3);
    assert_eq!(
        warnings_and_errors(&events),
        ["warning BUDGET_LOW", "error BUDGET_EXHAUSTED"]
    );

    // Without prices a cost budget cannot be kept: refused when built.
    let refused = agent(&scripted(vec![]), 10).max_cost_usd(1.0).build();
    assert!(matches!(refused, Err(loom::BuildError::InvalidLimit(why)) if why.contains("prices")));
    assert!(agent(&scripted(vec![]), 10).max_tokens(0).build().is_err());
}

#[tokio::test]
async fn an_answer_within_the_budget_finishes_even_past_80_percent() {
    let model = scripted(vec![
        costing(call("echo", json!({"text": "x"})), 400, 50),
        costing(answer("done"), 400, 50),
    ]);
    let (events, outcome) = agent(&model, 10)
        .tool(Echo::default())
        .max_tokens(1000)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert!(
        warnings_and_errors(&events).is_empty(),
        "450 of 1 000 before the last call"
    );
}
