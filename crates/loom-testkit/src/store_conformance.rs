//! What every `Store` must do, whatever keeps it: the status machine,
//! checkpoints, the journal, events, queued runs and idempotency keys. Each
//! backend's tests call these on a fresh store of its own (docs/library.md,
//! stores).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use loom_core::{
    Checkpoint, Event, EventKind, KeyedRequest, Message, QueuedRun, RunMetrics, RunQuery, RunRecord, RunState,
    RunStatus, Store, StoreError, ToolCall, ToolResult, ToolStatus, TurnState,
};
use serde_json::json;

pub fn record(run_id: &str) -> RunRecord {
    RunRecord {
        owner: "test".into(),
        ..RunRecord::new(run_id, "session-1", "do it", "scripted:x", RunStatus::Queued, 1)
    }
}

pub fn event(seq: u64) -> Event {
    Event {
        run_id: "r".into(),
        turn_id: "t".into(),
        parent_turn_id: None,
        depth: 0,
        parent_run_id: None,
        seq,
        ts: "2026-11-22T00:00:00.000Z".into(),
        kind: EventKind::IterationStart { iteration: seq as u32 },
    }
}

use RunStatus::*;
const ALL: [RunStatus; 8] = [
    Queued,
    Running,
    WaitingPermission,
    Done,
    Error,
    Canceled,
    Timeout,
    Interrupted,
];

/// The transitions of docs/architecture.md, written out by hand so the test does not just mirror the code.
const LEGAL: &[(RunStatus, RunStatus)] = &[
    (Queued, Running),
    (Queued, Canceled),
    (Queued, Error),
    (Queued, Interrupted),
    (Running, WaitingPermission),
    (Running, Done),
    (Running, Error),
    (Running, Canceled),
    (Running, Timeout),
    (Running, Interrupted),
    (WaitingPermission, Running),
    (WaitingPermission, Done),
    (WaitingPermission, Error),
    (WaitingPermission, Canceled),
    (WaitingPermission, Timeout),
    (WaitingPermission, Interrupted),
    (Interrupted, Running),
    (Interrupted, Canceled),
    (Interrupted, Error),
];

fn path_to(status: RunStatus) -> Vec<RunStatus> {
    match status {
        Queued => vec![],
        Running => vec![Running],
        WaitingPermission => vec![Running, WaitingPermission],
        Done => vec![Running, Done],
        Error => vec![Error],
        Canceled => vec![Canceled],
        Timeout => vec![Running, Timeout],
        Interrupted => vec![Running, Interrupted],
    }
}

/// Every transition of docs/architecture.md is taken, every other refused (unchanged).
pub async fn every_legal_and_illegal_transition(store: &dyn Store) {
    let mut count = 0;
    for from in ALL {
        for to in ALL {
            let id = format!("run-{count}");
            count += 1;
            store.create_run(&record(&id)).await.unwrap();
            for step in path_to(from) {
                store.set_status(&id, step).await.unwrap();
            }
            let result = store.set_status(&id, to).await;
            let legal = LEGAL.contains(&(from, to));
            match (&result, legal) {
                (Ok(()), true) => assert_eq!(store.load_run(&id).await.unwrap().run.status, to),
                (Err(StoreError::InvalidState(err)), false) => {
                    assert_eq!((err.from, err.to), (from, to));
                    assert_eq!(
                        store.load_run(&id).await.unwrap().run.status,
                        from,
                        "refused means unchanged"
                    );
                }
                _ => panic!("{from:?} → {to:?}: {result:?}, expected legal={legal}"),
            }
        }
    }
    assert_eq!(count, 64);
}

