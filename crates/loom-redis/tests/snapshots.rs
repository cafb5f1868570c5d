//! Workspace snapshots kept in a real `redis-server` (docs/rewind.md):
//! recorded and restored like SQLite's, read by another process, written
//! only under the run's lease, and forgotten with their runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loom_core::{
    Admissions, Claim, LeaseGuard, QueuedRun, RunLeases, RunLog, RunMetrics, RunStatus, SnapshotError,
    WorkspaceSnapshots, WriteFence,
};
use loom_redis::{RedisSnapshots, RedisStore};
use loom_snapshot::{Filter, SnapshotStore, Snapshots};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::store_conformance::record;

fn snapshots(server: &RedisServer, ws: &Path, lock: &Path) -> Snapshots {
    let store = RedisSnapshots::new(&server.url(0), "loom:").unwrap();
    Snapshots::open_in(ws, Box::new(store), lock, Filter::default()).unwrap()
}

fn tree(ws: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(ws)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(entry.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn snapshots_in_redis_restore_any_step_and_another_process_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let lock = dir.path().join("snapshots.lock");
    let worker = snapshots(&server, &ws, &lock);
    std::fs::write(ws.join("a.txt"), "one").unwrap();
    std::fs::write(ws.join("b.txt"), "kept").unwrap();
    worker.record("r1", 0, None).await.unwrap();
    let at_zero = tree(&ws);
    std::fs::write(ws.join("a.txt"), "two").unwrap();
    std::fs::write(ws.join("c.txt"), "new").unwrap();
    let one = worker.record("r1", 1, None).await.unwrap();
    assert_eq!(one.changed, ["a.txt", "c.txt"]);
    std::fs::remove_file(ws.join("b.txt")).unwrap();
    worker.record("r1", 2, None).await.unwrap();

    // Another process of this machine (a worker started later) sees them.
    let other = snapshots(&server, &ws, &lock);
    assert_eq!(other.steps("r1").await.unwrap(), [0, 1, 2]);
    assert_eq!(
        other.file_at("r1", 1, "a.txt").await.unwrap().as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(other.step_files("r1", 2).await.unwrap().removed, ["b.txt"]);
    let plan = other.plan("r1", 0, None).await.unwrap();
    assert_eq!(plan.write, ["a.txt", "b.txt"]);
    assert_eq!(plan.remove, ["c.txt"]);
    assert!(plan.changed_outside.is_empty(), "{plan:?}");
    other.restore("r1", 0, None, false).await.unwrap();
    assert_eq!(tree(&ws), at_zero);

    // The first process's next record starts from the restored head: a
    // change since is the step's, nothing is taken for changed outside.
    std::fs::write(ws.join("d.txt"), "after").unwrap();
    let next = worker.record("r2", 0, None).await.unwrap();
    assert_eq!(next.changed, ["d.txt"]);
    assert!(other.plan("r2", 0, None).await.unwrap().changed_outside.is_empty());
}

#[tokio::test]
async fn a_worker_that_lost_its_run_records_no_snapshot_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = RedisStore::connect(&server.url(0))
        .await
        .unwrap()
        .queueing_for_workers(100);
    let mut run = record("r1");
    run.owner = String::new();
    store
        .queue_run(
            &QueuedRun {
                record: run,
                request: r#"{"prompt":"p"}"#.into(),
            },
            None,
        )
        .await
        .unwrap();
    let Some(Claim::Start { lease: first, .. }) = store.claim_next("w1", Duration::from_millis(100), 0).await.unwrap()
    else {
        panic!("the run is claimed");
    };
    let guard = Arc::new(LeaseGuard::default());
    let fenced = store.fenced(&first, guard.clone());
    let fence: WriteFence = fenced.write_fence().expect("a worker's store carries its lease");
    assert_eq!(fence.epoch, first.epoch);

    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let snapshots = snapshots(&server, &ws, &dir.path().join("lock"));
    std::fs::write(ws.join("a.txt"), "by the first worker").unwrap();
    snapshots.record("r1", 1, Some(&fence)).await.unwrap();

    // Its lease runs out; another worker takes the run over and records.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = store
        .claim_next("w2", Duration::from_secs(30), 0)
        .await
        .unwrap()
        .expect("the run is taken over")
        .lease()
        .clone();
    assert!(second.epoch > first.epoch);
    let taken_over = WriteFence {
        run_id: "r1".into(),
        epoch: second.epoch,
        guard: Arc::default(),
    };
    std::fs::write(ws.join("a.txt"), "by the second worker").unwrap();
    snapshots.record("r1", 2, Some(&taken_over)).await.unwrap();

    // Another run starts from there: its first point is based on step 2.
    std::fs::write(ws.join("b.txt"), "q's").unwrap();
    snapshots.record("q", 0, None).await.unwrap();
    let mut conn = redis::Client::open(server.url(0)).unwrap().get_connection().unwrap();
    let q_point = |conn: &mut redis::Connection| -> String {
        redis::cmd("HGET").arg("loom:snap-point:q").arg(0).query(conn).unwrap()
    };
    let q_before = q_point(&mut conn);

    // The first wakes and records its step 2 again: refused, by Redis,
    // before it rebases q's point on step 2 or writes its own.
    std::fs::write(ws.join("a.txt"), "stale").unwrap();
    let refused = snapshots.record("r1", 2, Some(&fence)).await.unwrap_err();
    assert!(
        matches!(&refused, SnapshotError::Failed(why) if why.contains("no longer this worker's")),
        "{refused}"
    );
    assert_eq!(guard.refused.load(Ordering::SeqCst), 1);
    assert_eq!(
        snapshots.file_at("r1", 2, "a.txt").await.unwrap().as_deref(),
        Some(&b"by the second worker"[..]),
        "the stale write changed nothing"
    );
    assert_eq!(q_point(&mut conn), q_before, "nor the points based on it");
    // Once the worker gave the run up, nothing is even sent.
    guard.revoked.store(true, Ordering::SeqCst);
    snapshots.record("r1", 3, Some(&fence)).await.unwrap_err();
    assert_eq!(guard.refused.load(Ordering::SeqCst), 2);
    assert_eq!(snapshots.steps("r1").await.unwrap(), [1, 2]);
    assert_eq!(q_point(&mut conn), q_before);
}

#[tokio::test]
async fn snapshots_are_forgotten_with_their_runs_and_later_runs_stay_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = RedisStore::connect(&server.url(0)).await.unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let snapshots = snapshots(&server, &ws, &dir.path().join("lock"));
    std::fs::write(ws.join("old.txt"), "only the old run had this").unwrap();
    std::fs::write(ws.join("both.txt"), "both runs have this").unwrap();
    snapshots.record("old", 0, None).await.unwrap();
    std::fs::remove_file(ws.join("old.txt")).unwrap();
    std::fs::write(ws.join("new.txt"), "new").unwrap();
    // Based on the old run's point: a delta from it.
    snapshots.record("new", 0, None).await.unwrap();
    let before = snapshots.plan("new", 0, None).await.unwrap();

    let mut old = record("old");
    old.session_id = "s1".into();
    old.status = RunStatus::Running;
    store.create_run(&old).await.unwrap();
    store
        .finish_run("old", RunStatus::Done, Some("ok"), &RunMetrics::default(), &[])
        .await
        .unwrap();
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 1_000;
    assert_eq!(store.forget_ended(later, 100).await.unwrap(), 1);

    assert!(snapshots.steps("old").await.unwrap().is_empty());
    assert_eq!(
        snapshots.file_at("new", 0, "both.txt").await.unwrap().as_deref(),
        Some(&b"both runs have this"[..]),
        "the later run's point was recorded again from nothing"
    );
    assert_eq!(snapshots.plan("new", 0, None).await.unwrap(), before);
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut conn = client.get_connection().unwrap();
    let contents: Vec<String> = redis::cmd("KEYS").arg("loom:snap-content:*").query(&mut conn).unwrap();
    assert_eq!(contents.len(), 2, "the old run's own file is gone: {contents:?}");
    let leftovers: Vec<String> = redis::cmd("KEYS").arg("loom:snap-*:old").query(&mut conn).unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Forgetting the last run leaves nothing but the workspace's filter.
    let mut direct = RedisSnapshots::new(&server.url(0), "loom:").unwrap();
    direct.forget("new").unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("loom:snap-*").query(&mut conn).unwrap();
    keys.sort();
    assert_eq!(keys, ["loom:snap-filters"]);
}

