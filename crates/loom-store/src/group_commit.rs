//! Group commit: the frequent writes of many runs — their events as they
//! happen, their checkpoints, their ends — share transactions. One writer
//! thread takes every write waiting, runs each in a savepoint of one
//! transaction (a write that fails is rolled back alone), commits once and
//! answers them all. SQLite has one writer at a time, and a commit is its
//! cost: a thousand runs each writing alone wait in line behind each
//! other's commits, in groups they wait for one.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use loom_core::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

/// One write: statements on the open transaction.
pub(crate) type Write = Box<dyn FnOnce(&Connection) -> Result<(), StoreError> + Send>;

/// Writes waiting are taken at most this many at a time, so one
/// transaction stays short.
const MAX_GROUP: usize = 512;

/// Where a write's result goes.
type Done = oneshot::Sender<Result<(), StoreError>>;

struct Job {
    write: Write,
    done: Done,
}

/// The writer thread of one database connection.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl GroupCommit {
    /// Starts the writer on `conn` (shared with the store's other calls);
    /// it ends when the store is dropped.
    pub(crate) fn start(
        conn: Arc<Mutex<Connection>>,
        fail: impl Fn(rusqlite::Error) -> StoreError + Send + 'static,
    ) -> Result<Self, StoreError> {
        let (jobs, waiting) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("loom-store-writer".into())
            .spawn(move || {
                while let Ok(first) = waiting.recv() {
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP {
                        match waiting.try_recv() {
                            Ok(job) => group.push(job),
                            Err(_) => break,
                        }
                    }
                    let mut conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let answers = commit(&mut conn, group, &fail);
                    drop(conn);
                    for (done, result) in answers {
                        let _ = done.send(result);
                    }
                }
            })
            .map_err(|err| StoreError::Backend(format!("cannot start the store's writer: {err}")))?;
        Ok(Self { jobs: Mutex::new(jobs) })
    }

    /// Runs `write` in the next group and waits for its commit.
    pub(crate) async fn write(&self, write: Write) -> Result<(), StoreError> {
        let (done, result) = oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send(Job { write, done });
        if sent.is_err() {
            return Err(stopped());
        }
        result.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> StoreError {
    StoreError::Backend("the store's writer has stopped".into())
}

/// One transaction for the group: each write in a savepoint of its own.
fn commit(
    conn: &mut Connection,
    group: Vec<Job>,
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Vec<(Done, Result<(), StoreError>)> {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(err) => {
            let message = fail(err).to_string();
            return group
                .into_iter()
                .map(|job| (job.done, Err(StoreError::Backend(message.clone()))))
                .collect();
        }
    };
    let mut answers = Vec::with_capacity(group.len());
    for job in group {
        let statement = |sql: &str| tx.prepare_cached(sql).and_then(|mut statement| statement.execute([]));
        let result = statement("SAVEPOINT write")
            .map_err(fail)
            .and_then(|_| match (job.write)(&tx) {
                Ok(()) => statement("RELEASE write").map(|_| ()).map_err(fail),
                Err(err) => {
                    // Undone alone; the others of the group stand.
                    let _ = statement("ROLLBACK TO write");
                    let _ = statement("RELEASE write");
                    Err(err)
                }
            });
        answers.push((job.done, result));
    }
    match tx.commit() {
        Ok(()) => answers,
        Err(err) => {
            let message = fail(err).to_string();
            answers
                .into_iter()
                .map(|(done, _)| (done, Err(StoreError::Backend(message.clone()))))
                .collect()
        }
    }
}