/// What a run writes comes back as written.
pub async fn checkpoints_journal_and_events_round_trip(store: &dyn Store) {
    store.create_run(&record("r")).await.unwrap();
    store.set_status("r", Running).await.unwrap();
    let state = TurnState::initial(10).next_turn(false);
    let call = ToolCall {
        id: "c1".into(),
        name: "write_file".into(),
        arguments: json!({"path": "a"}),
    };
    let first = [
        Message::system("s"),
        Message::user("q"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![call.clone()],
        },
    ];
    store.journal_intent("r", &call).await.unwrap();
    let snapshot = store.load_run("r").await.unwrap();
    assert_eq!(snapshot.journal.len(), 1);
    assert!(snapshot.journal[0].result.is_none(), "an intent without a result");
    store
        .journal_result("r", &ToolResult::new("c1", "write_file", ToolStatus::Success, "ok"))
        .await
        .unwrap();
    let metrics = RunMetrics {
        iterations: 1,
        ..RunMetrics::default()
    };
    store
        .checkpoint(&Checkpoint {
            run_id: "r",
            state: &RunState::new(state.clone(), "q").with_metrics(metrics.clone()),
            new_messages: &first,
            replaced_history: None,
            events: &[event(1), event(2)],
        })
        .await
        .unwrap();
    let more = [Message::tool("c1", "write_file", "ok")];
    store
        .checkpoint(&Checkpoint {
            run_id: "r",
            state: &RunState::new(state.next_turn(false), "q").with_metrics(metrics.clone()),
            new_messages: &more,
            replaced_history: None,
            events: &[event(3)],
        })
        .await
        .unwrap();
    let snapshot = store.load_run("r").await.unwrap();
    assert_eq!(snapshot.messages.len(), 4);
    assert_eq!(snapshot.messages[3], more[0]);
    assert_eq!(snapshot.next_turn().unwrap().turn_counter(), 2);
    assert_eq!(snapshot.journal[0].result.as_ref().unwrap().content, "ok");
    assert_eq!(snapshot.run.metrics.iterations, 1);
    assert_eq!(
        store
            .events("r", 1)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );

    // Compression replaces the stored history.
    let compressed = [
        Message::system("s"),
        Message::system("[compressed history] …"),
        Message::user("q"),
    ];
    store
        .checkpoint(&Checkpoint {
            run_id: "r",
            state: &RunState::new(state.clone(), "q").with_metrics(metrics.clone()),
            new_messages: &[],
            replaced_history: Some(&compressed),
            events: &[],
        })
        .await
        .unwrap();
    assert_eq!(store.load_run("r").await.unwrap().messages, compressed.to_vec());

    store
        .finish_run("r", Done, Some("answer"), &metrics, &[event(4)])
        .await
        .unwrap();
    let done = store.load_run("r").await.unwrap().run;
    assert_eq!((done.status, done.content.as_deref()), (Done, Some("answer")));
    assert!(done.ended_ms.is_some());
    assert!(
        matches!(store.set_status("r", Running).await, Err(StoreError::InvalidState(_))),
        "terminal is final"
    );
    assert_eq!(store.list_runs(10).await.unwrap()[0].run_id, "r");
}

