//! Sub-agents through the library: the `task` tool with the scripted
//! model — nested events, tool subsets, parallel children and their cap,
//! budgets as one tree, the cancel tree, the nesting limit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use loom::models::{ScriptTurn, ScriptUsage, ScriptedModel};
use loom::tools::{ListDir, Task, WriteFile};
use loom::{Agent, Decision, Event, EventKind, PermissionPolicy, RunStatus, StopReason, SubAgentSettings};
use serde_json::json;
use support::*;

fn agent(model: &Arc<ScriptedModel>, dir: &std::path::Path) -> loom::AgentBuilder {
    let mut policy = PermissionPolicy::new(Decision::Deny);
    policy.add_rule("task", Decision::Allow).unwrap();
    policy.add_rule("list_dir", Decision::Allow).unwrap();
    Agent::builder()
        .model_arc(model.clone())
        .tool(Task::new())
        .tool(ListDir)
        .tool(WriteFile)
        .permissions(policy)
        .workspace(dir)
}

/// `task` allowed, `write_file` asked, the rest denied.
fn asking_for_writes() -> PermissionPolicy {
    let mut policy = PermissionPolicy::new(Decision::Deny);
    policy.add_rule("task", Decision::Allow).unwrap();
    policy.add_rule("write_file", Decision::Ask).unwrap();
    policy
}

/// A parent whose child writes `content` to x.txt, then both answer.
fn writing_child(content: &str) -> Arc<ScriptedModel> {
    scripted(vec![
        call("task", task("write it", Some(&["write_file"]))),
        call("write_file", json!({"path": "x.txt", "content": content})),
        answer("written"),
        answer("done"),
    ])
}

fn task(prompt: &str, tools: Option<&[&str]>) -> serde_json::Value {
    match tools {
        Some(tools) => json!({"description": "part", "prompt": prompt, "tools": tools}),
        None => json!({"description": "part", "prompt": prompt}),
    }
}

fn costing(mut turn: ScriptTurn, tokens: u64) -> ScriptTurn {
    turn.usage = Some(ScriptUsage {
        input_tokens: tokens,
        output_tokens: 0,
        ..ScriptUsage::default()
    });
    turn
}

/// The events of each run, in stream order, keyed by run id.
fn by_run(events: &[Event]) -> BTreeMap<String, Vec<Event>> {
    let mut runs: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for event in events {
        runs.entry(event.run_id.to_string()).or_default().push(event.clone());
    }
    runs
}

fn children(events: &[Event], parent: &str) -> Vec<Vec<Event>> {
    by_run(events)
        .into_values()
        .filter(|run| run[0].parent_run_id.as_deref() == Some(parent))
        .collect()
}

fn end_status(run: &[Event]) -> RunStatus {
    match &run.last().unwrap().kind {
        EventKind::LifecycleEnd { status, .. } => *status,
        other => panic!("last event {other:?}"),
    }
}

#[tokio::test]
async fn a_child_is_a_run_of_its_own_whose_events_join_the_parents_stream() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        costing(call("task", task("list the workspace", Some(&["list_dir"]))), 100),
        costing(call("list_dir", json!({})), 40),
        costing(answer("two entries"), 40),
        costing(answer("the child saw two entries"), 100),
    ]);
    let (events, outcome) = agent(&model, dir.path()).build().unwrap().run("go").collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{outcome:?}");
    let parent = outcome.run_id.clone();
    let runs = by_run(&events);
    assert_eq!(runs.len(), 2);
    assert_contract(&runs[&parent]);
    let child = &children(&events, &parent)[0];
    assert_contract(child);
    assert!(child.iter().all(|e| e.depth == 1 && e.run_id.as_ref() != parent));
    assert!(runs[&parent].iter().all(|e| e.depth == 0 && e.parent_run_id.is_none()));
    // The child's first turn hangs under the turn that called it.
    let calling_turn = runs[&parent]
        .iter()
        .find(|e| e.kind.name() == "tool_calls.start")
        .unwrap()
        .turn_id
        .clone();
    assert_eq!(child[0].parent_turn_id.as_ref(), Some(&calling_turn));
    let json = serde_json::to_value(&child[0]).unwrap();
    assert_eq!(json["parentRunId"], parent.as_str());
    // The parent's usage includes the child's.
    assert_eq!(outcome.metrics.input_tokens, 280);
    let (_, status, content) = &tool_results(&runs[&parent])[0];
    assert_eq!(status, "success");
    assert!(content.contains(": completed\nanswer:\ntwo entries\n"), "{content}");
    assert!(content.contains("usage: 80 input"), "{content}");
}

