//! Context machinery through the library API: the recursion monitor,
//! feedback, compression (with a scripted summarizer, and its failure),
//! project instructions, the assembler and retrieval.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod support;

use std::sync::Arc;

use loom::models::{ScriptTurn, ScriptedModel};
use loom::tools::FolderRetriever;
use loom::{validate_history, Agent, Event, EventKind, MemoryConfig, RunStatus};
use serde_json::json;
use support::*;

fn guidance(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::GuidanceInjected { reason, content } => Some((reason.to_string(), content.clone())),
            _ => None,
        })
        .collect()
}

/// A send-back's own words, before the task it repeats.
fn nudge(guidance: &str) -> &str {
    guidance
        .split("\n\nThe task you were given: ")
        .next()
        .unwrap_or(guidance)
}

fn reasons(events: &[Event]) -> Vec<String> {
    guidance(events).into_iter().map(|(reason, _)| reason).collect()
}

// ---- recursion monitor ----

#[tokio::test]
async fn the_same_call_three_times_ends_the_tool_phase() {
    let mut turns: Vec<ScriptTurn> = (0..3).map(|_| call("echo", json!({"text": "same"}))).collect();
    turns.push(answer("Here is what I found."));
    let model = scripted(turns);
    let echo = Echo::default();
    let agent = Agent::builder()
        .model_arc(model)
        .tool(echo.clone())
        .max_steps(20)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("find it").collect().await;
    assert_contract(&events);
    let reasons = reasons(&events);
    assert!(reasons.contains(&"repetition_warning".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"duplicate_tools".to_string()), "{reasons:?}");
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("Here is what I found."));
    // The last call offered no tools and carried the termination message.
    let last_start = events.iter().rev().find_map(|e| match e.kind {
        EventKind::LlmStart { tools_offered, .. } => Some(tools_offered),
        _ => None,
    });
    assert_eq!(last_start, Some(false));
    // It is labelled as the monitor's final-answer call.
    let last_llm = events
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::LlmStart { .. }))
        .unwrap();
    assert!(
        matches!(&last_llm.kind, EventKind::LlmStart { final_answer: Some(why), .. } if why == "duplicate_tools"),
        "{last_llm:?}"
    );
    // The termination message went to that request only: guidance is
    // never stored in the history.
    let (_, message) = guidance(&events)
        .into_iter()
        .find(|(reason, _)| reason == "duplicate_tools")
        .unwrap();
    assert!(message.contains("Detected repeated tool calls"), "{message}");
    assert!(!outcome
        .messages
        .iter()
        .any(|m| m.content().contains("Detected repeated tool calls")));
    assert_eq!(outcome.messages.iter().filter(|m| m.role() == "system").count(), 1);
}

#[tokio::test]
async fn different_arguments_and_parallel_batches_are_not_repetition() {
    let turns = vec![
        call("echo", json!({"text": "a"})),
        call("echo", json!({"text": "b"})),
        call("echo", json!({"text": "c"})),
        calls(&[
            ("echo", json!({"text": "d"})),
            ("echo", json!({"text": "d"})),
            ("echo", json!({"text": "d"})),
        ]),
        answer("done"),
    ];
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .max_steps(20)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    let reasons = reasons(&events);
    assert!(
        !reasons
            .iter()
            .any(|r| r.contains("duplicate") || r.contains("repetition")),
        "{reasons:?}"
    );
    assert_eq!(outcome.content.as_deref(), Some("done"));
}

#[tokio::test]
async fn the_iteration_warning_comes_at_80_percent() {
    let turns: Vec<ScriptTurn> = (0..5)
        .map(|i| call("echo", json!({"text": format!("step {i}")})))
        .chain([answer("done")])
        .collect();
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .max_steps(5)
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    let warnings: Vec<(String, String)> = guidance(&events)
        .into_iter()
        .filter(|(r, _)| r == "iteration_warning")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].1.contains("Approaching iteration limit (1 remaining)"),
        "{}",
        warnings[0].1
    );
}

// ---- feedback ----