/// Unknown runs are `NotFound`.
pub async fn unknown_runs_are_typed_errors(store: &dyn Store) {
    assert!(matches!(store.load_run("nope").await, Err(StoreError::NotFound(id)) if id == "nope"));
    assert!(matches!(
        store.set_status("nope", Running).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(store.events("nope", 0).await, Err(StoreError::NotFound(_))));
}

/// `last_seqs` answers in the order asked.
pub async fn last_seqs_come_in_the_order_asked(store: &dyn Store) {
    for id in ["a", "b"] {
        store.create_run(&record(id)).await.unwrap();
    }
    store.set_status("a", Running).await.unwrap();
    let events: Vec<Event> = (1..=3).map(event).collect();
    store
        .finish_run("a", Done, Some("answer"), &RunMetrics::default(), &events)
        .await
        .unwrap();
    let seqs = store
        .last_seqs(&["b".to_string(), "a".to_string(), "unknown".to_string()])
        .await
        .unwrap();
    assert_eq!(seqs, vec![0, 3, 0]);
}

/// A queued run is stored with its key and taken over by whoever starts it.
pub async fn a_queued_run_is_taken_over_by_whoever_starts_it(store: &dyn Store) {
    let mut queued = record("q1");
    queued.owner = String::new();
    queued.principal = Some("alice".into());
    let run = QueuedRun {
        record: queued.clone(),
        request: r#"{"prompt":"do it"}"#.into(),
    };
    let keyed = KeyedRequest {
        digest: 7,
        run_id: "q1".into(),
    };
    store.queue_run(&run, Some(("order-1", &keyed))).await.unwrap();
    // The run and its key are stored together, the run with the time it
    // was accepted.
    let accepted = QueuedRun {
        record: RunRecord {
            accepted_ms: Some(1),
            ..queued.clone()
        },
        ..run.clone()
    };
    assert_eq!(store.queued_runs().await.unwrap(), vec![accepted]);
    assert_eq!(store.remembered_request("alice", "order-1").await.unwrap(), Some(keyed));
    // Queued twice is an error; so is a second queued run of the same id.
    assert!(store.queue_run(&run, None).await.is_err());

    // Whoever starts it takes the record over: RUNNING, with its owner and
    // its start time; the time it was accepted stays.
    let mut starting = queued.clone();
    starting.status = RunStatus::Running;
    starting.owner = "worker-1".into();
    starting.started_ms = 99;
    store.create_run(&starting).await.unwrap();
    let stored = store.load_run("q1").await.unwrap().run;
    assert_eq!(
        (
            stored.status,
            stored.owner.as_str(),
            stored.started_ms,
            stored.accepted_ms
        ),
        (RunStatus::Running, "worker-1", 99, Some(1))
    );
    // Lists order it by its start now, and find it by its new status.
    let mut older = record("older");
    older.started_ms = 50;
    store.create_run(&older).await.unwrap();
    let listed: Vec<String> = store
        .list_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|run| run.run_id)
        .collect();
    assert_eq!(listed, ["q1", "older"]);
    let running = store
        .query_runs(&RunQuery {
            status: Some(RunStatus::Running),
            before: Some((100, String::new())),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        running.iter().map(|run| run.run_id.as_str()).collect::<Vec<_>>(),
        ["q1"]
    );
    let session: Vec<String> = store
        .session_runs("session-1")
        .await
        .unwrap()
        .into_iter()
        .map(|run| run.run_id)
        .collect();
    assert_eq!(session, ["older", "q1"], "oldest first, by start");
    assert!(store.queued_runs().await.unwrap().is_empty());
    // Its request stays with it (what a resume after a restart may use).
    assert_eq!(store.run_request("q1").await.unwrap(), Some(run.request.clone()));
    // It is not queued any more: a second start is refused.
    assert!(store.create_run(&starting).await.is_err());
    // A run nobody queued cannot be taken over either.
    store.create_run(&record("plain")).await.unwrap();
    let mut again = record("plain");
    again.status = RunStatus::Running;
    assert!(store.create_run(&again).await.is_err());
    assert_eq!(store.run_request("plain").await.unwrap(), None);
    assert!(matches!(
        store.run_request("nobody").await,
        Err(StoreError::NotFound(_))
    ));
}

/// An idempotency key keeps its first answer, per owner.
pub async fn request_keys_keep_their_first_answer(store: &dyn Store) {
    let first = KeyedRequest {
        digest: u64::MAX - 7, // the high bit set: read back the same
        run_id: "run-1".into(),
    };
    assert_eq!(store.remembered_request("alice", "k").await.unwrap(), None);
    store.remember_request("alice", "k", &first).await.unwrap();
    let later = KeyedRequest {
        digest: 1,
        run_id: "run-2".into(),
    };
    store.remember_request("alice", "k", &later).await.unwrap();
    assert_eq!(store.remembered_request("alice", "k").await.unwrap(), Some(first));
    // Keys are per owner.
    assert_eq!(store.remembered_request("bob", "k").await.unwrap(), None);
}

/// Listings: active runs, a session's and a parent's runs, queries by
/// principal, status and session, newest first, page by page.
pub async fn runs_are_listed_and_queried(store: &dyn Store) {
    let mut runs = Vec::new();
    for (index, (session, principal)) in [("s1", "alice"), ("s1", "alice"), ("s2", "bob"), ("s3", "alice")]
        .into_iter()
        .enumerate()
    {
        let mut run = RunRecord {
            owner: "test".into(),
            ..RunRecord::new(
                format!("l{index}"),
                session,
                "p",
                "scripted:x",
                RunStatus::Running,
                10 + index as u64,
            )
        };
        run.principal = Some(principal.into());
        if index == 3 {
            run.parent = Some(loom_core::ParentLink {
                run_id: "l0".into(),
                turn_id: "t1".into(),
            });
        }
        store.create_run(&run).await.unwrap();
        runs.push(run);
    }
    store
        .finish_run("l1", RunStatus::Done, Some("a"), &RunMetrics::default(), &[])
        .await
        .unwrap();
    let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|run| run.run_id).collect::<Vec<_>>();
    assert_eq!(ids(store.session_runs("s1").await.unwrap()), ["l0", "l1"]);
    assert_eq!(ids(store.child_runs("l0").await.unwrap()), ["l3"]);
    let mut active = ids(store.active_runs().await.unwrap());
    active.sort();
    assert_eq!(active, ["l0", "l2", "l3"]);
    assert_eq!(ids(store.list_runs(2).await.unwrap()), ["l3", "l2"]);
    let query = |principal: Option<&str>, status: Option<RunStatus>, session: Option<&str>| loom_core::RunQuery {
        principal: principal.map(str::to_string),
        status,
        session_id: session.map(str::to_string),
        before: None,
        limit: 10,
        owned: false,
    };
    assert_eq!(
        ids(store.query_runs(&query(Some("alice"), None, None)).await.unwrap()),
        ["l3", "l1", "l0"]
    );
    assert_eq!(
        ids(store
            .query_runs(&query(None, Some(RunStatus::Done), None))
            .await
            .unwrap()),
        ["l1"]
    );
    assert_eq!(
        ids(store.query_runs(&query(None, None, Some("s2"))).await.unwrap()),
        ["l2"]
    );
    // Only runs some token owns: a run of the command line is not.
    store
        .create_run(&RunRecord {
            owner: "test".into(),
            ..RunRecord::new("cli", "s9", "p", "scripted:x", RunStatus::Done, 100)
        })
        .await
        .unwrap();
    let mut owned = query(None, None, None);
    owned.owned = true;
    assert_eq!(ids(store.query_runs(&owned).await.unwrap()), ["l3", "l2", "l1", "l0"]);
    assert_eq!(ids(store.query_runs(&query(None, None, None)).await.unwrap())[0], "cli");
    // The next page starts after the last run of the one before.
    let mut page = query(Some("alice"), None, None);
    page.limit = 2;
    let first = store.query_runs(&page).await.unwrap();
    assert_eq!(ids(first.clone()), ["l3", "l1"]);
    let last = first.last().unwrap();
    page.before = Some((last.started_ms, last.run_id.clone()));
    assert_eq!(ids(store.query_runs(&page).await.unwrap()), ["l0"]);
    // A dead owner's runs are marked interrupted (only by that owner's
    // name), then taken over once.
    assert!(!store.mark_interrupted("l0", "someone-else").await.unwrap());
    assert!(store.mark_interrupted("l0", "test").await.unwrap());
    assert_eq!(store.load_run("l0").await.unwrap().run.status, RunStatus::Interrupted);
    store.reclaim_run("l0", "worker-2").await.unwrap();
    let taken = store.load_run("l0").await.unwrap().run;
    assert_eq!((taken.status, taken.owner.as_str()), (RunStatus::Running, "worker-2"));
    assert!(matches!(
        store.reclaim_run("l0", "worker-3").await,
        Err(StoreError::InvalidState(_))
    ));
    assert!(matches!(
        store.reclaim_run("nobody", "worker-3").await,
        Err(StoreError::NotFound(_))
    ));
}