/// The removal of old runs (a worker's sweep) and a new run's snapshots
/// race in a shared store: a point is never written on a base that was
/// forgotten, a run is never forgotten under a point based on it, and a
/// workspace whose latest snapshot was forgotten is read whole again, so
/// no content a point needs is missing.
#[tokio::test]
async fn forgetting_and_recording_at_once_never_leave_a_point_without_its_base_or_contents() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let snapshots = snapshots(&server, &ws, &dir.path().join("lock"));
    std::fs::write(ws.join("kept.txt"), "unchanged for a month").unwrap();
    snapshots.record("old", 0, None).await.unwrap();
    std::fs::write(ws.join("new.txt"), "new").unwrap();
    snapshots.record("mid", 0, None).await.unwrap();

    let mut sweep = RedisSnapshots::new(&server.url(0), "loom:").unwrap();
    // A removal that skipped the rebase is refused while "mid" is based on "old".
    let refused = sweep.remove_run("old").unwrap_err();
    assert!(
        matches!(refused, loom_snapshot::SnapshotStoreError::Raced(_)),
        "{refused}"
    );
    // A point on a base that is gone is refused.
    let delta = loom_snapshot::Delta::default();
    let gone = ("nobody".to_string(), 3);
    let refused = sweep
        .record(&loom_snapshot::NewPoint {
            run: "late",
            step: 0,
            base: Some(&gone),
            delta: &delta,
            contents: &[],
            left_out: &[],
            head_of: None,
            fence: None,
        })
        .unwrap_err();
    assert!(refused.to_string().contains("forgotten"), "{refused}");

    // The sweep forgets both runs: the workspace's latest snapshot is gone
    // with every content, and the next run's first snapshot reads the
    // files again instead of naming contents nobody keeps.
    sweep.forget("old").unwrap();
    sweep.forget("mid").unwrap();
    let next = snapshots.record("next", 0, None).await.unwrap();
    assert_eq!(next.changed, ["kept.txt", "new.txt"], "from nothing, every file");
    assert_eq!(
        snapshots.file_at("next", 0, "kept.txt").await.unwrap().as_deref(),
        Some(&b"unchanged for a month"[..])
    );
}