#[tokio::test]
async fn guidance_comes_only_with_a_signal_and_is_never_stored() {
    // Five tool turns; the third fails. Only the request after the failure
    // carries guidance, and the history keeps none.
    let turns: Vec<ScriptTurn> = (0..5)
        .map(|i| {
            if i == 2 {
                call("faulty", json!({"mode": "fail"}))
            } else {
                call("echo", json!({"text": format!("result {i}")}))
            }
        })
        .chain([answer("done")])
        .collect();
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .tool(Faulty)
        .max_steps(10)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("collect five results").collect().await;
    assert_contract(&events);
    validate_history(&outcome.messages, false).unwrap();
    let roles: Vec<&str> = outcome.messages.iter().map(|m| m.role()).collect();
    let mut expected = vec!["system", "user"];
    for _ in 0..5 {
        expected.extend(["assistant", "tool"]);
    }
    expected.push("assistant");
    assert_eq!(roles, expected, "no guidance in the history");
    let given = guidance(&events);
    assert_eq!(given.len(), 1, "{given:?}");
    assert_eq!(given[0].0, "error");
    assert!(
        given[0].1.starts_with("The tool call failed (faulty)."),
        "{}",
        given[0].1
    );
    assert!(!given[0].1.contains('%'), "no invented progress figures");
    // Announced with the request that carries it: the turn after the failure.
    let guided = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::GuidanceInjected { .. }))
        .unwrap();
    let iteration = events
        .iter()
        .filter(|e| e.seq < guided.seq)
        .filter_map(|e| match e.kind {
            EventKind::IterationStart { iteration } => Some(iteration),
            _ => None,
        })
        .next_back();
    assert_eq!(iteration, Some(3));
}

struct Sql;

impl loom::TaskHandler for Sql {
    fn can_handle(&self, task: &str) -> bool {
        task.contains("SQL")
    }
    fn generate_guidance(&self, _task: &str, analysis: &loom::ResultAnalysis, _depth: u32) -> Option<String> {
        Some(format!("SQL guidance: data={}", analysis.has_data))
    }
}

#[tokio::test]
async fn custom_handlers_and_switching_feedback_off() {
    let turns = vec![call("echo", json!({"text": "42 rows of data"})), answer("done")];
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .task_handler(Sql)
        .build()
        .unwrap();
    let (events, _) = agent.run("write the SQL").collect().await;
    assert_eq!(
        guidance(&events),
        vec![("task_handler".to_string(), "SQL guidance: data=true".to_string())]
    );

    let turns = vec![call("echo", json!({"text": "x"})), answer("done")];
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .feedback(false)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    assert!(guidance(&events).is_empty());
    assert!(!outcome.messages.iter().skip(1).any(|m| m.role() == "system"));

    // Off, even a failure gets no guidance; the monitor still watches.
    let turns = vec![call("faulty", json!({"mode": "fail"})), answer("done")];
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Faulty)
        .feedback(false)
        .build()
        .unwrap();
    let (events, _) = agent.run("go").collect().await;
    assert!(guidance(&events).is_empty());
}

// ---- answers that are not answers ----

/// A workspace holding `shapes.py`, and an agent that can read it.
fn shapes_agent(model: &Arc<ScriptedModel>) -> (tempfile::TempDir, Agent) {
    shapes_agent_with(model, false)
}

fn shapes_agent_with(model: &Arc<ScriptedModel>, can_write: bool) -> (tempfile::TempDir, Agent) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shapes.py"), "def area(r):\n    return 3.14 * r * r\n").unwrap();
    let mut builder = Agent::builder().model_arc(model.clone()).tool(loom::tools::ReadFile);
    if can_write {
        builder = builder.tool(loom::tools::WriteFile);
    }
    let agent = builder.workspace(dir.path()).max_steps(10).build().unwrap();
    (dir, agent)
}