/// Events appended twice (a retried write) are kept once, in order, and
/// read page by page.
pub async fn events_are_kept_once_and_read_in_pages(store: &dyn Store) {
    store.create_run(&record("e")).await.unwrap();
    let events: Vec<Event> = (1..=5).map(event).collect();
    store.append_events("e", &events[..3]).await.unwrap();
    store.append_events("e", &events[2..]).await.unwrap();
    let seqs = |events: Vec<Event>| events.into_iter().map(|event| event.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.events("e", 0).await.unwrap()), [1, 2, 3, 4, 5]);
    assert_eq!(seqs(store.events_page("e", 1, 2).await.unwrap()), [2, 3]);
    assert_eq!(seqs(store.events_page("e", 5, 10).await.unwrap()), Vec::<u64>::new());
    assert_eq!(store.load_run("e").await.unwrap().last_seq, 5);
    assert!(
        store.append_events("nobody", &events).await.is_err(),
        "no events without a run"
    );
    // A cursor past every seq (a client's last-event id at its largest) reads nothing.
    assert!(store.events("e", u64::MAX).await.unwrap().is_empty());
}

/// A call journaled again starts without the result of its first time.
pub async fn a_call_journaled_again_has_no_result_yet(store: &dyn Store) {
    store.create_run(&record("j")).await.unwrap();
    let call = ToolCall {
        id: "c1".into(),
        name: "write_file".into(),
        arguments: json!({"path": "a"}),
    };
    store.journal_intent("j", &call).await.unwrap();
    store
        .journal_result("j", &ToolResult::new("c1", "write_file", ToolStatus::Success, "ok"))
        .await
        .unwrap();
    store.journal_intent("j", &call).await.unwrap();
    let journal = store.load_run("j").await.unwrap().journal;
    assert_eq!(journal.len(), 1);
    assert!(journal[0].result.is_none(), "{journal:?}");
    // A result for a call never journaled is not kept.
    store
        .journal_result("j", &ToolResult::new("c9", "write_file", ToolStatus::Success, "ok"))
        .await
        .unwrap();
    assert_eq!(store.load_run("j").await.unwrap().journal.len(), 1);
}