#[tokio::test]
async fn a_child_has_only_the_tools_it_was_given_and_read_only_ones_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        // Default subset: the read-only tools, so no write_file.
        call("task", task("write something", None)),
        call("write_file", json!({"path": "x.txt", "content": "x"})),
        answer("I could not write"),
        // A tool the parent does not have.
        call("task", task("search", Some(&["grep"]))),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, dir.path()).build().unwrap().run("go").collect().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert!(!dir.path().join("x.txt").exists());
    let child = &children(&events, &outcome.run_id)[0];
    let (name, status, content) = &tool_results(child)[0];
    assert_eq!((name.as_str(), status.as_str()), ("write_file", "error"));
    assert!(content.contains("no tool named 'write_file'"), "{content}");
    let parent_results = tool_results(&by_run(&events)[&outcome.run_id]);
    let (_, status, content) = &parent_results[1];
    assert_eq!(status, "error");
    assert!(content.contains("cannot have grep"), "{content}");
}

#[tokio::test]
async fn a_child_with_a_writing_tool_is_still_under_the_parents_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        call("task", task("write it", Some(&["write_file"]))),
        call("write_file", json!({"path": "x.txt", "content": "x"})),
        answer("denied"),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, dir.path()).build().unwrap().run("go").collect().await;
    let child = &children(&events, &outcome.run_id)[0];
    let (_, status, _) = &tool_results(child)[0];
    assert_eq!(status, "denied", "the parent's deny rule holds in the child");
    assert!(!dir.path().join("x.txt").exists());
}

#[tokio::test]
async fn two_children_run_in_parallel_within_the_cap() {
    for (max_running, overlap) in [(4, true), (1, false)] {
        let dir = tempfile::tempdir().unwrap();
        // Both children play the same slow answer, whichever comes first.
        let model = scripted(vec![
            calls(&[("task", task("a", None)), ("task", task("b", None))]),
            delayed(answer("child"), 300),
            delayed(answer("child"), 300),
            answer("both done"),
        ]);
        let (events, outcome) = agent(&model, dir.path())
            .sub_agents(SubAgentSettings {
                max_running,
                ..SubAgentSettings::default()
            })
            .build()
            .unwrap()
            .run("go")
            .collect()
            .await;
        assert_eq!(outcome.status, RunStatus::Done);
        let child_events: Vec<&Event> = events.iter().filter(|e| e.depth == 1).collect();
        let position = |name: &str, nth: usize| {
            child_events
                .iter()
                .enumerate()
                .filter(|(_, e)| e.kind.name() == name)
                .nth(nth)
                .unwrap()
                .0
        };
        let second_starts_before_first_ends = position("lifecycle.start", 1) < position("lifecycle.end", 0);
        assert_eq!(second_starts_before_first_ends, overlap, "max_running = {max_running}");
        assert_eq!(children(&events, &outcome.run_id).len(), 2);
    }
}

#[tokio::test]
async fn a_child_that_would_pass_the_parents_token_budget_stops_budget_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    // The parent may spend 1 000 tokens; its first call took 400, so the
    // child has 600: its two calls of 400 use them up.
    let model = scripted(vec![
        costing(call("task", task("work", Some(&["list_dir"]))), 400),
        costing(call("list_dir", json!({"path": "."})), 400),
        costing(call("list_dir", json!({"path": "./"})), 400),
        costing(answer("never reached"), 1),
    ]);
    let (events, outcome) = agent(&model, dir.path())
        .max_tokens(1000)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    let child = &children(&events, &outcome.run_id)[0];
    assert_eq!(end_status(child), RunStatus::Error);
    let parent_results = tool_results(&by_run(&events)[&outcome.run_id]);
    let (_, status, content) = &parent_results[0];
    assert_eq!(status, "error");
    assert!(content.contains(": budget exhausted\n"), "{content}");
    assert!(!content.contains("completed"), "{content}");
    // The parent stops too, before another model call, with the child's
    // usage counted.
    assert_eq!(
        outcome.stop_reason,
        Some(StopReason::BudgetExhausted(loom::BudgetKind::Tokens))
    );
    assert_eq!(outcome.metrics.input_tokens, 1200);
    assert_eq!(model.played(), 3);
}

