//! Durable runs through the library: a run whose process died is resumed
//! from its last checkpoint without losing a result or repeating a side
//! effect; sessions continue their conversation.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::{Arc, Mutex};

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::stores::SqliteStore;
use loom::{
    validate_history, Agent, EventKind, Message, ResumeError, RunIndex, RunLog, RunRequest, RunStatus, Store,
    StoreError, Tool, ToolContext, ToolError, ToolOutput,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;

#[derive(Debug, Deserialize, JsonSchema)]
struct RecordArgs {
    /// What to record.
    item: String,
}

/// A side-effecting tool: every execution is appended to `log`. With a
/// `hang_on` item it never finishes that one (the process "dies" there).
#[derive(Clone)]
struct Record {
    log: Arc<Mutex<Vec<String>>>,
    hang_on: Option<String>,
    started: Arc<Notify>,
}

impl Tool for Record {
    type Args = RecordArgs;
    fn name(&self) -> &str {
        "record"
    }
    fn description(&self) -> &str {
        "Records an item (a side effect)."
    }
    async fn call(&self, args: RecordArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.log.lock().unwrap().push(args.item.clone());
        if self.hang_on.as_deref() == Some(args.item.as_str()) {
            self.started.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(format!("recorded {}", args.item).into())
    }
}

/// A read-only tool that counts its executions.
#[derive(Clone, Default)]
struct Look {
    count: Arc<Mutex<usize>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

impl Tool for Look {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "look"
    }
    fn description(&self) -> &str {
        "Looks around (read-only)."
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        true
    }
    async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        *self.count.lock().unwrap() += 1;
        Ok("all quiet".into())
    }
}

fn script() -> Vec<ScriptTurn> {
    let call = |id: &str, name: &str, arguments| ScriptToolCall {
        name: name.into(),
        arguments,
        id: Some(id.into()),
    };
    vec![
        ScriptTurn {
            tool_calls: vec![
                call("c_look", "look", json!({})),
                call("c_a", "record", json!({"item": "a"})),
                call("c_b", "record", json!({"item": "b"})),
                call("c_c", "record", json!({"item": "c"})),
            ],
            ..ScriptTurn::default()
        },
        ScriptTurn {
            content: Some("recorded what could be recorded".into()),
            ..ScriptTurn::default()
        },
    ]
}

/// An owner string naming a process of this host that has exited.
fn dead_owner() -> String {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let me = loom::owner::this_process();
    let host = me.split('/').next().unwrap().to_string();
    format!("{host}/pid:{pid}")
}

/// A run as a process records it before running it: `QUEUED`, owned by `owner`.
fn queued_record(run_id: &str, prompt: &str, owner: String) -> loom::RunRecord {
    loom::RunRecord {
        owner,
        ..loom::RunRecord::new(run_id, run_id, prompt, "scripted:inline", RunStatus::Queued, 1)
    }
}

/// Where the crashed run and its resumption keep their runs: the same
/// promises hold on each.
#[derive(Clone)]
enum Backend {
    Sqlite(std::path::PathBuf),
    Redis(String),
}

impl Backend {
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Self::Sqlite(db) => Arc::new(SqliteStore::open(db).unwrap()),
            Self::Redis(url) => Arc::new(loom_redis::RedisStore::connect(url).await.unwrap()),
        }
    }
}