/// Optional fields that are empty come back empty, not absent.
pub async fn empty_optional_fields_are_kept(store: &dyn Store) {
    let mut run = record("empty");
    run.workspace = Some(String::new());
    run.principal = Some(String::new());
    store.create_run(&run).await.unwrap();
    let stored = store.load_run("empty").await.unwrap().run;
    assert_eq!(
        (stored.workspace, stored.principal),
        (Some(String::new()), Some(String::new()))
    );
}

/// An empty owner is an owner like any other for the compare-and-set of
/// `mark_interrupted`.
pub async fn an_empty_owner_is_compared_like_any_other(store: &dyn Store) {
    let mut run = record("o");
    run.owner = String::new();
    store.create_run(&run).await.unwrap();
    store.set_status("o", RunStatus::Running).await.unwrap();
    assert!(!store.mark_interrupted("o", "someone").await.unwrap());
    assert!(store.mark_interrupted("o", "").await.unwrap());
}

/// The audit trail keeps records in the order appended, whole, and reads
/// the newest ones matching a token and a time, oldest first.
pub async fn audit_records_are_kept_in_order(store: &dyn Store) {
    use loom_core::{AuditEntry, AuditQuery};
    let entry = |time_ms: u64, token: Option<&str>, action: &str| AuditEntry {
        time_ms,
        action: action.into(),
        token: token.map(str::to_string),
        address: Some("127.0.0.1:4242".into()),
        target: Some(format!("run-{time_ms}")),
        outcome: "ok".into(),
        detail: json!({"decision": "allow", "always": true}),
    };
    assert!(store
        .audit_entries(&AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap()
        .is_empty());
    // Appended out of time order (a clock that jumped back): kept as appended.
    let written = [
        entry(1_000, Some("alice"), "agent.run"),
        entry(3_000, Some("bob"), "agent.cancel"),
        entry(2_000, None, "token.refused"),
        entry(4_000, Some("alice"), "permission.respond"),
    ];
    for record in &written {
        store.append_audit(record).await.unwrap();
    }
    let all = store
        .audit_entries(&AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(all, written);
    let alice = AuditQuery {
        token: Some("alice".into()),
        limit: 10,
        ..AuditQuery::default()
    };
    let actions: Vec<String> = store
        .audit_entries(&alice)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(actions, ["agent.run", "permission.respond"]);
    let newest_two = AuditQuery {
        limit: 2,
        ..AuditQuery::default()
    };
    assert_eq!(store.audit_entries(&newest_two).await.unwrap(), written[2..]);
    let since = AuditQuery {
        since_ms: Some(2_500),
        limit: 10,
        ..AuditQuery::default()
    };
    let times: Vec<u64> = store
        .audit_entries(&since)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.time_ms)
        .collect();
    assert_eq!(times, [3_000, 4_000]);
}
