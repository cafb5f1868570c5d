//! `RedisStore` against a real `redis-server` (Debian's, started per test
//! on a free port): the same behaviour every store must have
//! (`loom_testkit::store_conformance`), and what only Redis shows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use loom_core::{RunIndex, RunLog};
use loom_redis::RedisStore;
use loom_testkit::redis_server::RedisServer;
use loom_testkit::store_conformance as conformance;

/// A server of the test's own, and a store on it.
async fn store() -> (RedisStore, RedisServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = RedisStore::connect(&server.url(0)).await.unwrap();
    (store, server, dir)
}

#[tokio::test]
async fn every_legal_and_illegal_transition() {
    let (store, _server, _dir) = store().await;
    conformance::every_legal_and_illegal_transition(&store).await;
}

#[tokio::test]
async fn checkpoints_journal_and_events_round_trip() {
    let (store, _server, _dir) = store().await;
    conformance::checkpoints_journal_and_events_round_trip(&store).await;
}

#[tokio::test]
async fn unknown_runs_are_typed_errors() {
    let (store, _server, _dir) = store().await;
    conformance::unknown_runs_are_typed_errors(&store).await;
}

#[tokio::test]
async fn last_seqs_come_in_the_order_asked() {
    let (store, _server, _dir) = store().await;
    conformance::last_seqs_come_in_the_order_asked(&store).await;
}

#[tokio::test]
async fn a_queued_run_is_taken_over_by_whoever_starts_it() {
    let (store, _server, _dir) = store().await;
    conformance::a_queued_run_is_taken_over_by_whoever_starts_it(&store).await;
}

#[tokio::test]
async fn request_keys_keep_their_first_answer() {
    let (store, _server, _dir) = store().await;
    conformance::request_keys_keep_their_first_answer(&store).await;
}

#[tokio::test]
async fn runs_are_listed_and_queried() {
    let (store, _server, _dir) = store().await;
    conformance::runs_are_listed_and_queried(&store).await;
}

#[tokio::test]
async fn audit_records_are_kept_in_order() {
    let (store, _server, _dir) = store().await;
    conformance::audit_records_are_kept_in_order(&store).await;
}

#[tokio::test]
async fn events_are_kept_once_and_read_in_pages() {
    let (store, _server, _dir) = store().await;
    conformance::events_are_kept_once_and_read_in_pages(&store).await;
}

#[tokio::test]
async fn a_call_journaled_again_has_no_result_yet() {
    let (store, _server, _dir) = store().await;
    conformance::a_call_journaled_again_has_no_result_yet(&store).await;
}

#[tokio::test]
async fn empty_optional_fields_are_kept() {
    let (store, _server, _dir) = store().await;
    conformance::empty_optional_fields_are_kept(&store).await;
}

#[tokio::test]
async fn an_empty_owner_is_compared_like_any_other() {
    let (store, _server, _dir) = store().await;
    conformance::an_empty_owner_is_compared_like_any_other(&store).await;
}

/// A run id with a `:` names no other run's keys.
#[tokio::test]
async fn run_ids_with_colons_keep_to_their_own_keys() {
    let (store, _server, _dir) = store().await;
    store.create_run(&conformance::record("x")).await.unwrap();
    store.create_run(&conformance::record("x:journal")).await.unwrap();
    store.create_run(&conformance::record("journal:x")).await.unwrap();
    let events: Vec<_> = (1..=2).map(conformance::event).collect();
    store.append_events("journal:x", &events).await.unwrap();
    for id in ["x", "x:journal"] {
        let snapshot = store.load_run(id).await.unwrap();
        assert_eq!((snapshot.last_seq, snapshot.journal.len()), (0, 0), "{id}");
    }
    assert_eq!(store.load_run("journal:x").await.unwrap().last_seq, 2);
}