#[tokio::test]
async fn an_answer_without_looking_at_the_file_the_task_names_is_sent_back_once() {
    let model = scripted(vec![
        answer("get_area"),
        call("read_file", json!({"path": "shapes.py"})),
        answer("area"),
    ]);
    let (_dir, agent) = shapes_agent(&model);
    // `notes.md` is named too but does not exist, and this agent cannot write it.
    let (events, outcome) = agent
        .run("Which function in shapes.py has no docstring? Put it in notes.md later.")
        .collect()
        .await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(outcome.content.as_deref(), Some("area"));
    let guidance = guidance(&events);
    assert_eq!(guidance.len(), 1, "{guidance:?}");
    assert_eq!(guidance[0].0, "untouched_files");
    assert!(
        nudge(&guidance[0].1).contains("`shapes.py`") && !nudge(&guidance[0].1).contains("notes.md"),
        "{}",
        guidance[0].1
    );
    assert!(
        guidance[0].1.ends_with(
            "\n\nThe task you were given: Which function in shapes.py has no docstring? Put it in notes.md later."
        ),
        "the send-back repeats the task: {}",
        guidance[0].1
    );
    let warned = events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Warning { code, .. } if code.as_str() == "UNTOUCHED_FILES"));
    assert!(warned);
    assert!(
        !outcome.messages.iter().any(|m| m.content() == "get_area"),
        "the answer sent back is not stored"
    );
    assert_eq!(model.played(), 3);
}

#[tokio::test]
async fn an_answer_that_never_wrote_the_file_the_task_asks_for_is_sent_back_until_no_progress() {
    let model = scripted(vec![
        answer("The project computes the area of a circle."),
        call(
            "write_file",
            json!({"path": "SUMMARY.md", "content": "Computes areas."}),
        ),
        // shapes.py is still unread, and the model made progress: sent back again.
        answer("Done."),
        call("read_file", json!({"path": "shapes.py"})),
        answer("Done, after reading it."),
    ]);
    let (dir, agent) = shapes_agent_with(&model, true);
    let task = "Read shapes.py and write a one-line summary of it to SUMMARY.md.";
    let (events, outcome) = agent.run(task).collect().await;
    assert_contract(&events);
    assert_eq!(outcome.content.as_deref(), Some("Done, after reading it."));
    let guidance = guidance(&events);
    assert_eq!(guidance.len(), 2, "{guidance:?}");
    assert!(
        guidance.iter().all(|(reason, _)| reason == "untouched_files"),
        "{guidance:?}"
    );
    assert!(guidance[0].1.contains("`shapes.py`"), "{}", guidance[0].1);
    assert!(
        guidance[0]
            .1
            .contains("`SUMMARY.md`, which the task names, does not exist"),
        "{}",
        guidance[0].1
    );
    assert!(
        nudge(&guidance[1].1).contains("`shapes.py`") && !nudge(&guidance[1].1).contains("SUMMARY.md"),
        "{}",
        guidance[1].1
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("SUMMARY.md")).unwrap(),
        "Computes areas."
    );
}

#[tokio::test]
async fn an_answer_after_looking_or_about_no_file_is_taken_at_once() {
    for (task, script) in [
        (
            "What does shapes.py compute?",
            vec![call("read_file", json!({"path": "shapes.py"})), answer("areas")],
        ),
        ("What is 2 + 2? See missing.py.", vec![answer("4")]),
    ] {
        let model = scripted(script);
        let (_dir, agent) = shapes_agent(&model);
        let (events, outcome) = agent.run(task).collect().await;
        assert_eq!(outcome.status, RunStatus::Done, "{task}");
        assert!(reasons(&events).is_empty(), "{task}: {:?}", reasons(&events));
    }
}

// ---- compression ----

const SUMMARY: &str = "## 1. Background context\n- the user wants five long results\n## 2. Key decisions\n- none\n## 3. Tool usage log\n- echo called for each result\n## 4. User intent evolution\n- none\n## 5. Execution results\n- results 0 to 3 collected\n## 6. Errors and solutions\n- none\n## 7. Open issues\n- none\n## 8. Future plans\n- answer";

fn long_turns(n: usize) -> Vec<ScriptTurn> {
    (0..n)
        .map(|i| {
            call(
                "echo",
                json!({"text": format!("result {i}: {}", "lorem ipsum dolor sit amet ".repeat(40))}),
            )
        })
        .chain([answer("all results collected")])
        .collect()
}

fn small_window() -> MemoryConfig {
    MemoryConfig {
        context_window: 2_000,
        compression_threshold: 0.92,
        warning_threshold: 0.80,
        keep_recent_messages: 3,
        ..MemoryConfig::default()
    }
}