/// Runs until `record(b)` hangs and `record(a)`'s result is in the stored
/// log, then drops the whole runtime — every task, mid-call — as a crash
/// would (before the checkpoint of the tool turn). Returns the run id.
fn crash_mid_tools(backend: &Backend, workspace: &std::path::Path, log: Arc<Mutex<Vec<String>>>) -> String {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Arc::new(Notify::new());
    let store = runtime.block_on(backend.open());
    let agent = Agent::builder()
        .model(ScriptedModel::new(script()))
        .tool(Look::default())
        .tool(Record {
            log,
            hang_on: Some("b".into()),
            started: started.clone(),
        })
        .workspace(workspace)
        .store(store.clone())
        .owner(dead_owner())
        .build()
        .unwrap();
    let run_id = runtime.block_on(async {
        let handle = agent.run("record a, b and c");
        started.notified().await;
        let run_id = handle.run_id().to_string();
        for _ in 0..500 {
            let stored = store.events(&run_id, 0).await.unwrap();
            if stored
                .iter()
                .any(|e| matches!(&e.kind, EventKind::ToolResult { call_id, .. } if call_id == "c_a"))
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        run_id
    });
    runtime.shutdown_background();
    run_id
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_killed_mid_tools_resumes_without_losing_or_repeating_a_call() {
    let dir = tempfile::tempdir().unwrap();
    killed_mid_tools_and_resumed(Backend::Sqlite(dir.path().join("loom.db")), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_redis_a_run_killed_mid_tools_resumes_without_losing_or_repeating_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let redis = loom_testkit::redis_server::RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    killed_mid_tools_and_resumed(Backend::Redis(redis.url(0)), &workspace).await;
}

async fn killed_mid_tools_and_resumed(backend: Backend, workspace: &std::path::Path) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (crashed, ws, log2) = (backend.clone(), workspace.to_path_buf(), log.clone());
    let run_id = tokio::task::spawn_blocking(move || crash_mid_tools(&crashed, &ws, log2))
        .await
        .unwrap();
    assert_eq!(*log.lock().unwrap(), ["a", "b"], "a finished, b hung, c never started");

    let store = backend.open().await;
    let before = store.load_run(&run_id).await.unwrap();
    assert_eq!(before.run.status, RunStatus::Running, "nobody marked it yet");
    let look = Look::default();
    let agent = Agent::builder()
        .model(ScriptedModel::new(script()))
        .tool(look.clone())
        .tool(Record {
            log: log.clone(),
            hang_on: None,
            started: Arc::default(),
        })
        .workspace(workspace)
        .store(store.clone())
        .build()
        .unwrap();
    let (events, outcome) = agent.resume(&run_id).await.unwrap().collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("recorded what could be recorded"));

    // a ran once (its journaled result was reused), b was not run again
    // (its effect is unknown), c never started so it ran now; the
    // read-only look simply ran again.
    assert_eq!(*log.lock().unwrap(), ["a", "b", "c"]);
    assert_eq!(*look.count.lock().unwrap(), 1);
    validate_history(&outcome.messages, false).unwrap();
    let result_of = |id: &str| {
        outcome
            .messages
            .iter()
            .find_map(|m| match m {
                Message::Tool {
                    tool_call_id, content, ..
                } if tool_call_id == id => Some(content.clone()),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(result_of("c_a"), "recorded a");
    assert!(result_of("c_b").contains("interrupted"), "{}", result_of("c_b"));
    assert!(result_of("c_b").contains("may or may not have taken effect"));
    assert_eq!(result_of("c_c"), "recorded c");
    assert_eq!(result_of("c_look"), "all quiet");

    // The event log goes on after the stored part, marked as resumed.
    assert_eq!(events[0].seq, before.last_seq + 1);
    assert!(matches!(
        events[0].kind,
        EventKind::LifecycleStart { resumed: true, .. }
    ));
    let stored = store.events(&run_id, 0).await.unwrap();
    assert!(stored.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    // Each call's result is told once — a's, logged before the crash, is
    // not told again when the resumed run takes it from the journal —
    // but for the read-only look, which ran again and is told again.
    let mut told: Vec<&str> = stored
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    told.sort_unstable();
    assert_eq!(told, ["c_a", "c_b", "c_c", "c_look", "c_look"]);
    assert!(matches!(stored.last().unwrap().kind, EventKind::LifecycleEnd { .. }));
    let after = store.load_run(&run_id).await.unwrap();
    assert_eq!(after.run.status, RunStatus::Done);
    assert_eq!(after.messages, outcome.messages, "the stored transcript is complete");
    assert_eq!(after.run.owner, loom::owner::this_process());
}

#[tokio::test]
async fn only_interrupted_runs_of_dead_owners_can_be_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let agent = Agent::builder()
        .model(ScriptedModel::new(vec![ScriptTurn {
            content: Some("hi".into()),
            ..ScriptTurn::default()
        }]))
        .workspace(dir.path())
        .store(store.clone())
        .build()
        .unwrap();
    let done = agent.run("hello").outcome().await;
    assert!(matches!(
        agent.resume(&done.run_id).await,
        Err(ResumeError::NotResumable { status: "DONE", .. })
    ));
    assert!(matches!(
        agent.resume("no-such-run").await,
        Err(ResumeError::Store(StoreError::NotFound(_)))
    ));

    // A run held by a live process (this one) is not taken over.
    let live = queued_record("live", "p", loom::owner::this_process());
    store.create_run(&live).await.unwrap();
    store.set_status("live", RunStatus::Running).await.unwrap();
    assert!(matches!(
        agent.resume("live").await,
        Err(ResumeError::StillRunning { .. })
    ));
    assert!(loom::recovery::recover_interrupted_runs(store.as_ref())
        .await
        .unwrap()
        .is_empty());

    let no_store = Agent::builder()
        .model(ScriptedModel::new(Vec::new()))
        .workspace(dir.path())
        .build()
        .unwrap();
    assert!(matches!(no_store.resume("live").await, Err(ResumeError::NoStore)));
}

#[tokio::test]
async fn a_session_continues_its_conversation_across_agents() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("loom.db");
    let answer = |text: &str| ScriptTurn {
        content: Some(text.into()),
        ..ScriptTurn::default()
    };
    let script = vec![answer("Nice to meet you, Ada."), answer("Your name is Ada.")];
    let agent = |store: Arc<SqliteStore>| {
        Agent::builder()
            .model(ScriptedModel::new(script.clone()))
            .workspace(dir.path())
            .store(store)
            .build()
            .unwrap()
    };
    let first = agent(Arc::new(SqliteStore::open(&db).unwrap()))
        .run(RunRequest {
            prompt: "My name is Ada.".into(),
            session_id: Some("s1".into()),
            ..RunRequest::default()
        })
        .outcome()
        .await;
    assert_eq!(first.content.as_deref(), Some("Nice to meet you, Ada."));

    // A new agent and store (as after a restart): the session goes on.
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    let second = agent(store.clone())
        .run(RunRequest {
            prompt: "What is my name?".into(),
            session_id: Some("s1".into()),
            ..RunRequest::default()
        })
        .outcome()
        .await;
    assert_eq!(second.content.as_deref(), Some("Your name is Ada."));
    let texts: Vec<(&str, &str)> = second.messages.iter().map(|m| (m.role(), m.content())).collect();
    assert_eq!(
        texts[1..],
        [
            ("user", "My name is Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "What is my name?"),
            ("assistant", "Your name is Ada."),
        ]
    );
    assert_eq!(texts.iter().filter(|(role, _)| *role == "system").count(), 1);
    let runs = store.session_runs("s1").await.unwrap();
    assert_eq!(runs.len(), 2);

    // An explicit history replaces the stored one.
    let fresh = agent(store.clone())
        .run(RunRequest {
            prompt: "Hello".into(),
            session_id: Some("s1".into()),
            history: Some(Vec::new()),
            ..RunRequest::default()
        })
        .outcome()
        .await;
    assert_eq!(fresh.messages.len(), 3);
}

#[tokio::test]
async fn the_store_shows_a_run_waiting_for_permission_and_its_end_before_the_events_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder()
        .model(ScriptedModel::new(vec![
            ScriptTurn {
                tool_calls: vec![ScriptToolCall {
                    name: "record".into(),
                    arguments: json!({"item": "x"}),
                    id: None,
                }],
                ..ScriptTurn::default()
            },
            ScriptTurn {
                content: Some("ok".into()),
                ..ScriptTurn::default()
            },
        ]))
        .tool(Record {
            log: log.clone(),
            hang_on: None,
            started: Arc::default(),
        })
        .permissions(loom::PermissionPolicy::new(loom::Decision::Ask))
        .workspace(dir.path())
        .store(store.clone())
        .build()
        .unwrap();
    let mut handle = agent.run("record x");
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            let stored = store.load_run(handle.run_id()).await.unwrap().run.status;
            assert_eq!(stored, RunStatus::WaitingPermission);
            assert_eq!(store.active_runs().await.unwrap().len(), 1);
            handle
                .respond_permission(request_id, loom::PermissionDecision::Allow)
                .unwrap();
        }
        if let EventKind::LifecycleEnd { .. } = &event.kind {
            // The end is recorded before it is announced.
            let stored = store.load_run(handle.run_id()).await.unwrap();
            assert_eq!(stored.run.status, RunStatus::Done);
            assert_eq!(stored.last_seq, event.seq);
        }
    }
    let outcome = handle.outcome().await;
    assert_eq!(outcome.status, RunStatus::Done);
    assert_eq!(*log.lock().unwrap(), ["x"]);
    assert_eq!(
        store.load_run(&outcome.run_id).await.unwrap().run.status,
        RunStatus::Done
    );
}

#[tokio::test]
async fn an_answer_checkpointed_before_the_crash_is_not_asked_for_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let record = queued_record("r1", "say hi", dead_owner());
    store.create_run(&record).await.unwrap();
    store.set_status("r1", RunStatus::Running).await.unwrap();
    let state = loom::TurnState::initial(5);
    store
        .checkpoint(&loom::Checkpoint {
            run_id: "r1",
            state: &loom::RunState::new(state, "say hi"),
            new_messages: &[Message::system("s"), Message::user("say hi"), Message::assistant("hi")],
            replaced_history: None,
            events: &[],
        })
        .await
        .unwrap();
    // An empty script: any model call would fail the run.
    let agent = Agent::builder()
        .model(ScriptedModel::new(Vec::new()))
        .workspace(dir.path())
        .store(store.clone())
        .build()
        .unwrap();
    let outcome = agent.resume("r1").await.unwrap().outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("hi"));
    assert_eq!(outcome.metrics.llm_calls, 0);
    assert_eq!(store.load_run("r1").await.unwrap().run.content.as_deref(), Some("hi"));
}

