//! Where snapshots are kept: each point (a step of a run) as the [`Delta`]
//! from its base point, and each content once by its hash (a file that did
//! not change costs nothing; the same content in two files or two runs is
//! kept once). [`SqliteSnapshots`] keeps them in a SQLite file beside the
//! run database.

use std::collections::HashSet;
use std::path::Path;

use loom_core::WriteFence;
use rusqlite::{params, Connection, OptionalExtension};

use crate::filter::FilterSpec;
use crate::manifest::{Delta, Manifest};

/// A store refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotStoreError {
    /// The database failed.
    #[error("snapshot store: {0}")]
    Database(#[from] rusqlite::Error),
    /// A store reached over the network failed (Redis).
    #[error("snapshot store: {0}")]
    Backend(String),
    /// The write was refused: the lease of the run it records was lost
    /// (another worker took the run over, or this one gave it up).
    #[error("snapshot store: run {0} is no longer this worker's: nothing of it is written")]
    Fenced(String),
    /// Another process changed the points this change was computed from
    /// (a sweep forgot a base, or recorded a point from one being
    /// forgotten): computed again, it goes through.
    #[error("snapshot store: changed meanwhile by another process: {0}")]
    Raced(String),
    /// A stored delta could not be read.
    #[error("snapshot store: a stored snapshot is damaged: {0}")]
    Damaged(#[from] serde_json::Error),
    /// A point's chain of bases is broken (a base is missing, or leads
    /// back to the point): its manifest cannot be made.
    #[error("snapshot store: the snapshot of step {step} of run {run} is damaged: {why}")]
    Broken {
        /// The run.
        run: String,
        /// The step.
        step: u32,
        /// What is wrong.
        why: &'static str,
    },
}

/// A recorded snapshot: a step of a run.
pub type Point = (String, u32);

/// A point to record.
#[derive(Debug, Clone, Copy)]
pub struct NewPoint<'a> {
    /// Its run.
    pub run: &'a str,
    /// Its step.
    pub step: u32,
    /// The point its delta is from (`None`: from an empty workspace).
    pub base: Option<&'a Point>,
    /// What changed from the base.
    pub delta: &'a Delta,
    /// Contents read, by hash: those the delta needs are kept.
    pub contents: &'a [(String, Vec<u8>)],
    /// Files in the workspace left out of it.
    pub left_out: &'a [String],
    /// The workspace it becomes the head of, if any.
    pub head_of: Option<&'a str>,
    /// The lease the run's writes are fenced by (a worker's): the point is
    /// written only while it holds, checked as it is written.
    pub fence: Option<&'a WriteFence>,
}

/// A point recorded again from another base ([`SnapshotStore::rebase`]).
#[derive(Debug, Clone)]
pub struct Rebased {
    /// The point.
    pub point: Point,
    /// Its new base.
    pub base: Option<Point>,
    /// The new base's depth plus one (0 without a base).
    pub depth: u32,
    /// What changed from the new base.
    pub delta: Delta,
}

