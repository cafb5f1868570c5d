//! Leases on a real `redis-server`: which run a worker takes, take-overs
//! raising the epoch, every stale write refused, controls delivered with
//! renewals (docs/cluster.md, leases).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loom_core::{
    Admissions, Checkpoint, Claim, Control, Lease, LeaseGuard, QueuedRun, Renewal, RunIndex, RunLeases, RunLog,
    RunMetrics, RunRecord, RunState, RunStatus, Store, StoreError, ToolCall, ToolResult, ToolStatus, TurnState,
};
use loom_redis::RedisStore;
use loom_testkit::redis_server::RedisServer;
use loom_testkit::store_conformance::{event, record};

async fn store() -> (RedisStore, RedisServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    // As a gateway whose runs workers execute queues them.
    let store = RedisStore::connect(&server.url(0))
        .await
        .unwrap()
        .queueing_for_workers(10_000);
    (store, server, dir)
}

async fn queue(store: &RedisStore, run_id: &str, session: &str, started_ms: u64) {
    let mut run = record(run_id);
    run.owner = String::new();
    run.session_id = session.into();
    run.started_ms = started_ms;
    run.principal = Some("alice".into());
    let queued = QueuedRun {
        record: run,
        request: format!(r#"{{"prompt":"{run_id}"}}"#),
    };
    store.queue_run(&queued, None).await.unwrap();
}

fn started(lease: &Lease) -> RunRecord {
    let mut run = record(&lease.run_id);
    run.status = RunStatus::Running;
    run.owner = lease.owner.clone();
    run
}

async fn claim(store: &RedisStore, owner: &str, ttl_ms: u64) -> Option<Claim> {
    store.claim_next(owner, Duration::from_millis(ttl_ms), 0).await.unwrap()
}

fn fenced(store: &RedisStore, lease: &Lease) -> Arc<dyn Store> {
    store.fenced(lease, Arc::default())
}

async fn renew(store: &RedisStore, lease: &Lease, ttl_ms: u64) -> Renewal {
    store.renew(lease, Duration::from_millis(ttl_ms), 0).await.unwrap()
}

#[tokio::test]
async fn queued_runs_are_taken_once_oldest_first_and_a_session_one_run_at_a_time() {
    let (store, _server, _dir) = store().await;
    queue(&store, "q1", "s1", 1).await;
    queue(&store, "q2", "s1", 2).await;
    queue(&store, "q3", "s2", 3).await;

    let Some(Claim::Start { lease: first, request }) = claim(&store, "w1", 60_000).await else {
        panic!("the oldest queued run is taken");
    };
    assert_eq!((first.run_id.as_str(), first.epoch), ("q1", 1));
    assert_eq!(request, r#"{"prompt":"q1"}"#, "with the request that starts it");
    // q2 waits for q1, its session's run; q3's session is free.
    let second = claim(&store, "w2", 60_000).await.unwrap();
    assert_eq!(second.lease().run_id, "q3");
    assert_eq!(claim(&store, "w2", 60_000).await, None, "nothing else may start");

    // q1 starts and ends: its session's next run may go.
    let run = fenced(&store, &first);
    run.create_run(&started(&first)).await.unwrap();
    assert_eq!(claim(&store, "w2", 60_000).await, None, "q1 executes");
    run.finish_run("q1", RunStatus::Done, Some("ok"), &RunMetrics::default(), &[])
        .await
        .unwrap();
    assert_eq!(renew(&store, &first, 60000).await, Renewal::Ended);
    assert_eq!(claim(&store, "w2", 60_000).await.unwrap().lease().run_id, "q2");
}

#[tokio::test]
async fn a_lease_that_ends_is_taken_over_with_a_higher_epoch_and_every_stale_write_is_refused() {
    let (store, _server, _dir) = store().await;
    queue(&store, "q1", "s1", 1).await;
    let old = claim(&store, "w1", 300).await.unwrap().lease().clone();
    let old_store = fenced(&store, &old);
    old_store.create_run(&started(&old)).await.unwrap();
    old_store.append_events("q1", &[event(1)]).await.unwrap();

    // Not before its lease ends.
    assert_eq!(claim(&store, "w2", 300).await, None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Some(Claim::Resume { lease: new }) = claim(&store, "w2", 60_000).await else {
        panic!("a run whose lease ended is taken over, to resume");
    };
    assert_eq!((new.run_id.as_str(), new.epoch, new.owner.as_str()), ("q1", 2, "w2"));
    assert_eq!(store.load_run("q1").await.unwrap().run.status, RunStatus::Interrupted);

    // Every write of the old holder is refused, and changes nothing.
    let state = RunState::new(TurnState::initial(10), "q");
    let call = ToolCall {
        id: "c1".into(),
        name: "bash".into(),
        arguments: serde_json::json!({}),
    };
    let refused: Vec<Result<(), StoreError>> = vec![
        old_store.append_events("q1", &[event(2)]).await,
        old_store
            .checkpoint(&Checkpoint {
                run_id: "q1",
                state: &state,
                new_messages: &[],
                replaced_history: None,
                events: &[event(2)],
            })
            .await,
        old_store.journal_intent("q1", &call).await,
        old_store
            .journal_result("q1", &ToolResult::new("c1", "bash", ToolStatus::Success, "done"))
            .await,
        old_store.set_status("q1", RunStatus::Running).await,
        old_store
            .finish_run("q1", RunStatus::Done, Some("late"), &RunMetrics::default(), &[event(2)])
            .await,
        old_store.create_run(&record("child-of-q1")).await,
    ];
    for (i, result) in refused.into_iter().enumerate() {
        assert!(
            matches!(&result, Err(StoreError::Fenced(id)) if id == "q1"),
            "write {i} was not fenced: {result:?}"
        );
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    old_store.clone().append_events_then(
        "q1".into(),
        vec![event(2)],
        Box::new(move |_, result| {
            let _ = tx.send(result);
        }),
    );
    assert!(matches!(rx.await.unwrap(), Err(StoreError::Fenced(_))));
    let snapshot = store.load_run("q1").await.unwrap();
    assert_eq!(snapshot.run.status, RunStatus::Interrupted);
    assert_eq!(snapshot.last_seq, 1, "no late event");
    assert!(snapshot.journal.is_empty() && snapshot.state.is_none());
    assert!(matches!(
        store.load_run("child-of-q1").await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(renew(&store, &old, 1000).await, Renewal::Lost);

    // The new holder writes.
    let new_store = fenced(&store, &new);
    new_store.reclaim_run("q1", "w2").await.unwrap();
    new_store.append_events("q1", &[event(2)]).await.unwrap();
    assert_eq!(store.load_run("q1").await.unwrap().last_seq, 2);
}

#[tokio::test]
async fn renewals_keep_the_lease_and_bring_the_controls_sent_meanwhile() {
    let (store, _server, _dir) = store().await;
    queue(&store, "q1", "s1", 1).await;
    let lease = claim(&store, "w1", 300).await.unwrap().lease().clone();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(matches!(renew(&store, &lease, 300).await, Renewal::Held { .. }));
    }
    assert_eq!(
        claim(&store, "w2", 300).await,
        None,
        "a renewed lease is not taken over"
    );

    let cancel = Control::Cancel {
        reason: "by bob".into(),
    };
    store.send_control("q1", &cancel).await.unwrap();
    store
        .send_control("q1", &Control::Steer("also this".into()))
        .await
        .unwrap();
    let both = vec![(1, cancel.clone()), (2, Control::Steer("also this".into()))];
    assert_eq!(
        renew(&store, &lease, 300).await,
        Renewal::Held { controls: both.clone() }
    );
    // Until a checkpoint acknowledges them, they stay: a worker asks after
    // the last it has, and one taking the run over gets them all.
    assert_eq!(
        store.renew(&lease, Duration::from_millis(300), 1).await.unwrap(),
        Renewal::Held {
            controls: both[1..].to_vec()
        }
    );
    assert_eq!(
        renew(&store, &lease, 300).await,
        Renewal::Held { controls: both.clone() }
    );
    let guard = Arc::new(LeaseGuard::default());
    let run = store.fenced(&lease, guard.clone());
    run.create_run(&started(&lease)).await.unwrap();
    guard.delivered.store(1, Ordering::SeqCst);
    let state = RunState::new(TurnState::initial(10), "q");
    run.checkpoint(&Checkpoint {
        run_id: "q1",
        state: &state,
        new_messages: &[],
        replaced_history: None,
        events: &[],
    })
    .await
    .unwrap();
    assert_eq!(
        renew(&store, &lease, 300).await,
        Renewal::Held {
            controls: both[1..].to_vec()
        },
        "the checkpoint acknowledged the first"
    );
    // An ended run hears nothing more, and keeps nothing for it.
    run.finish_run("q1", RunStatus::Canceled, None, &RunMetrics::default(), &[])
        .await
        .unwrap();
    store.send_control("q1", &Control::Pause).await.unwrap();
    assert_eq!(renew(&store, &lease, 300).await, Renewal::Ended);
    assert!(matches!(
        store.send_control("nobody", &Control::Pause).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_run_handed_back_is_taken_at_once_and_a_revoked_lease_sends_nothing() {
    let (store, _server, _dir) = store().await;
    queue(&store, "q1", "s1", 1).await;
    let lease = claim(&store, "w1", 60_000).await.unwrap().lease().clone();
    let guard = Arc::new(LeaseGuard::default());
    let run = store.fenced(&lease, guard.clone());
    run.create_run(&started(&lease)).await.unwrap();
    run.finish_run("q1", RunStatus::Interrupted, None, &RunMetrics::default(), &[])
        .await
        .unwrap();
    store.release(&lease).await.unwrap();
    let Some(Claim::Resume { lease: next }) = claim(&store, "w2", 60_000).await else {
        panic!("a run handed back is taken without waiting for its lease");
    };
    assert_eq!(next.epoch, 3, "released (2), then taken (3)");
    assert_eq!(
        renew(&store, &lease, 60_000).await,
        Renewal::Lost,
        "a late renewal of the releasing worker"
    );

    // A worker that gave a run up sends nothing, whatever Redis would say.
    let mine = store.fenced(&next, guard.clone());
    guard.revoked.store(true, Ordering::SeqCst);
    assert!(matches!(
        mine.append_events("q1", &[event(1)]).await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(store.load_run("q1").await.unwrap().last_seq, 0);
}

async fn stored_status(store: &RedisStore, run_id: &str) -> RunStatus {
    store.load_run(run_id).await.unwrap().run.status
}

#[tokio::test]
async fn a_parked_run_holds_no_worker_until_a_control_comes() {
    let (store, server, _dir) = store().await;
    queue(&store, "q1", "s1", 1).await;
    let lease = claim(&store, "w1", 60_000).await.unwrap().lease().clone();
    let run = fenced(&store, &lease);
    run.create_run(&started(&lease)).await.unwrap();
    run.mark_interrupted("q1", "w1").await.unwrap();
    assert!(store.park(&lease, 0).await.unwrap(), "parked");
    // Stored as the gateway shows it: waiting for a person.
    assert_eq!(stored_status(&store, "q1").await, RunStatus::WaitingPermission);
    assert_eq!(
        renew(&store, &lease, 60_000).await,
        Renewal::Lost,
        "a late renewal of the parking worker"
    );
    assert_eq!(claim(&store, "w2", 60_000).await, None, "nobody takes a parked run");
    let answer = Control::PermissionReply {
        request_id: "perm_1".into(),
        decision: loom_core::PermissionDecision::Allow,
    };
    store.send_control("q1", &answer).await.unwrap();
    let Some(Claim::Resume { lease: next }) = claim(&store, "w2", 60_000).await else {
        panic!("the answer makes it claimable at once");
    };
    assert_eq!(
        stored_status(&store, "q1").await,
        RunStatus::Interrupted,
        "claimed to be resumed"
    );
    assert_eq!(
        renew(&store, &next, 60000).await,
        Renewal::Held {
            controls: vec![(1, answer)]
        },
        "and its worker hears the answer"
    );

    // A control that came before the park: the run stays claimable.
    store.mark_interrupted("q1", "w1").await.unwrap();
    store.send_control("q1", &Control::Steer("more".into())).await.unwrap();
    // One it heard (the answer, 1) does not; one it had not (2) does.
    assert!(!store.park(&next, 1).await.unwrap());
    let Some(Claim::Resume { lease: third }) = claim(&store, "w3", 60_000).await else {
        panic!("claimable at once");
    };
    // Controls heard and not yet acknowledged may not have taken effect:
    // the run is tried again, not at once (it would be parked again at
    // once, for ever) but a few seconds later.
    // 5 s after the park, by Redis's clock (this machine's): between 5 s
    // after the moment before it and 5 s after the moment after it,
    // however long it took.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as f64
    };
    let before = now_ms();
    assert!(!store.park(&third, 2).await.unwrap());
    let after = now_ms();
    assert_eq!(claim(&store, "w4", 60_000).await, None, "not at once");
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let retry: f64 = redis::cmd("ZSCORE")
        .arg("loom:leases")
        .arg("q1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (before + 5_000.0..=after + 5_000.0).contains(&retry),
        "5 s after the park: {} after the moment before it",
        retry - before
    );
}

#[tokio::test]
async fn ended_runs_are_forgotten_after_their_keeping_time_with_every_trace() {
    let (store, server, _dir) = store().await;
    queue(&store, "old", "s1", 1).await;
    queue(&store, "live", "s2", 2).await;
    let lease = claim(&store, "w1", 60_000).await.unwrap().lease().clone();
    let run = fenced(&store, &lease);
    run.create_run(&started(&lease)).await.unwrap();
    run.append_events("old", &[event(1)]).await.unwrap();
    run.finish_run("old", RunStatus::Done, Some("ok"), &RunMetrics::default(), &[event(2)])
        .await
        .unwrap();
    // Not yet: it ended just now.
    assert_eq!(store.forget_ended(1, 100).await.unwrap(), 0);
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 1_000;
    assert_eq!(store.forget_ended(later, 100).await.unwrap(), 1);
    assert!(matches!(store.load_run("old").await, Err(StoreError::NotFound(_))));
    assert!(store.session_runs("s1").await.unwrap().is_empty());
    let listed: Vec<String> = store
        .list_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|run| run.run_id)
        .collect();
    assert_eq!(listed, ["live"], "the run that has not ended stays");
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*old*").query_async(&mut conn).await.unwrap();
    assert!(keys.is_empty(), "nothing of it is left: {keys:?}");
    for index in ["loom:runs", "loom:ended", "loom:status:DONE", "loom:session:s1"] {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(index)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!members.contains(&"old".to_string()), "{index}: {members:?}");
    }
    assert_eq!(store.forget_ended(later, 100).await.unwrap(), 0);
}

#[tokio::test]
async fn the_line_is_bounded_shows_positions_and_caps_each_principal() {
    let (store, _server, _dir) = store().await;
    let store = store.queueing_for_workers(3);
    queue(&store, "q1", "s1", 1).await;
    queue(&store, "q2", "s2", 2).await;
    queue(&store, "q3", "s3", 3).await;
    let mut run = record("q4");
    run.principal = Some("alice".into());
    let refused = store
        .queue_run(
            &QueuedRun {
                record: run,
                request: "{}".into(),
            },
            None,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::QueueFull { limit: 3 })),
        "{refused:?}"
    );
    assert_eq!(store.queue_position("q2").await.unwrap(), Some(2));

    // Every queued run is alice's: with a cap of two, a third waits.
    let first = store
        .claim_next("w1", Duration::from_secs(60), 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.queue_position("q1").await.unwrap(), None, "taken: not waiting");
    assert_eq!(store.queue_position("q2").await.unwrap(), Some(1));
    store
        .claim_next("w1", Duration::from_secs(60), 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.claim_next("w2", Duration::from_secs(60), 2).await.unwrap(), None);
    // One ends: the third may go.
    let done = fenced(&store, first.lease());
    done.create_run(&started(first.lease())).await.unwrap();
    done.finish_run("q1", RunStatus::Done, None, &RunMetrics::default(), &[])
        .await
        .unwrap();
    let third = store
        .claim_next("w2", Duration::from_secs(60), 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.lease().run_id, "q3");
}

#[tokio::test]
async fn only_runs_queued_for_workers_are_claimed_and_failed_starts_are_counted() {
    let (store, server, _dir) = store().await;
    // A gateway that executes its own runs queues them unmarked.
    let own = RedisStore::connect(&server.url(0)).await.unwrap();
    queue(&own, "mine", "s1", 1).await;
    assert_eq!(
        claim(&store, "w1", 60_000).await,
        None,
        "a gateway's own run is not a worker's"
    );
    queue(&store, "theirs", "s2", 2).await;
    let lease = claim(&store, "w1", 60_000).await.unwrap().lease().clone();
    assert_eq!(lease.run_id, "theirs");
    assert_eq!(store.note_failed_start(&lease).await.unwrap(), Some(1));
    assert_eq!(store.note_failed_start(&lease).await.unwrap(), Some(2));
    store.release(&lease).await.unwrap();
    assert_eq!(
        store.note_failed_start(&lease).await.unwrap(),
        None,
        "the lease is gone"
    );
}

/// Whether `workers` listen for nudges within 5 s.
async fn listening(client: &redis::Client, workers: u64) -> bool {
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for _ in 0..250 {
        let subscribed: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("loom:work")
            .query_async(&mut conn)
            .await
            .unwrap();
        if subscribed[0].1 == workers {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The next nudge, within a few seconds.
async fn next_nudge(nudges: &mut tokio::sync::mpsc::Receiver<loom_core::Nudge>) -> loom_core::Nudge {
    tokio::time::timeout(Duration::from_secs(5), nudges.recv())
        .await
        .expect("a nudge within 5 s")
        .expect("still listening")
}

#[tokio::test]
async fn workers_are_nudged_when_a_run_becomes_claimable_and_when_their_run_gets_a_control() {
    use loom_core::Nudge;
    let (store, server, _dir) = store().await;
    let mut w1 = store.nudges("w1");
    let mut w2 = store.nudges("w2");
    // Listening is set up on a task: wait until both are subscribed.
    let client = redis::Client::open(server.url(0)).unwrap();
    assert!(listening(&client, 2).await, "both listen within 5 s");

    // A run queued for workers: every worker may take it.
    queue(&store, "q1", "s1", 1).await;
    assert_eq!(next_nudge(&mut w1).await, Nudge::Work);
    assert_eq!(next_nudge(&mut w2).await, Nudge::Work);
    let lease = claim(&store, "w1", 60_000).await.unwrap().lease().clone();
    fenced(&store, &lease).create_run(&started(&lease)).await.unwrap();

    // A control for it: only its worker is nudged, and its renewal brings it.
    store.send_control("q1", &Control::Steer("more".into())).await.unwrap();
    assert_eq!(next_nudge(&mut w1).await, Nudge::Control);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), w2.recv())
            .await
            .is_err(),
        "another worker's run is none of w2's business"
    );
    assert!(matches!(renew(&store, &lease, 60_000).await, Renewal::Held { controls } if controls.len() == 1));

    // Handed back: claimable again, at once.
    store.release(&lease).await.unwrap();
    assert_eq!(next_nudge(&mut w2).await, Nudge::Work);
    assert_eq!(claim(&store, "w2", 60_000).await.unwrap().lease().run_id, "q1");

    // Redis restarted: the listeners come back by themselves.
    while w1.try_recv().is_ok() {}
    let mut server = server;
    server.restart().unwrap_or_else(|err| panic!("{err}"));
    assert!(listening(&client, 2).await, "both listen again within 5 s");
    // The store's own connection is made again on its first use.
    let mut run = record("q2");
    run.owner = String::new();
    let queued = QueuedRun {
        record: run,
        request: "{}".into(),
    };
    let mut tries = 0;
    while let Err(err) = store.queue_run(&queued, None).await {
        tries += 1;
        assert!(tries < 50, "{err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(next_nudge(&mut w1).await, Nudge::Work);
    assert_eq!(next_nudge(&mut w2).await, Nudge::Work);
}