#[tokio::test]
async fn a_small_window_compresses_into_eight_sections_and_keeps_the_request() {
    let summarizer = scripted((0..10).map(|_| answer(SUMMARY)).collect());
    let agent = Agent::builder()
        .model_arc(scripted(long_turns(6)))
        .summarizer(summarizer.clone())
        .tool(Echo::default())
        .memory(small_window())
        .max_steps(20)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("collect six long results").collect().await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    let applied: Vec<(usize, usize, usize, usize, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::CompressionApplied {
                messages_before,
                messages_after,
                tokens_before,
                tokens_after,
                method,
            } => Some((
                *messages_before,
                *messages_after,
                *tokens_before,
                *tokens_after,
                method.to_string(),
            )),
            _ => None,
        })
        .collect();
    assert!(!applied.is_empty(), "compression was triggered");
    for (messages_before, messages_after, tokens_before, tokens_after, method) in &applied {
        assert_eq!(method, "summary");
        assert!(messages_after < messages_before);
        assert!(tokens_after < tokens_before);
    }
    assert!(events.iter().any(|e| e.kind.name() == "context.warning"));
    assert!(summarizer.played() >= 1);
    let summary = outcome
        .messages
        .iter()
        .find(|m| m.content().starts_with(loom::memory::SUMMARY_MARKER))
        .expect("a compressed-history message");
    for section in loom::memory::SECTIONS {
        assert!(summary.content().contains(section), "{section}");
    }
    assert!(
        outcome
            .messages
            .iter()
            .any(|m| m.content() == "collect six long results"),
        "the request is kept"
    );
    assert_eq!(outcome.messages[0].role(), "system");
    validate_history(&outcome.messages, false).unwrap();
    assert!(outcome.metrics.compressions >= 1);
    assert!(outcome.metrics.compression_ratio.unwrap() < 1.0);
}

#[tokio::test]
async fn a_failing_summarizer_falls_back_and_the_run_completes() {
    // A summarizer with an empty script fails on its first call.
    let summarizer = scripted(Vec::new());
    let agent = Agent::builder()
        .model_arc(scripted(long_turns(6)))
        .summarizer(summarizer)
        .tool(Echo::default())
        .memory(small_window())
        .max_steps(20)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("collect six long results").collect().await;
    assert_contract(&events);
    assert_eq!(outcome.status, RunStatus::Done);
    let methods: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::CompressionApplied { method, .. } => Some(method.to_string()),
            _ => None,
        })
        .collect();
    assert!(
        !methods.is_empty() && methods.iter().all(|m| m == "fallback"),
        "{methods:?}"
    );
    assert!(outcome
        .messages
        .iter()
        .any(|m| m.content().contains("removed to fit the context window")));
    validate_history(&outcome.messages, false).unwrap();
    // Each compression asked the summarizer first.
    assert_eq!(
        outcome.metrics.errors.get("SCRIPT_EXHAUSTED").copied(),
        Some(methods.len() as u32)
    );
}

// ---- system prompt ----

#[tokio::test]
async fn project_instructions_reach_the_system_prompt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("AGENTS.md"), "Always answer in haiku.").unwrap();
    let user_dir = tempfile::tempdir().unwrap();
    std::fs::write(user_dir.path().join("LOOM.md"), "The user prefers metric units.").unwrap();
    let agent = Agent::builder()
        .model_arc(scripted(vec![answer("ok")]))
        .workspace(dir.path())
        .instructions_dir(user_dir.path())
        .build()
        .unwrap();
    let (_, outcome) = agent.run("hi").collect().await;
    let system = outcome.messages[0].content();
    assert!(system.contains("You are Loom"));
    assert!(
        system.contains("# Project instructions (AGENTS.md)\n\nAlways answer in haiku."),
        "{system}"
    );
    assert!(system.contains("The user prefers metric units."));
    assert!(
        system.find("metric").unwrap() < system.find("haiku").unwrap(),
        "the project's file comes last"
    );
}