/// Where snapshots are kept: the primitives each store implements, and
/// what is built on them (replaying a chain of deltas, recording a point
/// again, forgetting a run) once for all stores.
pub trait SnapshotStore: Send {
    /// Writes a point at `depth` (with the head it becomes, and the
    /// contents its delta needs that are not kept yet) in one atomic step,
    /// replacing the point if it was written before; refused
    /// ([`SnapshotStoreError::Fenced`]) when its fence no longer holds.
    fn put_point(&mut self, point: &NewPoint<'_>, depth: u32) -> Result<(), SnapshotStoreError>;

    /// The delta `step` of `run` was recorded as, and its base.
    fn delta_of(&self, run: &str, step: u32) -> Result<Option<(Delta, Option<Point>)>, SnapshotStoreError>;

    /// The files that were in the workspace but left out of the snapshot
    /// (too large, holding a secret, unreadable) at a point.
    fn left_out_at(&self, point: &Point) -> Result<Vec<String>, SnapshotStoreError>;

    /// How many bases a point's chain has (0: it is whole by itself).
    fn depth(&self, point: &Point) -> Result<Option<u32>, SnapshotStoreError>;

    /// The steps of `run` recorded, in order.
    fn steps(&self, run: &str) -> Result<Vec<u32>, SnapshotStoreError>;

    /// The content with `hash`.
    fn content(&self, hash: &str) -> Result<Option<Vec<u8>>, SnapshotStoreError>;

    /// The latest snapshot of the workspace known as `workspace`: its files
    /// as Loom last recorded (or restored) them.
    fn head(&self, workspace: &str) -> Result<Option<Point>, SnapshotStoreError>;

    /// Makes `point` the latest snapshot of `workspace`.
    fn set_head(&mut self, workspace: &str, point: &Point) -> Result<(), SnapshotStoreError>;

    /// The filter the workspace's snapshots were last taken with.
    fn filter_spec(&self, workspace: &str) -> Result<Option<FilterSpec>, SnapshotStoreError>;

    /// Records the filter the workspace's snapshots are taken with.
    fn set_filter_spec(&mut self, workspace: &str, spec: &FilterSpec) -> Result<(), SnapshotStoreError>;

    /// The points based on one of `points` (outside them).
    fn dependents(&self, points: &HashSet<Point>) -> Result<Vec<Point>, SnapshotStoreError>;

    /// Records points again from other bases, in one atomic step, under
    /// `fence` (the lease of the run whose record needed it, if any). A
    /// point gone meanwhile is left gone; a new base gone meanwhile
    /// refuses the whole ([`SnapshotStoreError::Raced`]).
    fn rebase(&mut self, rebased: &[Rebased], fence: Option<&WriteFence>) -> Result<(), SnapshotStoreError>;

    /// Removes `run`'s points and the heads at them, and every content no
    /// other run needs; refused ([`SnapshotStoreError::Raced`]) when a point of
    /// another run is based on one of them.
    fn remove_run(&mut self, run: &str) -> Result<(), SnapshotStoreError>;

    /// The workspace a point was recorded in (its name in the heads), where
    /// the store keeps it: a store several workspaces share does.
    fn recorded_in(&self, _point: &Point) -> Result<Option<String>, SnapshotStoreError> {
        Ok(None)
    }

    /// Bytes the store holds, where it can tell.
    fn bytes_used(&self) -> Result<Option<u64>, SnapshotStoreError> {
        Ok(None)
    }

    /// The name the workspace at `root` has in this store's heads: its
    /// path, for a store of one machine.
    fn workspace_key(&self, root: &Path) -> String {
        root.display().to_string()
    }

    /// Records a point (with the head it becomes, in the same atomic step),
    /// keeping the contents its delta needs that are not kept yet. A point
    /// recorded again (a resumed run's step) is replaced; the points based
    /// on it are first recorded again from its own base, so they stay what
    /// they were.
    fn record(&mut self, point: &NewPoint<'_>) -> Result<(), SnapshotStoreError> {
        if let Some(fence) = point.fence.filter(|fence| fence.guard.refuses_writes()) {
            // Given up: nothing of the run is sent, not even a rebase.
            fence.guard.count_refused(false);
            return Err(SnapshotStoreError::Fenced(fence.run_id.clone()));
        }
        if self.delta_of(point.run, point.step)?.is_some() {
            let this = HashSet::from([(point.run.to_string(), point.step)]);
            self.rebase_dependents(&this, point.fence)?;
        }
        let depth = match point.base {
            Some(base) => self.depth(base)?.unwrap_or(0) + 1,
            None => 0,
        };
        self.put_point(point, depth)
    }

    /// The manifest after `step` of `run` (the deltas of its chain of
    /// bases, replayed), or `None` when that step was not recorded.
    fn manifest_at(&self, run: &str, step: u32) -> Result<Option<Manifest>, SnapshotStoreError> {
        // The chain of bases back to a whole point, then replayed forwards.
        let mut chain = Vec::new();
        let mut seen: HashSet<Point> = HashSet::new();
        let mut point = Some((run.to_string(), step));
        while let Some(at) = point {
            let broken = |why| SnapshotStoreError::Broken {
                run: run.to_string(),
                step,
                why,
            };
            if !seen.insert(at.clone()) {
                return Err(broken("its bases lead back to it"));
            }
            let Some((delta, base)) = self.delta_of(&at.0, at.1)? else {
                if chain.is_empty() {
                    return Ok(None);
                }
                return Err(broken("a snapshot it is based on is missing"));
            };
            chain.push(delta);
            point = base;
        }
        let mut manifest = Manifest::default();
        for delta in chain.iter().rev() {
            manifest.apply(delta);
        }
        Ok(Some(manifest))
    }

    /// The points recorded from one of `points` (outside them): recorded
    /// again from the first base of their chain that is not one of
    /// `points`, so that `points` may be replaced or forgotten.
    fn rebase_dependents(
        &mut self,
        points: &HashSet<Point>,
        fence: Option<&WriteFence>,
    ) -> Result<(), SnapshotStoreError> {
        let mut attempts = 0;
        loop {
            match self.rebase_dependents_once(points, fence) {
                Err(SnapshotStoreError::Raced(_)) if attempts < 5 => attempts += 1,
                rebased => return rebased,
            }
        }
    }

    /// [`SnapshotStore::rebase_dependents`], once.
    fn rebase_dependents_once(
        &mut self,
        points: &HashSet<Point>,
        fence: Option<&WriteFence>,
    ) -> Result<(), SnapshotStoreError> {
        let mut rebased = Vec::new();
        for (other, step) in self.dependents(points)? {
            let Some(manifest) = self.manifest_at(&other, step)? else {
                continue;
            };
            let mut base = self.delta_of(&other, step)?.and_then(|(_, base)| base);
            while let Some(point) = base.clone().filter(|point| points.contains(point)) {
                base = self.delta_of(&point.0, point.1)?.and_then(|(_, base)| base);
            }
            let (from, depth) = match &base {
                Some(point) => (
                    self.manifest_at(&point.0, point.1)?.unwrap_or_default(),
                    self.depth(point)?.unwrap_or(0) + 1,
                ),
                None => (Manifest::default(), 0),
            };
            rebased.push(Rebased {
                point: (other, step),
                base,
                depth,
                delta: from.delta(&manifest),
            });
        }
        self.rebase(&rebased, fence)
    }

    /// Forgets `run`'s snapshots, and every content no other run needs;
    /// snapshots of other runs recorded from one of them are recorded
    /// again from what that one was based on, so they stay whole.
    fn forget(&mut self, run: &str) -> Result<(), SnapshotStoreError> {
        // A store shared by processes may get a point based on the run's
        // between the rebase and the removal: it refuses, and the new
        // point is rebased in turn.
        let mut attempts = 0;
        loop {
            let points: HashSet<Point> = self
                .steps(run)?
                .into_iter()
                .map(|step| (run.to_string(), step))
                .collect();
            self.rebase_dependents(&points, None)?;
            match self.remove_run(run) {
                Err(SnapshotStoreError::Raced(_)) if attempts < 5 => attempts += 1,
                removed => return removed,
            }
        }
    }
}

/// Snapshots in SQLite tables, written ahead-logged with `synchronous =
/// NORMAL` as the run store writes events: a snapshot survives a crash of
/// Loom; a power cut may take the last ones (their steps then cannot be
/// rewound to, and say so). One process writes them: fences are not
/// checked (they come with a cluster's store, [`Store::address`]).
///
/// [`Store::address`]: loom_core::Store::address
#[derive(Debug)]
pub struct SqliteSnapshots {
    db: Connection,
}

impl SqliteSnapshots {
    /// The snapshots in the database at `path` (the tables made if missing).
    pub fn open(path: &Path) -> Result<Self, SnapshotStoreError> {
        let db = Connection::open(path)?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS snapshot_contents (hash TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS snapshot_points (
                 run_id TEXT NOT NULL, step INTEGER NOT NULL,
                 base_run TEXT, base_step INTEGER, depth INTEGER NOT NULL, delta TEXT NOT NULL,
                 left_out TEXT NOT NULL DEFAULT '[]',
                 PRIMARY KEY (run_id, step)) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS snapshot_points_base ON snapshot_points (base_run, base_step);
             CREATE TABLE IF NOT EXISTS snapshot_uses (
                 run_id TEXT NOT NULL, hash TEXT NOT NULL,
                 PRIMARY KEY (run_id, hash)) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS snapshot_uses_hash ON snapshot_uses (hash);
             CREATE TABLE IF NOT EXISTS snapshot_heads (
                 workspace TEXT PRIMARY KEY, run_id TEXT NOT NULL, step INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS snapshot_settings (
                 workspace TEXT PRIMARY KEY, filter TEXT NOT NULL) WITHOUT ROWID;",
        )?;
        Ok(Self { db })
    }
}

impl SnapshotStore for SqliteSnapshots {
    /// Bytes the database's pages hold (its size, less its free pages),
    /// whatever is still in the write-ahead log.
    fn bytes_used(&self) -> Result<Option<u64>, SnapshotStoreError> {
        let pragma = |name: &str| -> Result<u64, SnapshotStoreError> {
            Ok(self
                .db
                .query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))? as u64)
        };
        Ok(Some(
            (pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?,
        ))
    }