/// Two Looms sharing one database keep apart by their prefixes.
#[tokio::test]
async fn prefixes_keep_two_stores_apart() {
    let (first, server, _dir) = store().await;
    let second = RedisStore::connect_with_prefix(&server.url(0), "other:").await.unwrap();
    first.create_run(&conformance::record("shared-id")).await.unwrap();
    assert!(second.load_run("shared-id").await.is_err());
    second.create_run(&conformance::record("shared-id")).await.unwrap();
    assert_eq!(first.list_runs(10).await.unwrap().len(), 1);
}

/// What Redis acknowledged is there after Redis is killed (SIGKILL) and
/// started again from its append-only file (`appendfsync always`).
#[tokio::test]
async fn acknowledged_writes_survive_a_killed_redis() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap();
    let url = server.url(0);
    let store = RedisStore::connect(&url).await.unwrap();
    store.create_run(&conformance::record("kept")).await.unwrap();
    let events: Vec<_> = (1..=3).map(conformance::event).collect();
    store.append_events("kept", &events).await.unwrap();
    drop(store);
    drop(server); // SIGKILL
    let server = RedisServer::start(dir.path()).unwrap();
    let store = RedisStore::connect(&server.url(0)).await.unwrap();
    let snapshot = store.load_run("kept").await.unwrap();
    assert_eq!(snapshot.last_seq, 3);
    assert_eq!(store.events("kept", 0).await.unwrap().len(), 3);
}

/// The runs' events go to Redis together: many runs appending at once each
/// hear of their own write, in order, and a Redis that forgot its scripts
/// (restarted, `SCRIPT FLUSH`) is given them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_of_many_runs_at_once_are_each_answered() {
    use std::sync::Arc;
    let (store, server, _dir) = store().await;
    let store = Arc::new(store);
    const RUNS: usize = 50;
    const GROUPS: u64 = 20;
    for i in 0..RUNS {
        store.create_run(&conformance::record(&format!("a{i}"))).await.unwrap();
    }
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let store = store.clone();
        runs.push(tokio::spawn(async move {
            let run_id: Arc<str> = format!("a{i}").into();
            for group in 0..GROUPS {
                let events: Vec<_> = (1..=3).map(|n| conformance::event(group * 3 + n)).collect();
                let (done, answer) = tokio::sync::oneshot::channel();
                Arc::clone(&store).append_events_then(
                    run_id.clone(),
                    events,
                    Box::new(move |events, result| {
                        let _ = done.send((events.len(), result));
                    }),
                );
                let (handed_back, result) = answer.await.unwrap();
                assert_eq!(handed_back, 3);
                result.unwrap();
            }
        }));
    }
    for run in runs {
        run.await.unwrap();
    }
    for i in [0, RUNS - 1] {
        let seqs: Vec<u64> = store
            .events(&format!("a{i}"), 0)
            .await
            .unwrap()
            .iter()
            .map(|event| event.seq)
            .collect();
        assert_eq!(seqs, (1..=GROUPS * 3).collect::<Vec<_>>());
    }
    // Redis forgets its scripts; the next append loads it again.
    let flushed = std::process::Command::new("redis-cli")
        .args(["-u", &server.url(0), "SCRIPT", "FLUSH"])
        .output()
        .unwrap();
    assert!(flushed.status.success());
    let (done, answer) = tokio::sync::oneshot::channel();
    Arc::clone(&store).append_events_then(
        "a0".into(),
        vec![conformance::event(GROUPS * 3 + 1)],
        Box::new(move |_, result| {
            let _ = done.send(result);
        }),
    );
    answer.await.unwrap().unwrap();
    assert_eq!(store.load_run("a0").await.unwrap().last_seq, GROUPS * 3 + 1);
    // A run nobody created: its callback hears so.
    let (done, answer) = tokio::sync::oneshot::channel();
    Arc::clone(&store).append_events_then(
        "nobody".into(),
        vec![conformance::event(1)],
        Box::new(move |_, result| {
            let _ = done.send(result);
        }),
    );
    assert!(matches!(answer.await.unwrap(), Err(loom_core::StoreError::NotFound(_))));
}