#[tokio::test]
async fn a_run_whose_process_died_before_it_started_resumes_from_its_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    // Recorded by a process that died before running it (or queued by a
    // worker that is gone): no checkpoint, no events.
    let record = queued_record("q1", "say hi", dead_owner());
    store.create_run(&record).await.unwrap();
    assert_eq!(
        loom::recovery::recover_interrupted_runs(store.as_ref()).await.unwrap(),
        ["q1"]
    );
    assert_eq!(store.load_run("q1").await.unwrap().run.status, RunStatus::Interrupted);

    let hi = || ScriptTurn {
        content: Some("hi".into()),
        ..ScriptTurn::default()
    };
    let agent = Agent::builder()
        .model(ScriptedModel::new(vec![hi(), hi()]))
        .workspace(dir.path())
        .store(store.clone())
        .build()
        .unwrap();
    let outcome = agent.resume("q1").await.unwrap().outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(outcome.content.as_deref(), Some("hi"));
    let stored = store.load_run("q1").await.unwrap();
    assert!(matches!(&stored.messages[1], Message::User { content } if content == "say hi"));
    assert_eq!(stored.run.status, RunStatus::Done);

    // Without the recovery pass, resume itself takes a dead owner's queued run.
    let mut second = record.clone();
    second.run_id = "q2".into();
    store.create_run(&second).await.unwrap();
    let outcome = agent.resume("q2").await.unwrap().outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
}