    fn put_point(&mut self, point: &NewPoint<'_>, depth: u32) -> Result<(), SnapshotStoreError> {
        let NewPoint {
            run,
            step,
            base,
            delta,
            contents,
            left_out,
            head_of,
            fence: _,
        } = *point;
        let text = serde_json::to_string(delta)?;
        let needed: HashSet<&str> = delta.changed.values().map(|entry| entry.hash.as_str()).collect();
        let tx = self.db.transaction()?;
        {
            let mut put = tx.prepare_cached("INSERT OR IGNORE INTO snapshot_contents (hash, data) VALUES (?1, ?2)")?;
            for (hash, data) in contents {
                if needed.contains(hash.as_str()) {
                    put.execute(params![hash, data])?;
                }
            }
            let mut uses = tx.prepare_cached("INSERT OR IGNORE INTO snapshot_uses (run_id, hash) VALUES (?1, ?2)")?;
            for hash in &needed {
                uses.execute(params![run, hash])?;
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO snapshot_points (run_id, step, base_run, base_step, depth, delta, left_out)
               VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                run,
                step,
                base.map(|b| b.0.as_str()),
                base.map(|b| b.1),
                depth,
                text,
                serde_json::to_string(left_out)?
            ],
        )?;
        if let Some(workspace) = head_of {
            tx.execute(
                "INSERT OR REPLACE INTO snapshot_heads (workspace, run_id, step) VALUES (?1, ?2, ?3)",
                params![workspace, run, step],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn delta_of(&self, run: &str, step: u32) -> Result<Option<(Delta, Option<Point>)>, SnapshotStoreError> {
        let row = self
            .db
            .prepare_cached("SELECT delta, base_run, base_step FROM snapshot_points WHERE run_id = ?1 AND step = ?2")?
            .query_row(params![run, step], |row| {
                let base = match (row.get::<_, Option<String>>(1)?, row.get::<_, Option<u32>>(2)?) {
                    (Some(run), Some(step)) => Some((run, step)),
                    _ => None,
                };
                Ok((row.get::<_, String>(0)?, base))
            })
            .optional()?;
        match row {
            Some((text, base)) => Ok(Some((serde_json::from_str(&text)?, base))),
            None => Ok(None),
        }
    }

    fn left_out_at(&self, point: &Point) -> Result<Vec<String>, SnapshotStoreError> {
        let text: Option<String> = self
            .db
            .prepare_cached("SELECT left_out FROM snapshot_points WHERE run_id = ?1 AND step = ?2")?
            .query_row(params![point.0, point.1], |row| row.get(0))
            .optional()?;
        Ok(match text {
            Some(text) => serde_json::from_str(&text)?,
            None => Vec::new(),
        })
    }

    fn depth(&self, point: &Point) -> Result<Option<u32>, SnapshotStoreError> {
        Ok(self
            .db
            .prepare_cached("SELECT depth FROM snapshot_points WHERE run_id = ?1 AND step = ?2")?
            .query_row(params![point.0, point.1], |row| row.get(0))
            .optional()?)
    }

    fn steps(&self, run: &str) -> Result<Vec<u32>, SnapshotStoreError> {
        let mut query = self
            .db
            .prepare_cached("SELECT step FROM snapshot_points WHERE run_id = ?1 ORDER BY step")?;
        let steps = query.query_map(params![run], |row| row.get(0))?;
        Ok(steps.collect::<Result<_, _>>()?)
    }

    fn content(&self, hash: &str) -> Result<Option<Vec<u8>>, SnapshotStoreError> {
        Ok(self
            .db
            .query_row(
                "SELECT data FROM snapshot_contents WHERE hash = ?1",
                params![hash],
                |row| row.get(0),
            )
            .optional()?)
    }

    fn head(&self, workspace: &str) -> Result<Option<Point>, SnapshotStoreError> {
        let head: Option<Point> = self
            .db
            .query_row(
                "SELECT h.run_id, h.step FROM snapshot_heads h JOIN snapshot_points p
                   ON p.run_id = h.run_id AND p.step = h.step WHERE h.workspace = ?1",
                params![workspace],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        Ok(head)
    }

    fn set_head(&mut self, workspace: &str, point: &Point) -> Result<(), SnapshotStoreError> {
        self.db.execute(
            "INSERT OR REPLACE INTO snapshot_heads (workspace, run_id, step) VALUES (?1, ?2, ?3)",
            params![workspace, point.0, point.1],
        )?;
        Ok(())
    }

    fn filter_spec(&self, workspace: &str) -> Result<Option<FilterSpec>, SnapshotStoreError> {
        let text: Option<String> = self
            .db
            .query_row(
                "SELECT filter FROM snapshot_settings WHERE workspace = ?1",
                params![workspace],
                |row| row.get(0),
            )
            .optional()?;
        Ok(text.map(|text| serde_json::from_str(&text)).transpose()?)
    }

    fn set_filter_spec(&mut self, workspace: &str, spec: &FilterSpec) -> Result<(), SnapshotStoreError> {
        self.db.execute(
            "INSERT OR REPLACE INTO snapshot_settings (workspace, filter) VALUES (?1, ?2)",
            params![workspace, serde_json::to_string(spec)?],
        )?;
        Ok(())
    }

    fn dependents(&self, points: &HashSet<Point>) -> Result<Vec<Point>, SnapshotStoreError> {
        let mut dependents: Vec<Point> = Vec::new();
        let mut query = self
            .db
            .prepare_cached("SELECT run_id, step FROM snapshot_points WHERE base_run = ?1 AND base_step = ?2")?;
        for (run, step) in points {
            let rows = query.query_map(params![run, step], |row| Ok((row.get(0)?, row.get(1)?)))?;
            for row in rows {
                let point: Point = row?;
                if !points.contains(&point) {
                    dependents.push(point);
                }
            }
        }
        Ok(dependents)
    }

    fn rebase(&mut self, rebased: &[Rebased], _fence: Option<&WriteFence>) -> Result<(), SnapshotStoreError> {
        let tx = self.db.transaction()?;
        for Rebased {
            point: (other, step),
            base,
            depth,
            delta,
        } in rebased
        {
            tx.execute(
                "UPDATE snapshot_points SET base_run = ?3, base_step = ?4, depth = ?5, delta = ?6
                   WHERE run_id = ?1 AND step = ?2",
                params![
                    other,
                    step,
                    base.as_ref().map(|b| b.0.as_str()),
                    base.as_ref().map(|b| b.1),
                    depth,
                    serde_json::to_string(delta)?
                ],
            )?;
            for entry in delta.changed.values() {
                tx.execute(
                    "INSERT OR IGNORE INTO snapshot_uses (run_id, hash) VALUES (?1, ?2)",
                    params![other, entry.hash],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn remove_run(&mut self, run: &str) -> Result<(), SnapshotStoreError> {
        let tx = self.db.transaction()?;
        tx.execute("DELETE FROM snapshot_points WHERE run_id = ?1", params![run])?;
        tx.execute("DELETE FROM snapshot_uses WHERE run_id = ?1", params![run])?;
        tx.execute("DELETE FROM snapshot_heads WHERE run_id = ?1", params![run])?;
        tx.execute(
            "DELETE FROM snapshot_contents WHERE hash NOT IN (SELECT hash FROM snapshot_uses)",
            [],
        )?;
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::filter::Filter;
    use crate::scan::Scanner;

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
            let base = step.checked_sub(1).map(|before| ("r1".to_string(), before));
            store
                .record(&NewPoint {
                    run: "r1",
                    step,
                    base: base.as_ref(),
                    delta: &scanned.delta,
                    contents: &scanned.contents,
                    left_out: &[],
                    head_of: None,
                    fence: None,
                })
                .unwrap();
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

    /// A point of `scanned`, the head of nothing.
    pub(crate) fn point<'a>(
        run: &'a str,
        step: u32,
        base: Option<&'a Point>,
        scanned: &'a crate::scan::Scanned,
    ) -> NewPoint<'a> {
        NewPoint {
            run,
            step,
            base,
            delta: &scanned.delta,
            contents: &scanned.contents,
            left_out: &[],
            head_of: None,
            fence: None,
        }
    }

    #[test]
    fn forgetting_a_run_keeps_whole_the_runs_recorded_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let mut store = SqliteSnapshots::open(&dir.path().join("db")).unwrap();
        let mut scanner = Scanner::new(&ws, Filter::default());
        std::fs::write(ws.join("a"), "first").unwrap();
        std::fs::write(ws.join("b"), "kept").unwrap();
        let scanned = scanner.scan().unwrap();
        store.record(&point("r1", 0, None, &scanned)).unwrap();
        std::fs::write(ws.join("a"), "second").unwrap();
        let scanned = scanner.scan().unwrap();
        let base = ("r1".to_string(), 0);
        store.record(&point("r2", 0, Some(&base), &scanned)).unwrap();
        store.set_head("ws", &("r2".to_string(), 0)).unwrap();
        let before = store.manifest_at("r2", 0).unwrap().unwrap();
        assert_eq!(before.0.len(), 2);
        store.forget("r1").unwrap();
        assert_eq!(store.manifest_at("r2", 0).unwrap(), Some(before.clone()));
        assert_eq!(store.head("ws").unwrap(), Some(("r2".to_string(), 0)));
        let kept = &before.0["b"].hash;
        assert_eq!(
            store.content(kept).unwrap().as_deref(),
            Some(&b"kept"[..]),
            "r2 needs it still"
        );
        store.forget("r2").unwrap();
        assert_eq!(store.content(kept).unwrap(), None);
        assert_eq!(store.head("ws").unwrap(), None);
    }
}