/// A run taken over by a worker of another folder has steps recorded in
/// both: each step is restored only in the folder it was recorded in, and
/// a step's change is from that folder's own files, never the other's.
#[tokio::test]
async fn a_run_taken_over_in_another_folder_restores_each_step_only_where_it_was_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let (ws1, ws3) = (dir.path().join("ws1"), dir.path().join("ws3"));
    std::fs::create_dir(&ws1).unwrap();
    std::fs::create_dir(&ws3).unwrap();
    std::fs::write(ws1.join("only-in-1.txt"), "one").unwrap();
    std::fs::write(ws3.join("only-in-3.txt"), "three").unwrap();
    let first = snapshots(&server, &ws1, &dir.path().join("lock1"));
    let second = snapshots(&server, &ws3, &dir.path().join("lock3"));
    first.record("r", 0, None).await.unwrap();
    // Taken over: steps 1 and 2 in the other folder.
    std::fs::write(ws3.join("t1.txt"), "b").unwrap();
    let one = second.record("r", 1, None).await.unwrap();
    assert_eq!(
        one.changed,
        ["only-in-3.txt", "t1.txt"],
        "from this folder's files, not the other's"
    );
    assert!(one.removed.is_empty(), "{one:?}");
    std::fs::write(ws3.join("t2.txt"), "c").unwrap();
    second.record("r", 2, None).await.unwrap();

    let where1 = first.recorded_in("r", 0).await.unwrap().unwrap();
    let where3 = second.recorded_in("r", 2).await.unwrap().unwrap();
    assert!(
        where1.ends_with("/ws1") && where3.ends_with("/ws3"),
        "{where1} {where3}"
    );
    // Neither folder is given the other's files.
    let refused = first.plan("r", 2, None).await.unwrap_err();
    assert!(matches!(refused, SnapshotError::Elsewhere { .. }), "{refused}");
    let refused = second.restore("r", 0, None, true).await.unwrap_err();
    assert!(matches!(refused, SnapshotError::Elsewhere { .. }), "{refused}");
    assert_eq!(tree(&ws1), [("only-in-1.txt".to_string(), "one".to_string())]);
    // Each where it was recorded.
    second.restore("r", 1, None, false).await.unwrap();
    assert_eq!(
        tree(&ws3),
        [
            ("only-in-3.txt".to_string(), "three".to_string()),
            ("t1.txt".to_string(), "b".to_string())
        ]
    );
    first.restore("r", 0, None, false).await.unwrap();
    assert_eq!(tree(&ws1), [("only-in-1.txt".to_string(), "one".to_string())]);
}
