//! Where snapshots are kept: each turn's [`Delta`] by run and step, and
//! each content once by its hash (a file that did not change costs
//! nothing; the same content in two files or two runs is kept once).
//! [`SqliteSnapshots`] keeps them in tables of the run database.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use crate::manifest::{Delta, Manifest};

/// A store refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("snapshot store: {0}")]
    Database(#[from] rusqlite::Error),
    /// A stored delta could not be read.
    #[error("snapshot store: a stored snapshot is damaged: {0}")]
    Damaged(#[from] serde_json::Error),
}

/// Where snapshots are kept.
pub trait SnapshotStore {
    /// Records the snapshot after `step` of `run`: its delta from the one
    /// before, with the contents it needs that are not kept yet.
    fn record(&mut self, run: &str, step: u32, delta: &Delta, contents: &[(String, Vec<u8>)])
        -> Result<(), StoreError>;

    /// The manifest after `step` of `run` (the deltas up to it, replayed),
    /// or `None` when that step was not recorded.
    fn manifest_at(&self, run: &str, step: u32) -> Result<Option<Manifest>, StoreError>;

    /// The content with `hash`.
    fn content(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Forgets `run`'s snapshots, and every content no other run needs.
    fn forget(&mut self, run: &str) -> Result<(), StoreError>;
}

/// Snapshots in SQLite tables.
#[derive(Debug)]
pub struct SqliteSnapshots {
    db: Connection,
}

impl SqliteSnapshots {
    /// The snapshots in the database at `path` (the tables made if missing).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Connection::open(path)?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS snapshot_contents (hash TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS snapshot_steps (
                 run_id TEXT NOT NULL, step INTEGER NOT NULL, delta TEXT NOT NULL,
                 PRIMARY KEY (run_id, step)) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS snapshot_uses (
                 run_id TEXT NOT NULL, hash TEXT NOT NULL,
                 PRIMARY KEY (run_id, hash)) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS snapshot_uses_hash ON snapshot_uses (hash);",
        )?;
        Ok(Self { db })
    }

    /// Bytes the database's pages hold (its size, less its free pages),
    /// whatever is still in the write-ahead log.
    pub fn bytes_used(&self) -> Result<u64, StoreError> {
        let pragma = |name: &str| -> Result<u64, StoreError> {
            Ok(self
                .db
                .query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))? as u64)
        };
        Ok((pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?)
    }
}

impl SnapshotStore for SqliteSnapshots {
    fn record(
        &mut self,
        run: &str,
        step: u32,
        delta: &Delta,
        contents: &[(String, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(delta)?;
        let tx = self.db.transaction()?;
        {
            let mut put = tx.prepare_cached("INSERT OR IGNORE INTO snapshot_contents (hash, data) VALUES (?1, ?2)")?;
            for (hash, data) in contents {
                if delta.changed.values().any(|entry| &entry.hash == hash) {
                    put.execute(params![hash, data])?;
                }
            }
            let mut uses = tx.prepare_cached("INSERT OR IGNORE INTO snapshot_uses (run_id, hash) VALUES (?1, ?2)")?;
            for entry in delta.changed.values() {
                uses.execute(params![run, entry.hash])?;
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO snapshot_steps (run_id, step, delta) VALUES (?1, ?2, ?3)",
            params![run, step, text],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn manifest_at(&self, run: &str, step: u32) -> Result<Option<Manifest>, StoreError> {
        let recorded: Option<u32> = self
            .db
            .query_row(
                "SELECT step FROM snapshot_steps WHERE run_id = ?1 AND step = ?2",
                params![run, step],
                |row| row.get(0),
            )
            .optional()?;
        if recorded.is_none() {
            return Ok(None);
        }
        let mut query = self
            .db
            .prepare_cached("SELECT delta FROM snapshot_steps WHERE run_id = ?1 AND step <= ?2 ORDER BY step")?;
        let mut manifest = Manifest::default();
        let rows = query.query_map(params![run, step], |row| row.get::<_, String>(0))?;
        for text in rows {
            let delta: Delta = serde_json::from_str(&text?)?;
            manifest.apply(&delta);
        }
        Ok(Some(manifest))
    }

    fn content(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .query_row(
                "SELECT data FROM snapshot_contents WHERE hash = ?1",
                params![hash],
                |row| row.get(0),
            )
            .optional()?)
    }

    fn forget(&mut self, run: &str) -> Result<(), StoreError> {
        let tx = self.db.transaction()?;
        tx.execute("DELETE FROM snapshot_steps WHERE run_id = ?1", params![run])?;
        tx.execute("DELETE FROM snapshot_uses WHERE run_id = ?1", params![run])?;
        tx.execute(
            "DELETE FROM snapshot_contents WHERE hash NOT IN (SELECT hash FROM snapshot_uses)",
            [],
        )?;
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{Filter, Scanner};

    #[test]
    fn snapshots_replay_to_each_step_keep_contents_once_and_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let mut store = SqliteSnapshots::open(&dir.path().join("db")).unwrap();
        let mut scanner = Scanner::new(&ws, Filter::default());
        std::fs::write(ws.join("a"), "same").unwrap();
        std::fs::write(ws.join("b"), "same").unwrap();
        let mut record = |store: &mut SqliteSnapshots, step: u32| {
            let scanned = scanner.scan().unwrap();
            store.record("r1", step, &scanned.delta, &scanned.contents).unwrap();
            scanner.manifest()
        };
        let zero = record(&mut store, 0);
        std::fs::write(ws.join("a"), "changed").unwrap();
        std::fs::remove_file(ws.join("b")).unwrap();
        let one = record(&mut store, 1);
        assert_eq!(store.manifest_at("r1", 0).unwrap(), Some(zero.clone()));
        assert_eq!(store.manifest_at("r1", 1).unwrap(), Some(one));
        assert_eq!(store.manifest_at("r1", 7).unwrap(), None);
        let count: i64 = store
            .db
            .query_row("SELECT COUNT(*) FROM snapshot_contents", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 2, "\"same\" twice is kept once");
        let hash = &zero.0["a"].hash;
        assert_eq!(store.content(hash).unwrap().as_deref(), Some(&b"same"[..]));
        store.forget("r1").unwrap();
        assert_eq!(store.content(hash).unwrap(), None);
    }
}
