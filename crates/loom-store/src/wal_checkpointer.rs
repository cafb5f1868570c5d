//! Moving the write-ahead log into the database, off the writer's path.
//!
//! In WAL mode a commit appends pages to the `-wal` file; a checkpoint
//! copies them into the database file and syncs it. By default the
//! connection that commits runs the checkpoint once the log passes 1 000
//! pages — under load that is the group writer, every few commits, and
//! every write waiting behind it waits for the copy and the `fsync` too
//! (profiled: most of the writer's time). Here the writer never
//! checkpoints (`wal_autocheckpoint = 0`); this thread does, on a
//! connection of its own, a short while after commits (a page written by
//! many commits in that while is copied once).
//!
//! A checkpoint cannot copy the pages of a commit newer than the snapshot
//! a transaction in progress reads, and the log starts over only once a
//! checkpoint has copied all of it: a writer that is always in a
//! transaction would make the log grow without end (measured: 360 MB for
//! a thousand runs), and so would readers always reading. So each
//! checkpoint is done twice: first alongside the writer and the readers
//! (the bulk of the copying), then once more while holding the writer's
//! connection between two of its groups and the readers' between two
//! reads, which copies only what the last moment added. The writer's next
//! commit starts the log over. Between two of these the log holds what the
//! writer committed meanwhile (the gathering and the first copy): how much
//! that is depends on the machine's speed, so it is no bound to test
//! against; that the log starts over after each checkpoint is.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loom_core::StoreError;
use rusqlite::Connection;

/// How long commits gather before a checkpoint copies them.
const GATHER: Duration = Duration::from_millis(50);

/// The checkpointer of one database, told of commits by the writer.
#[derive(Debug)]
pub(crate) struct WalCheckpointer {
    committed: SyncSender<()>,
}

impl WalCheckpointer {
    /// Opens a connection of its own to `path` and starts the thread;
    /// `writer` is the connection the writer commits on, `reader` the one
    /// reads use (each held only to keep it between groups, or reads). The
    /// thread ends when the checkpointer is dropped.
    pub(crate) fn start(
        path: &Path,
        busy: Duration,
        writer: Arc<Mutex<Connection>>,
        reader: Arc<Mutex<Connection>>,
    ) -> Result<Self, StoreError> {
        let failed = |err: rusqlite::Error| StoreError::Backend(format!("{}: {err}", path.display()));
        let conn = Connection::open(path).map_err(failed)?;
        conn.busy_timeout(busy).map_err(failed)?;
        // One pending notice is enough: it means "there is something new".
        let (committed, notices) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("loom-store-checkpoint".into())
            .spawn(move || run(&conn, &writer, &reader, &notices))
            .map_err(|err| StoreError::Backend(format!("cannot start the store's checkpointer: {err}")))?;
        Ok(Self { committed })
    }

    /// Tells the checkpointer that a commit added to the log.
    pub(crate) fn committed(&self) {
        match self.committed.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

fn run(conn: &Connection, writer: &Mutex<Connection>, reader: &Mutex<Connection>, notices: &Receiver<()>) {
    while notices.recv().is_ok() {
        // Let the commits of the next moment join this checkpoint.
        std::thread::sleep(GATHER);
        let _ = notices.try_recv();
        copy_the_whole_log(conn, writer, reader);
    }
}

/// One checkpoint done twice (see the module's doc): once alongside the
/// writer and the readers, then between two of the writer's groups and two
/// reads, so the log is all in the database and the writer's next commit
/// starts it over, however busy the writer and the readers are.
fn copy_the_whole_log(conn: &Connection, writer: &Mutex<Connection>, reader: &Mutex<Connection>) {
    checkpoint(conn);
    // Always the writer's first: a read never waits for the writer's
    // connection, so the two cannot wait for each other.
    let between_groups = writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let between_reads = reader.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    checkpoint(conn);
    drop(between_reads);
    drop(between_groups);
}

fn checkpoint(conn: &Connection) {
    // A failure (the disk is full) leaves the pages in the log, where
    // readers and a restart still find them; the writer's own errors are
    // what callers hear about.
    if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %err, "the store's checkpoint failed; retrying after the next commit");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn open(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn
    }

    fn commit_a_row(writer: &Mutex<Connection>) {
        let conn = writer.lock().unwrap();
        conn.execute("INSERT INTO t (v) VALUES (randomblob(1000))", []).unwrap();
    }

    /// How many times the log has started over: the checkpoint sequence
    /// number in its header (https://www.sqlite.org/fileformat2.html#walformat).
    fn times_the_log_started_over(path: &Path) -> u32 {
        let log = std::fs::read(path.with_extension("db-wal")).unwrap();
        u32::from_be_bytes(log[12..16].try_into().unwrap())
    }

    #[test]
    fn after_a_checkpoint_the_writers_next_commit_starts_the_log_over_though_it_and_a_reader_were_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loom.db");
        let writer = Arc::new(Mutex::new(open(&path)));
        writer.lock().unwrap().execute_batch("CREATE TABLE t (v BLOB)").unwrap();
        let reader = Arc::new(Mutex::new(open(&path)));
        let checkpointer = open(&path);
        for _ in 0..10 {
            commit_a_row(&writer);
        }
        // A read in progress, its snapshot older than the commits that
        // follow: a checkpoint alongside it cannot copy those.
        let read = reader.lock().unwrap();
        read.execute_batch("BEGIN").unwrap();
        let _: i64 = read.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0)).unwrap();
        // A writer always busy: one commit after another until the end.
        let writing = Arc::new(AtomicBool::new(true));
        let busy = {
            let (writer, writing) = (writer.clone(), writing.clone());
            std::thread::spawn(move || {
                while writing.load(Ordering::Relaxed) {
                    commit_a_row(&writer);
                    // As the group writer does between groups: let a
                    // thread waiting for the connection have it.
                    std::thread::yield_now();
                }
            })
        };
        for _ in 0..10 {
            commit_a_row(&writer);
        }
        let before = times_the_log_started_over(&path);
        let copying = {
            let (writer, reader) = (writer.clone(), reader.clone());
            std::thread::spawn(move || copy_the_whole_log(&checkpointer, &writer, &reader))
        };
        // Only so that, on most machines, the checkpoint meets the read in
        // progress; the outcome must be the same when it does not.
        std::thread::sleep(Duration::from_millis(100));
        read.execute_batch("COMMIT").unwrap();
        drop(read);
        copying.join().unwrap();
        commit_a_row(&writer);
        writing.store(false, Ordering::Relaxed);
        busy.join().unwrap();
        assert_eq!(
            times_the_log_started_over(&path),
            before + 1,
            "the log did not start over after the checkpoint"
        );
    }
}
