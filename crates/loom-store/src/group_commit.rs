//! Group commit: the frequent writes of many runs — their events as they
//! happen, their checkpoints, their ends — share transactions. One writer
//! thread takes every write waiting, runs them all in one transaction,
//! commits once and answers them all. Should one fail, the transaction is
//! rolled back and the group done again with each write in a savepoint of
//! its own (a write that fails is undone alone); savepoints are not the
//! rule because each copies every page its write touches. SQLite has one writer at a time, and a commit is its
//! cost: a thousand runs each writing alone wait in line behind each
//! other's commits, in groups they wait for one.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use loom_core::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use crate::wal_checkpointer::WalCheckpointer;

/// One write: statements on the open transaction. It may run twice (the
/// second time after its first was rolled back).
pub(crate) type Write = Box<dyn Fn(&Connection) -> Result<(), StoreError> + Send>;

/// The store's own part of a write's wait — in line for the writer, then
/// its group's transaction — by operation: what the writer could answer
/// for. (The caller's wait adds the time its task takes to run again.)
const COMMIT_SECONDS: &str = "loom_store_commit_seconds";

/// Writes waiting are taken at most this many at a time, so one
/// transaction stays short.
const MAX_GROUP: usize = 512;

/// Where a write's result goes: a task waiting for it, or a callback the
/// writer calls itself once the group is committed (nothing to wake).
pub(crate) enum Done {
    Wake(oneshot::Sender<Result<(), StoreError>>),
    Call(Box<dyn FnOnce(Result<(), StoreError>) + Send>),
}

impl Done {
    fn answer(self, result: Result<(), StoreError>) {
        match self {
            Self::Wake(waiting) => {
                let _ = waiting.send(result);
            }
            Self::Call(then) => {
                // A callback that panics must not take the writer with it.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| then(result))).is_err() {
                    tracing::error!("a callback of the store's writer panicked");
                }
            }
        }
    }
}

struct Job {
    write: Write,
    done: Done,
    /// What it writes, for the metric, and since when it waits.
    op: &'static str,
    queued: Instant,
}

/// The writer thread of one database connection.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl GroupCommit {
    /// Starts the writer on `conn` (shared with the store's other calls);
    /// it ends when the store is dropped. Each commit is reported to
    /// `checkpointer`, which moves the log into the database.
    pub(crate) fn start(
        conn: Arc<Mutex<Connection>>,
        checkpointer: Arc<WalCheckpointer>,
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
                    let waits: Vec<_> = group.iter().map(|job| (job.op, job.queued)).collect();
                    let mut conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let answers = commit(&mut conn, group, &fail);
                    drop(conn);
                    let committed = Instant::now();
                    for (op, queued) in waits {
                        metrics::histogram!(COMMIT_SECONDS, "op" => op)
                            .record(committed.duration_since(queued).as_secs_f64());
                    }
                    checkpointer.committed();
                    for (done, result) in answers {
                        done.answer(result);
                    }
                }
            })
            .map_err(|err| StoreError::Backend(format!("cannot start the store's writer: {err}")))?;
        Ok(Self { jobs: Mutex::new(jobs) })
    }

    /// Runs `write` (an `op`, for the metric) in the next group and waits
    /// for its commit.
    pub(crate) async fn write(&self, op: &'static str, write: Write) -> Result<(), StoreError> {
        let (done, result) = oneshot::channel();
        self.write_then(op, write, Done::Wake(done));
        result.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Runs `write` in the next group; `done` hears of its commit (at once
    /// if the writer has stopped).
    pub(crate) fn write_then(&self, op: &'static str, write: Write, done: Done) {
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send(Job {
                write,
                done,
                op,
                queued: Instant::now(),
            });
        if let Err(mpsc::SendError(job)) = sent {
            job.done.answer(Err(stopped()));
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Backend("the store's writer has stopped".into())
}

/// One transaction for the group.
fn commit(
    conn: &mut Connection,
    group: Vec<Job>,
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Vec<(Done, Result<(), StoreError>)> {
    match all_at_once(conn, &group, fail) {
        Ok(()) => group.into_iter().map(|job| (job.done, Ok(()))).collect(),
        // No transaction could begin (the database is locked past the busy
        // timeout): a second try would wait as long again.
        Err(Failed::Begin(err)) => failed_all(group.into_iter().map(|job| job.done), &err),
        // Rolled back: which write failed (or whether the commit did) is
        // for the careful pass to tell.
        Err(Failed::Later) => one_by_one(conn, group, fail),
    }
}

/// Why a group's single transaction did not commit.
enum Failed {
    /// It could not begin.
    Begin(StoreError),
    /// A write or the commit failed; everything was rolled back.
    Later,
}

/// Every write of the group, then the commit; any failure rolls it all back.
fn all_at_once(
    conn: &mut Connection,
    group: &[Job],
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<(), Failed> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|err| Failed::Begin(fail(err)))?;
    for job in group {
        (job.write)(&tx).map_err(|_| Failed::Later)?;
    }
    tx.commit().map_err(|_| Failed::Later)
}

/// The same error for every one of `done`.
fn failed_all(done: impl Iterator<Item = Done>, err: &StoreError) -> Vec<(Done, Result<(), StoreError>)> {
    let message = err.to_string();
    done.map(|done| (done, Err(StoreError::Backend(message.clone()))))
        .collect()
}

/// One transaction for the group, each write in a savepoint of its own.
fn one_by_one(
    conn: &mut Connection,
    group: Vec<Job>,
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Vec<(Done, Result<(), StoreError>)> {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(err) => return failed_all(group.into_iter().map(|job| job.done), &fail(err)),
    };
    let mut answers = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    while let Some(job) = jobs.next() {
        if tx.is_autocommit() {
            // SQLite rolled the whole transaction back (a full disk, an I/O
            // error): what was written is gone, and what follows would
            // commit alone. Everything of the group fails.
            let gone = StoreError::Backend("the group's transaction was rolled back by the database".into());
            let done = answers.into_iter().map(|(done, _)| done);
            return failed_all(
                done.chain(std::iter::once(job.done)).chain(jobs.map(|job| job.done)),
                &gone,
            );
        }
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
