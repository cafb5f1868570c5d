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
    /// Its commit must reach the disk before it is answered, even past a
    /// power cut (`synchronous = FULL` for its group).
    synced: bool,
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
                    let synced = group.iter().any(|job| job.synced);
                    let mut conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let answers = if synced {
                        synchronously(&mut conn, group, &fail)
                    } else {
                        commit(&mut conn, group, &fail)
                    };
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
        self.send(op, write, Done::Wake(done), false);
        result.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Like [`GroupCommit::write`], and the commit is synced to the disk
    /// (with every commit before it) before the answer.
    pub(crate) async fn write_synced(&self, op: &'static str, write: Write) -> Result<(), StoreError> {
        let (done, result) = oneshot::channel();
        self.send(op, write, Done::Wake(done), true);
        result.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Runs `write` in the next group; `done` hears of its commit (at once
    /// if the writer has stopped).
    pub(crate) fn write_then(&self, op: &'static str, write: Write, done: Done) {
        self.send(op, write, done, false);
    }

    fn send(&self, op: &'static str, write: Write, done: Done, synced: bool) {
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send(Job {
                write,
                done,
                synced,
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

/// The group's transaction under `synchronous = FULL`: its commit syncs
/// the log to the disk. (The setting cannot change inside a transaction,
/// so it is set around it.)
fn synchronously(
    conn: &mut Connection,
    group: Vec<Job>,
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Vec<(Done, Result<(), StoreError>)> {
    if let Err(err) = conn.pragma_update(None, "synchronous", "FULL") {
        return failed_all(group.into_iter().map(|job| job.done), &fail(err));
    }
    let answers = commit(conn, group, fail);
    if let Err(err) = conn.pragma_update(None, "synchronous", "NORMAL") {
        // Only slower: every commit syncs until the setting takes.
        tracing::warn!(error = %err, "the store's writer stays on synchronous = FULL");
    }
    answers
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

/// The same error for every one of `done` (typed: a lock held too long is
/// `Locked` to each of them).
fn failed_all(done: impl Iterator<Item = Done>, err: &StoreError) -> Vec<(Done, Result<(), StoreError>)> {
    done.map(|done| (done, Err(err.clone()))).collect()
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
        Err(err) => failed_all(answers.into_iter().map(|(done, _)| done), &fail(err)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    fn writer(dir: &std::path::Path) -> (GroupCommit, Arc<Mutex<Connection>>) {
        let path = dir.join("loom.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)").unwrap();
        let conn = Arc::new(Mutex::new(conn));
        let reader = Arc::new(Mutex::new(Connection::open(&path).unwrap()));
        let checkpointer =
            Arc::new(WalCheckpointer::start(&path, std::time::Duration::from_secs(1), conn.clone(), reader).unwrap());
        let group = GroupCommit::start(conn.clone(), checkpointer, |err| StoreError::Backend(err.to_string())).unwrap();
        (group, conn)
    }

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap()
    }

    #[tokio::test]
    async fn a_synced_write_commits_under_full_and_the_writer_goes_back_to_normal() {
        let dir = tempfile::tempdir().unwrap();
        let (group, conn) = writer(dir.path());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let during = seen.clone();
        group
            .write_synced(
                "synced",
                Box::new(move |tx| {
                    during.lock().unwrap().push(synchronous(tx));
                    tx.execute("INSERT INTO t (v) VALUES (1)", [])
                        .map(|_| ())
                        .map_err(|err| StoreError::Backend(err.to_string()))
                }),
            )
            .await
            .unwrap();
        let during = seen.clone();
        group
            .write(
                "normal",
                Box::new(move |tx| {
                    during.lock().unwrap().push(synchronous(tx));
                    Ok(())
                }),
            )
            .await
            .unwrap();
        // FULL is 2, NORMAL 1.
        assert_eq!(*seen.lock().unwrap(), vec![2, 1]);
        assert_eq!(synchronous(&conn.lock().unwrap()), 1);
    }

    #[tokio::test]
    async fn a_failed_write_is_undone_alone_and_its_error_keeps_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let (group, conn) = writer(dir.path());
        let insert = |v: i64| -> Write {
            Box::new(move |tx| {
                tx.execute("INSERT INTO t (v) VALUES (?1)", [v])
                    .map(|_| ())
                    .map_err(|err| StoreError::Backend(err.to_string()))
            })
        };
        let (first, second, third) = tokio::join!(
            group.write("a", insert(1)),
            group.write("b", Box::new(|_| Err(StoreError::NotFound("gone".into())))),
            group.write("c", insert(2)),
        );
        first.unwrap();
        assert!(matches!(second, Err(StoreError::NotFound(id)) if id == "gone"));
        third.unwrap();
        let rows: i64 = conn
            .lock()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 2);
    }
}