/// An agent whose model calls `record` once for each of `items` in one
/// turn, each call asked about first, on `store`.
fn asking_agent_for(
    items: &[&str],
    dir: &std::path::Path,
    store: Arc<SqliteStore>,
    log: Arc<Mutex<Vec<String>>>,
) -> Agent {
    let calls = items
        .iter()
        .map(|item| ScriptToolCall {
            name: "record".into(),
            arguments: json!({ "item": item }),
            id: Some(format!("c_{item}")),
        })
        .collect();
    Agent::builder()
        .model(ScriptedModel::new(vec![
            ScriptTurn {
                tool_calls: calls,
                ..ScriptTurn::default()
            },
            ScriptTurn {
                content: Some("ok".into()),
                ..ScriptTurn::default()
            },
        ]))
        .tool(Record {
            log,
            hang_on: None,
            started: Arc::default(),
        })
        .permissions(loom::PermissionPolicy::new(loom::Decision::Ask))
        // An answer lost would deny the call after this, not hang the test.
        .permission_timeout(Some(std::time::Duration::from_secs(5)))
        .workspace(dir)
        .store(store)
        .build()
        .unwrap()
}

/// An agent whose `record` of x asks a person first, on `store`.
fn asking_agent(dir: &std::path::Path, store: Arc<SqliteStore>, log: Arc<Mutex<Vec<String>>>) -> Agent {
    asking_agent_for(&["x"], dir, store, log)
}