#[tokio::test]
async fn cancelling_the_parent_cancels_its_children_and_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        calls(&[("task", task("a", None)), ("task", task("b", None))]),
        delayed(answer("late"), 30_000),
        delayed(answer("late"), 30_000),
    ]);
    let mut run = agent(&model, dir.path()).build().unwrap().run("go");
    let mut events = Vec::new();
    let mut started = 0;
    while let Some(event) = run.next_event().await {
        if event.depth == 1 && event.kind.name() == "llm.start" {
            started += 1;
            if started == 2 {
                run.cancel("stop everything");
            }
        }
        events.push(event);
    }
    let outcome = tokio::time::timeout(Duration::from_secs(5), run.outcome())
        .await
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Canceled);
    let kids = children(&events, &outcome.run_id);
    assert_eq!(kids.len(), 2);
    for child in &kids {
        assert_eq!(
            end_status(child),
            RunStatus::Canceled,
            "every child ends before the parent"
        );
    }
    // The parent's lifecycle.end is the last event of the stream.
    assert_eq!(events.last().unwrap().run_id.as_ref(), outcome.run_id);
}

#[tokio::test]
async fn the_nesting_limit_takes_task_away() {
    let dir = tempfile::tempdir().unwrap();
    let model = scripted(vec![
        call("task", task("delegate again", Some(&["task"]))),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, dir.path())
        .sub_agents(SubAgentSettings {
            max_depth: 1,
            ..SubAgentSettings::default()
        })
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_eq!(outcome.status, RunStatus::Done);
    let (_, status, content) = &tool_results(&events)[0];
    assert_eq!(status, "error");
    assert!(content.contains("cannot start sub-agents of its own"), "{content}");

    // Within the limit (2 levels), a grandchild runs at depth 2 and the
    // child's own task tool is gone there.
    let model = scripted(vec![
        call("task", task("delegate", Some(&["task", "list_dir"]))),
        call("task", task("deeper", Some(&["list_dir"]))),
        answer("grandchild answer"),
        answer("child answer"),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, dir.path()).build().unwrap().run("go").collect().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(events.iter().map(|e| e.depth).max(), Some(2));
}

#[tokio::test]
async fn a_child_that_uses_the_steps_its_parent_had_left_reports_budget_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    // The parent may take 2 steps; its child asks for 5 and gets 2.
    let model = scripted(vec![
        call(
            "task",
            json!({"description": "long", "prompt": "keep looking", "tools": ["list_dir"], "max_steps": 5}),
        ),
        call("list_dir", json!({"path": "."})),
        call("list_dir", json!({"path": "./"})),
        answer(""),
        answer("done"),
    ]);
    let (events, outcome) = agent(&model, dir.path())
        .max_steps(2)
        .build()
        .unwrap()
        .run("go")
        .collect()
        .await;
    assert_eq!(outcome.status, RunStatus::Done);
    let (_, status, content) = &tool_results(&by_run(&events)[&outcome.run_id])[0];
    assert_eq!(status, "error");
    assert!(content.contains(": budget exhausted\n"), "{content}");
    assert!(content.contains("the 2 steps its parent had left"), "{content}");
    let child = &children(&events, &outcome.run_id)[0];
    assert!(matches!(&child[0].kind, EventKind::LifecycleStart { max_steps: 2, .. }));
}

#[tokio::test]
async fn a_childs_ask_goes_to_whoever_answers_the_parents_labelled_with_its_depth() {
    let dir = tempfile::tempdir().unwrap();
    let model = writing_child("from the child");
    let mut run = agent(&model, dir.path())
        .permissions(asking_for_writes())
        .build()
        .unwrap()
        .run("go");
    let controller = run.controller();
    let mut asked = Vec::new();
    while let Some(event) = run.next_event().await {
        if let EventKind::PermissionRequest { request_id, tool, .. } = &event.kind {
            asked.push((tool.clone(), event.depth, event.parent_run_id.is_some()));
            controller
                .respond_permission(request_id, loom::PermissionDecision::Allow)
                .unwrap();
        }
    }
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(asked, [("write_file".to_string(), 1, true)]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("x.txt")).unwrap(),
        "from the child"
    );
}

#[tokio::test]
async fn a_person_answering_a_child_stops_the_parents_clocks_and_task_has_no_call_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let model = writing_child("late");
    // The person takes longer than a turn may, and longer than a tool call
    // may: neither limit counts their time, and `task` is bounded by its
    // sub-agent's own limits, not by the per-call timeout.
    let mut run = agent(&model, dir.path())
        .permissions(asking_for_writes())
        .step_timeout(Some(Duration::from_millis(800)))
        .tool_timeout(Some(Duration::from_millis(800)))
        .build()
        .unwrap()
        .run("go");
    let controller = run.controller();
    while let Some(event) = run.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            let (controller, request_id) = (controller.clone(), request_id.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                controller
                    .respond_permission(&request_id, loom::PermissionDecision::Allow)
                    .unwrap();
            });
        }
    }
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(std::fs::read_to_string(dir.path().join("x.txt")).unwrap(), "late");
}