#[tokio::test]
async fn a_tight_budget_drops_the_lowest_priority_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("LOOM.md"), "Project rule: keep it short.").unwrap();
    let docs = tempfile::tempdir().unwrap();
    std::fs::write(
        docs.path().join("runbook.md"),
        "# Rollback\n\nTo roll back a release, redeploy the previous image tag and rerun the migrations down.",
    )
    .unwrap();
    let agent = |budget: Option<usize>| {
        let mut builder = Agent::builder()
            .model_arc(scripted(vec![answer("ok")]))
            .retriever(Arc::new(FolderRetriever::index(docs.path()).unwrap()), 3)
            .workspace(dir.path());
        if let Some(budget) = budget {
            builder = builder.system_prompt_budget(budget);
        }
        builder.build().unwrap()
    };
    let (_, outcome) = agent(Some(100)).run("how do I roll back a release?").collect().await;
    let system = outcome.messages[0].content();
    assert!(
        system.contains("Project rule: keep it short."),
        "high priority kept: {system}"
    );
    assert!(
        !system.contains("# Retrieved context"),
        "the lower-priority passages were dropped: {system}"
    );

    let (_, outcome) = agent(None).run("how do I roll back a release?").collect().await;
    assert!(outcome.messages[0].content().contains("# Retrieved context"));
}

#[tokio::test]
async fn the_tools_are_described_once_in_the_request_not_again_in_the_prompt() {
    let model = scripted(vec![answer("ok")]);
    let agent = Agent::builder()
        .model_arc(model.clone())
        .tool(Echo::default())
        .build()
        .unwrap();
    let (_, outcome) = agent.run("hi").collect().await;
    let system = outcome.messages[0].content();
    assert!(!system.contains("Returns the text it is given"), "{system}");
    assert!(!system.contains("# Tools"), "{system}");
    // Nor does the prompt talk of error results: a small model then
    // answers with an invented error instead of calling anything.
    assert!(!system.contains("Error"), "{system}");
}

#[tokio::test]
async fn retrieval_adds_ranked_passages_and_reports_them() {
    let docs = tempfile::tempdir().unwrap();
    std::fs::write(
        docs.path().join("runbook.md"),
        "# Rollback\n\nTo roll back a release, redeploy the previous image tag and rerun the migrations down.",
    )
    .unwrap();
    std::fs::write(
        docs.path().join("recipes.md"),
        "# Bread\n\nKnead the dough for ten minutes.",
    )
    .unwrap();
    let retriever = Arc::new(FolderRetriever::index(docs.path()).unwrap());
    let agent = Agent::builder()
        .model_arc(scripted(vec![answer("Redeploy the previous tag.")]))
        .retriever(retriever, 3)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("how do I roll back a release?").collect().await;
    assert_contract(&events);
    let complete = events.iter().find_map(|e| match &e.kind {
        EventKind::RetrievalComplete { doc_count, sources } => Some((*doc_count, sources.clone())),
        _ => None,
    });
    let (count, sources) = complete.expect("retrieval.complete");
    assert!(count >= 1);
    assert_eq!(sources[0], "runbook.md#1");
    assert!(events.iter().any(|e| e.kind.name() == "retrieval.start"));
    let system = outcome.messages[0].content();
    assert!(system.contains("# Retrieved context"));
    assert!(system.contains("redeploy the previous image tag"));
    assert!(!system.contains("Knead"), "irrelevant passages stay out");
}

#[tokio::test]
async fn metrics_count_tools_by_name_and_suggest() {
    let turns = vec![
        calls(&[("echo", json!({"text": "x"})), ("faulty", json!({"mode": "fail"}))]),
        call("faulty", json!({"mode": "fail"})),
        answer("done"),
    ];
    let agent = Agent::builder()
        .model_arc(scripted(turns))
        .tool(Echo::default())
        .tool(Faulty)
        .build()
        .unwrap();
    let (events, outcome) = agent.run("go").collect().await;
    let metrics = &outcome.metrics;
    assert_eq!(metrics.tools["faulty"].calls, 2);
    assert_eq!(metrics.tools["faulty"].success_rate, 0.0);
    assert_eq!(metrics.tools["echo"].success_rate, 1.0);
    assert_eq!(metrics.errors.get("tool_error"), Some(&2));
    assert!(
        metrics
            .suggestions()
            .iter()
            .any(|s| s.contains("Low tool success rate")),
        "{:?}",
        metrics.suggestions()
    );
    let end = serde_json::to_value(events.last().unwrap()).unwrap();
    assert_eq!(end["metrics"]["tools"]["faulty"]["calls"], 2);
}