#[tokio::test]
async fn an_ask_left_open_by_an_interrupted_run_is_shown_and_answered_before_the_run_asks_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let agent = asking_agent(dir.path(), store.clone(), log.clone());
    let mut handle = agent.run("record x");
    let controller = handle.controller();
    let mut asked = None;
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            // The run shows the ask it waits on, the moment it is visible.
            let state = controller.state();
            assert_eq!(state.status, RunStatus::WaitingPermission);
            assert_eq!(state.pending_asks[0].request_id, *request_id);
            assert_eq!(state.last_seq, event.seq);
            asked = Some((request_id.clone(), event.seq));
            controller
                .send(loom::Control::Interrupt {
                    reason: "the process goes away".into(),
                })
                .unwrap();
        }
    }
    let (request_id, asked_at) = asked.expect("the run asked");
    assert_eq!(handle.outcome().await.status, RunStatus::Interrupted);
    assert!(log.lock().unwrap().is_empty(), "nothing ran unanswered");

    // Another process: the run is ready to resume, not taken yet.
    let agent = asking_agent(dir.path(), store.clone(), log.clone());
    let resuming = agent.prepare_resume(&handle_run_id(&store).await).await.unwrap();
    let controller = resuming.controller();
    let state = controller.state();
    assert_eq!(state.status, RunStatus::Queued);
    assert_eq!(state.pending_asks.len(), 1, "{state:?}");
    assert_eq!(
        (state.pending_asks[0].request_id.as_str(), state.pending_asks[0].seq),
        (request_id.as_str(), asked_at)
    );
    assert_eq!(
        store.load_run(resuming.run_id()).await.unwrap().run.status,
        RunStatus::Interrupted,
        "not taken over before it starts"
    );
    // Answered before the resumed run asks again: kept for it, once.
    controller
        .respond_permission(&request_id, loom::PermissionDecision::Allow)
        .unwrap();
    assert!(
        controller.state().pending_asks.is_empty(),
        "answered: nobody is asked any more"
    );
    assert!(controller
        .respond_permission(&request_id, loom::PermissionDecision::Deny)
        .is_err());
    assert!(controller
        .respond_permission("perm_unknown", loom::PermissionDecision::Allow)
        .is_err());

    let (events, outcome) = resuming.start().await.unwrap().collect().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(*log.lock().unwrap(), ["x"], "the early answer let the call run");
    // The interrupt told the call as not started; it ran once, after the
    // resume, and counts once.
    assert_eq!(
        (outcome.metrics.tool_calls, outcome.metrics.tool_failures),
        (1, 0),
        "{:?}",
        outcome.metrics
    );
    let resolved: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::PermissionResolved {
                request_id, decision, ..
            } => Some((request_id.clone(), *decision)),
            _ => None,
        })
        .collect();
    assert_eq!(resolved, [(request_id, loom::PermissionDecision::Allow)]);
    assert!(events.first().unwrap().seq > asked_at, "the log continues");
    let state = controller.state();
    assert_eq!((state.status, state.pending_asks.len()), (RunStatus::Done, 0));
    assert_eq!(state.last_seq, events.last().unwrap().seq);
}