#[tokio::test]
async fn a_child_that_works_longer_than_a_step_may_does_not_end_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    // Three child steps of 400 ms each, under a step limit of 800 ms: each
    // of the child's steps fits; the parent's step that waits for the
    // whole child (1.2 s) is bounded by the run's limit only.
    let model = scripted(vec![
        call("task", task("look around", Some(&["list_dir"]))),
        delayed(call("list_dir", json!({"path": "."})), 400),
        delayed(call("list_dir", json!({"path": "."})), 400),
        delayed(answer("the child looked"), 400),
        answer("done"),
    ]);
    let outcome = agent(&model, dir.path())
        .step_timeout(Some(Duration::from_millis(800)))
        .build()
        .unwrap()
        .run("go")
        .outcome()
        .await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("done"));
}

#[tokio::test]
async fn an_interrupted_parent_leaves_its_child_resumable_and_resuming_the_parent_finishes_both() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn loom::Store> = Arc::new(loom::stores::SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let first = scripted(vec![
        call("task", task("look", Some(&["list_dir"]))),
        delayed(answer("never"), 30_000),
    ]);
    let mut run = agent(&first, dir.path())
        .store(store.clone())
        .build()
        .unwrap()
        .run("go");
    let parent_id = run.run_id().to_string();
    while let Some(event) = run.next_event().await {
        if event.depth == 1 && event.kind.name() == "llm.start" {
            run.controller().interrupt("the process is stopping");
        }
    }
    assert_eq!(run.outcome().await.status, RunStatus::Interrupted);
    let children = store.child_runs(&parent_id).await.unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].status, RunStatus::Interrupted, "the child stays resumable");

    let rest = scripted(vec![answer("the child's answer"), answer("the parent's answer")]);
    let resumed = agent(&rest, dir.path())
        .store(store.clone())
        .build()
        .unwrap()
        .resume(&parent_id)
        .await
        .unwrap();
    let (events, outcome) = resumed.collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("the parent's answer"));
    let child_start = events
        .iter()
        .find(|e| e.depth == 1 && e.kind.name() == "lifecycle.start")
        .unwrap();
    assert!(matches!(
        child_start.kind,
        EventKind::LifecycleStart { resumed: true, .. }
    ));
    let child = store.load_run(&children[0].run_id).await.unwrap().run;
    assert_eq!(child.status, RunStatus::Done);
    assert_eq!(child.content.as_deref(), Some("the child's answer"));
}

#[tokio::test]
async fn after_an_interrupt_the_parent_counts_a_finished_and_a_resumed_child_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn loom::Store> = Arc::new(loom::stores::SqliteStore::open(dir.path().join("loom.db")).unwrap());
    // Two children: whichever takes the first answer finishes at once (100
    // tokens), the other waits on the second until the interrupt.
    let first = scripted(vec![
        costing(calls(&[("task", task("a", None)), ("task", task("b", None))]), 10),
        costing(answer("fast"), 100),
        delayed(answer("never"), 30_000),
    ]);
    let mut run = agent(&first, dir.path())
        .store(store.clone())
        .build()
        .unwrap()
        .run("go");
    let parent_id = run.run_id().to_string();
    let mut finished_children = 0;
    let mut waiting = 0;
    while let Some(event) = run.next_event().await {
        if event.depth == 1 && event.kind.name() == "lifecycle.end" {
            finished_children += 1;
        }
        if event.depth == 1 && event.kind.name() == "llm.start" {
            waiting += 1;
        }
        if finished_children == 1 && waiting == 2 {
            run.controller().interrupt("the process is stopping");
            waiting = 0;
        }
    }
    assert_eq!(run.outcome().await.status, RunStatus::Interrupted);

    let rest = scripted(vec![
        costing(answer("slow, but done"), 50),
        costing(answer("both done"), 10),
    ]);
    let (_, outcome) = agent(&rest, dir.path())
        .store(store.clone())
        .build()
        .unwrap()
        .resume(&parent_id)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    // The parent's two calls, the fast child's 100 and the resumed one's 50.
    assert_eq!(outcome.metrics.input_tokens, 170);
    let stored = store.load_run(&parent_id).await.unwrap().run;
    assert_eq!(stored.metrics.input_tokens, 170);
}
