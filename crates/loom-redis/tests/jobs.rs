//! The lines of workspace jobs on a real `redis-server` (docs/rewind.md,
//! "In a cluster"): a job is answered by whoever takes it, withdrawn when
//! nobody does, and never done after its asker gave up on it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use loom_core::{JobOutcome, WorkspaceJobs};
use loom_redis::RedisStore;
use loom_testkit::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_answered_withdrawn_or_dropped_past_its_deadline_never_done_late() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = Arc::new(RedisStore::connect(&server.url(0)).await.unwrap());

    // A worker of the line takes it and answers.
    let worker = store.clone();
    let serving = tokio::spawn(async move {
        loop {
            if let Some(job) = worker.next_job("m:/ws").await.unwrap() {
                worker.answer(&job.id, &format!("done {}", job.body)).await.unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let outcome = store.ask("m:/ws", "rewind", Duration::from_secs(5)).await.unwrap();
    assert_eq!(outcome, JobOutcome::Answered("done rewind".into()));
    serving.await.unwrap();

    // Nobody serves another line: withdrawn, and nothing is left to take.
    let outcome = store
        .ask("m:/other", "rewind", Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(outcome, JobOutcome::NotTaken);
    assert_eq!(store.next_job("m:/other").await.unwrap(), None);

    // An asker that went away before it could withdraw its job (its task
    // dropped mid-wait): the job stays in the line until its deadline,
    // and a worker that finds it after that drops it.
    let asker = store.clone();
    let asking = tokio::spawn(async move { asker.ask("m:/late", "rewind", Duration::from_millis(300)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    asking.abort();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.next_job("m:/late").await.unwrap(),
        None,
        "past its deadline: dropped, not done"
    );
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut conn = client.get_connection().unwrap();
    let left: usize = redis::cmd("LLEN").arg("loom:jobs:m:/late").query(&mut conn).unwrap();
    assert_eq!(left, 0);
}