#[tokio::test]
async fn an_answer_given_before_an_interrupt_cut_its_call_off_is_not_asked_for_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut handle = asking_agent_for(&["x", "y"], dir.path(), store.clone(), log.clone()).run("record x and y");
    let controller = handle.controller();
    let mut asks = Vec::new();
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            assert!(controller.is_asking(), "a person is waited for");
            asks.push(request_id.clone());
            if asks.len() == 1 {
                // x is allowed; the run stops at y's question, before x ran.
                controller
                    .respond_permission(request_id, loom::PermissionDecision::Allow)
                    .unwrap();
                assert!(!controller.is_asking(), "answered: nobody is waited for");
            } else {
                controller.interrupt("the process goes away");
            }
        }
    }
    assert_eq!(handle.outcome().await.status, RunStatus::Interrupted);
    assert_eq!(asks.len(), 2);
    assert!(log.lock().unwrap().is_empty(), "nothing ran before the interrupt");

    // Another process: only y's question is open; x's was decided.
    let agent = asking_agent_for(&["x", "y"], dir.path(), store.clone(), log.clone());
    let resuming = agent.prepare_resume(&handle_run_id(&store).await).await.unwrap();
    let controller = resuming.controller();
    let open: Vec<String> = controller
        .state()
        .pending_asks
        .iter()
        .map(|ask| ask.request_id.clone())
        .collect();
    assert_eq!(open, [asks[1].clone()]);
    assert!(!controller.is_asking(), "shown, but not asked again yet");

    let mut handle = resuming.start().await.unwrap();
    let mut asked_again = Vec::new();
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            asked_again.push(request_id.clone());
            if *request_id == asks[1] {
                controller
                    .respond_permission(request_id, loom::PermissionDecision::Allow)
                    .unwrap();
            }
        }
    }
    let outcome = handle.outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    // Had x waited for a second answer, nobody would have given it: it
    // would have been denied at the ask's timeout, and never recorded.
    assert_eq!(*log.lock().unwrap(), ["x", "y"]);
    // x's question and answer are in the log already: not shown again
    // (a terminal would put it to the person anew).
    assert_eq!(asked_again, [asks[1].clone()]);
}

/// The one run in `store`.
async fn handle_run_id(store: &SqliteStore) -> String {
    store.list_runs(1).await.unwrap()[0].run_id.clone()
}

/// Runs `handle` until it asks, then interrupts it; returns the ask's id.
async fn interrupt_at_the_ask(mut handle: loom::RunHandle) -> String {
    let controller = handle.controller();
    let mut asked = None;
    while let Some(event) = handle.next_event().await {
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            asked = Some(request_id.clone());
            controller.interrupt("the process goes away");
        }
    }
    assert_eq!(handle.outcome().await.status, RunStatus::Interrupted);
    asked.expect("the run asked")
}

#[tokio::test]
async fn a_run_made_ready_to_resume_that_went_on_elsewhere_meanwhile_is_handed_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("loom.db")).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let agent = asking_agent(dir.path(), store.clone(), log.clone());
    let request_id = interrupt_at_the_ask(agent.run("record x")).await;
    let run_id = handle_run_id(&store).await;

    let waiting = asking_agent(dir.path(), store.clone(), log.clone())
        .prepare_resume(&run_id)
        .await
        .unwrap();
    // Meanwhile another process resumes it, and is interrupted in turn.
    let elsewhere = asking_agent(dir.path(), store.clone(), log.clone());
    let asked_again = interrupt_at_the_ask(elsewhere.resume(&run_id).await.unwrap()).await;
    assert_eq!(asked_again, request_id, "the same ask, under the same id");
    let seqs_before = store.events(&run_id, 0).await.unwrap().len();

    let refused = waiting.start().await.unwrap_err();
    assert!(matches!(refused, ResumeError::Changed { .. }), "{refused:?}");
    assert_eq!(
        store.load_run(&run_id).await.unwrap().run.status,
        RunStatus::Interrupted,
        "handed back for the next one to make ready"
    );
    assert_eq!(
        store.events(&run_id, 0).await.unwrap().len(),
        seqs_before,
        "nothing written"
    );

    let ready = asking_agent(dir.path(), store.clone(), log.clone())
        .prepare_resume(&run_id)
        .await
        .unwrap();
    ready
        .controller()
        .respond_permission(&request_id, loom::PermissionDecision::Allow)
        .unwrap();
    let outcome = ready.start().await.unwrap().outcome().await;
    assert_eq!(outcome.status, RunStatus::Done, "{:?}", outcome.stop_reason);
    assert_eq!(*log.lock().unwrap(), ["x"]);
    let seqs: Vec<u64> = store.events(&run_id, 0).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "one log, no seq twice"
    );
}
