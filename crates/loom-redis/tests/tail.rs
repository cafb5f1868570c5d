//! `RedisTail` on a real `redis-server`: one read over many runs' logs,
//! from each one's cursor, passing over an entry it cannot read.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use loom_core::{EventTail, RunLog, Tailed};
use loom_redis::RedisStore;
use loom_testkit::redis_server::RedisServer;
use loom_testkit::store_conformance::{event, record};

fn seqs(tailed: &[Tailed]) -> Vec<(String, u64)> {
    tailed
        .iter()
        .map(|entry| match entry {
            Tailed::Event(event) => (format!("{}", event.run_id), event.seq),
            Tailed::Unreadable { run_id, seq, .. } => (format!("unreadable {run_id}"), *seq),
        })
        .collect()
}

#[tokio::test]
async fn one_read_follows_many_logs_from_their_cursors_and_passes_over_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = RedisStore::connect(&server.url(0)).await.unwrap();
    let tail = store.tail().await.unwrap();
    for run in ["a", "b"] {
        store.create_run(&record(run)).await.unwrap();
    }
    let mut a = vec![event(1), event(2), event(3)];
    for e in &mut a {
        e.run_id = "a".into();
    }
    store.append_events("a", &a).await.unwrap();
    // Nothing new for b: the read waits, then returns what a has after 1.
    let cursors = [("a".to_string(), 1), ("b".to_string(), 0)];
    let read = tail.read(&cursors, Duration::from_millis(50)).await.unwrap();
    assert_eq!(seqs(&read), [("a".into(), 2), ("a".into(), 3)]);

    // A read blocked on b wakes when b gets an event.
    let waiting = {
        let tail = store.tail().await.unwrap();
        tokio::spawn(async move {
            let started = Instant::now();
            let read = tail
                .read(&[("b".to_string(), 0)], Duration::from_secs(5))
                .await
                .unwrap();
            (read, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut b = event(1);
    b.run_id = "b".into();
    store.append_events("b", &[b]).await.unwrap();
    let (read, waited) = waiting.await.unwrap();
    assert_eq!(seqs(&read), [("b".into(), 1)]);
    assert!(waited < Duration::from_secs(5), "woken by the event, not the timeout");

    // An entry another writer damaged is passed over, named with its seq.
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg("loom:events:b")
        .arg("0-2")
        .arg("e")
        .arg("{not an event")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut next = event(3);
    next.run_id = "b".into();
    store.append_events("b", &[next]).await.unwrap();
    let read = tail
        .read(&[("b".to_string(), 1)], Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(seqs(&read), [("unreadable b".into(), 2), ("b".into(), 3)]);
}

#[tokio::test]
async fn past_one_reads_worth_of_runs_a_read_finds_news_in_any_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap_or_else(|err| panic!("{err}"));
    let store = RedisStore::connect(&server.url(0)).await.unwrap();
    let tail = store.tail().await.unwrap();
    // 2 000 runs followed (four reads' worth); only the last has news.
    let mut cursors: Vec<(String, u64)> = (0..1999).map(|n| (format!("quiet-{n}"), 0)).collect();
    cursors.push(("z".to_string(), 0));
    store.create_run(&record("z")).await.unwrap();
    let mut z = event(1);
    z.run_id = "z".into();
    store.append_events("z", &[z]).await.unwrap();
    // One read, however long its wait: not spent blocked on the quiet ones.
    let read = tail.read(&cursors, Duration::from_secs(30)).await.unwrap();
    assert_eq!(seqs(&read), [("z".into(), 1)]);
    // No news anywhere: it comes back empty after its wait.
    cursors.last_mut().unwrap().1 = 1;
    let started = Instant::now();
    let read = tail.read(&cursors, Duration::from_millis(200)).await.unwrap();
    assert!(read.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(200));
}
