//! Workspace snapshots kept in the cluster's Redis beside its runs
//! (docs/rewind.md, docs/cluster.md): [`RedisSnapshots`] is a
//! [`loom_snapshot::SnapshotStore`], so the runs a worker executes can be
//! rewound from any gateway, and their files read there.
//!
//! Keys, under the store's prefix `{p}`: `{p}snap-point:{run}` a hash of
//! the run's points by step (each a JSON record of its base, depth, delta
//! and left-out files); `{p}snap-based:{run}` a set of the points based on
//! one of the run's (`RUN\nSTEP`); `{p}snap-uses:{run}` the content hashes
//! the run's points need, and `{p}snap-users:{hash}` the runs that need a
//! content; `{p}snap-content:{hash}` the content itself; `{p}snap-heads`
//! and `{p}snap-filters` hashes by workspace. A workspace's name is its
//! machine and its path: two machines' folders of one path are two
//! workspaces.
//!
//! A point written for a worker's run carries the run's lease: the script
//! that writes it checks the run's epoch in the same atomic step
//! (`scripts::FENCE`), so a worker that lost its run writes no snapshot.
//!
//! The store is called on a blocking thread (the snapshots' work is file
//! work): it speaks to Redis over a connection of its own, synchronously,
//! made again when it fails.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use loom_snapshot::{Delta, FilterSpec, NewPoint, Point, Rebased, SnapshotStore, SnapshotStoreError};
use redis::{Connection, Script};
use serde::{Deserialize, Serialize};

use crate::scripts;

/// How long a snapshot command may take (a point may carry megabytes).
const PATIENCE: Duration = Duration::from_secs(10);

/// A point as it is kept.
#[derive(Serialize, Deserialize)]
struct Stored {
    base: Option<Point>,
    depth: u32,
    delta: Delta,
    #[serde(default)]
    left_out: Vec<String>,
    /// The workspace it was recorded in (`MACHINE:PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace: Option<String>,
}

/// Snapshots in Redis.
pub struct RedisSnapshots {
    client: redis::Client,
    prefix: String,
    machine: String,
    conn: RefCell<Option<Connection>>,
    put_point: Script,
    rebase: Script,
    remove_run: Script,
}

impl std::fmt::Debug for RedisSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSnapshots")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn backend(err: redis::RedisError) -> SnapshotStoreError {
    if err.code() == Some("RACED") {
        return SnapshotStoreError::Raced(err.detail().unwrap_or_default().to_string());
    }
    if err.code() == Some("FENCED") {
        return SnapshotStoreError::Fenced(crate::errors::fenced_run(&err));
    }
    SnapshotStoreError::Backend(format!("redis: {err}"))
}

impl RedisSnapshots {
    /// The snapshots in the Redis at `url`, under the keys' `prefix` (the
    /// run store's), for workspaces on this machine. Connects when first
    /// used.
    pub fn new(url: &str, prefix: &str) -> Result<Self, SnapshotStoreError> {
        Ok(Self {
            client: redis::Client::open(url).map_err(backend)?,
            prefix: prefix.to_string(),
            machine: loom_core::owner::this_machine(),
            conn: RefCell::new(None),
            put_point: Script::new(&scripts::put_snapshot_point()),
            rebase: Script::new(&scripts::rebase_snapshots()),
            remove_run: Script::new(scripts::FORGET_SNAPSHOTS),
        })
    }

    /// Runs `work` on the connection (made if missing); a connection that
    /// failed is made again, and the work tried once more.
    fn with_conn<T>(&self, work: impl Fn(&mut Connection) -> redis::RedisResult<T>) -> Result<T, SnapshotStoreError> {
        let mut slot = self.conn.borrow_mut();
        for attempt in 0..2 {
            if slot.is_none() {
                let conn = self
                    .client
                    .get_connection_with_timeout(Duration::from_secs(2))
                    .and_then(|conn| {
                        conn.set_read_timeout(Some(PATIENCE))?;
                        conn.set_write_timeout(Some(PATIENCE))?;
                        Ok(conn)
                    })
                    .map_err(backend)?;
                *slot = Some(conn);
            }
            let Some(conn) = slot.as_mut() else {
                continue;
            };
            match work(conn) {
                Ok(value) => return Ok(value),
                Err(err) if attempt == 0 && (err.is_io_error() || err.is_connection_dropped() || err.is_timeout()) => {
                    *slot = None;
                }
                Err(err) => {
                    if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() {
                        *slot = None;
                    }
                    return Err(backend(err));
                }
            }
        }
        Err(SnapshotStoreError::Backend("redis: no connection".into()))
    }

    fn key(&self, kind: &str, id: &str) -> String {
        format!("{}snap-{kind}:{id}", self.prefix)
    }

    fn stored(&self, run: &str, step: u32) -> Result<Option<Stored>, SnapshotStoreError> {
        let text: Option<String> =
            self.with_conn(|conn| redis::cmd("HGET").arg(self.key("point", run)).arg(step).query(conn))?;
        Ok(text.map(|text| serde_json::from_str(&text)).transpose()?)
    }

    /// The fence argument of a write (`''`: none): refused here, before
    /// anything is sent, once the lease was given up.
    fn fence_arg(&self, fence: Option<&loom_core::WriteFence>) -> Result<String, SnapshotStoreError> {
        match fence {
            None => Ok(String::new()),
            Some(fence) if fence.guard.refuses_writes() => {
                fence.guard.count_refused(false);
                Err(SnapshotStoreError::Fenced(fence.run_id.clone()))
            }
            Some(fence) => Ok(format!("{} {}run:{}", fence.epoch, self.prefix, fence.run_id)),
        }
    }
}

fn member(point: &Point) -> String {
    format!("{}\n{}", point.0, point.1)
}

fn parse_member(member: &str) -> Option<Point> {
    let (run, step) = member.split_once('\n')?;
    Some((run.to_string(), step.parse().ok()?))
}

impl SnapshotStore for RedisSnapshots {
    fn put_point(&mut self, point: &NewPoint<'_>, depth: u32) -> Result<(), SnapshotStoreError> {
        let fence = self.fence_arg(point.fence)?;
        let record = serde_json::to_string(&Stored {
            base: point.base.cloned(),
            depth,
            delta: point.delta.clone(),
            left_out: point.left_out.to_vec(),
            workspace: point.head_of.map(str::to_string),
        })?;
        let needed: HashSet<&str> = point.delta.changed.values().map(|entry| entry.hash.as_str()).collect();
        let contents: Vec<&(String, Vec<u8>)> = point
            .contents
            .iter()
            .filter(|(hash, _)| needed.contains(hash.as_str()))
            .collect();
        let head = point.head_of.unwrap_or_default();
        let head_value = serde_json::to_string(&(point.run, point.step))?;
        let written = self.with_conn(|conn| {
            let mut invocation = self.put_point.prepare_invoke();
            invocation
                .arg(&self.prefix)
                .arg(point.run)
                .arg(point.step)
                .arg(&record)
                .arg(point.base.map(member).unwrap_or_default())
                .arg(head)
                .arg(&head_value)
                .arg(needed.len());
            for hash in &needed {
                invocation.arg(*hash);
            }
            invocation.arg(contents.len());
            for (hash, data) in &contents {
                invocation.arg(hash).arg(data.as_slice());
            }
            invocation.arg(&fence).invoke::<String>(conn)
        });
        if let (Err(SnapshotStoreError::Fenced(_)), Some(fence)) = (&written, point.fence) {
            fence.guard.count_refused(true);
        }
        written.map(|_| ())
    }

    fn delta_of(&self, run: &str, step: u32) -> Result<Option<(Delta, Option<Point>)>, SnapshotStoreError> {
        Ok(self.stored(run, step)?.map(|stored| (stored.delta, stored.base)))
    }

    fn left_out_at(&self, point: &Point) -> Result<Vec<String>, SnapshotStoreError> {
        Ok(self
            .stored(&point.0, point.1)?
            .map(|stored| stored.left_out)
            .unwrap_or_default())
    }

    fn depth(&self, point: &Point) -> Result<Option<u32>, SnapshotStoreError> {
        Ok(self.stored(&point.0, point.1)?.map(|stored| stored.depth))
    }

    fn recorded_in(&self, point: &Point) -> Result<Option<String>, SnapshotStoreError> {
        Ok(self.stored(&point.0, point.1)?.and_then(|stored| stored.workspace))
    }

    fn steps(&self, run: &str) -> Result<Vec<u32>, SnapshotStoreError> {
        let steps: Vec<String> = self.with_conn(|conn| redis::cmd("HKEYS").arg(self.key("point", run)).query(conn))?;
        let mut steps: Vec<u32> = steps.iter().filter_map(|step| step.parse().ok()).collect();
        steps.sort_unstable();
        Ok(steps)
    }

    fn content(&self, hash: &str) -> Result<Option<Vec<u8>>, SnapshotStoreError> {
        self.with_conn(|conn| redis::cmd("GET").arg(self.key("content", hash)).query(conn))
    }

    fn head(&self, workspace: &str) -> Result<Option<Point>, SnapshotStoreError> {
        let head: Option<String> = self.with_conn(|conn| {
            redis::cmd("HGET")
                .arg(format!("{}snap-heads", self.prefix))
                .arg(workspace)
                .query(conn)
        })?;
        let Some(head) = head else {
            return Ok(None);
        };
        let point: Point = serde_json::from_str(&head)?;
        // A head whose point was forgotten is no head.
        Ok(self.stored(&point.0, point.1)?.map(|_| point))
    }

    fn set_head(&mut self, workspace: &str, point: &Point) -> Result<(), SnapshotStoreError> {
        let value = serde_json::to_string(point)?;
        self.with_conn(|conn| {
            redis::cmd("HSET")
                .arg(format!("{}snap-heads", self.prefix))
                .arg(workspace)
                .arg(&value)
                .query::<()>(conn)
        })
    }

    fn filter_spec(&self, workspace: &str) -> Result<Option<FilterSpec>, SnapshotStoreError> {
        let text: Option<String> = self.with_conn(|conn| {
            redis::cmd("HGET")
                .arg(format!("{}snap-filters", self.prefix))
                .arg(workspace)
                .query(conn)
        })?;
        Ok(text.map(|text| serde_json::from_str(&text)).transpose()?)
    }

    fn set_filter_spec(&mut self, workspace: &str, spec: &FilterSpec) -> Result<(), SnapshotStoreError> {
        let value = serde_json::to_string(spec)?;
        self.with_conn(|conn| {
            redis::cmd("HSET")
                .arg(format!("{}snap-filters", self.prefix))
                .arg(workspace)
                .arg(&value)
                .query::<()>(conn)
        })
    }

    fn dependents(&self, points: &HashSet<Point>) -> Result<Vec<Point>, SnapshotStoreError> {
        let runs: HashSet<&str> = points.iter().map(|(run, _)| run.as_str()).collect();
        let mut found = Vec::new();
        for run in runs {
            let members: Vec<String> =
                self.with_conn(|conn| redis::cmd("SMEMBERS").arg(self.key("based", run)).query(conn))?;
            for point in members.iter().filter_map(|member| parse_member(member)) {
                if points.contains(&point) {
                    continue;
                }
                // The set says which points were once based on this run;
                // the point itself says on which step, now.
                let base = self.stored(&point.0, point.1)?.and_then(|stored| stored.base);
                if base.is_some_and(|base| points.contains(&base)) {
                    found.push(point);
                }
            }
        }
        Ok(found)
    }

    fn rebase(&mut self, rebased: &[Rebased], fence: Option<&loom_core::WriteFence>) -> Result<(), SnapshotStoreError> {
        if rebased.is_empty() {
            return Ok(());
        }
        let fence_arg = self.fence_arg(fence)?;
        let mut args: Vec<String> = vec![self.prefix.clone(), rebased.len().to_string()];
        for Rebased {
            point,
            base,
            depth,
            delta,
        } in rebased
        {
            // Gone meanwhile: the script leaves it gone.
            let Some(was) = self.stored(&point.0, point.1)? else {
                continue;
            };
            let record = serde_json::to_string(&Stored {
                base: base.clone(),
                depth: *depth,
                delta: delta.clone(),
                ..was
            })?;
            args.extend([
                point.0.clone(),
                point.1.to_string(),
                record,
                base.as_ref().map(member).unwrap_or_default(),
                delta.changed.len().to_string(),
            ]);
            args.extend(delta.changed.values().map(|entry| entry.hash.clone()));
        }
        let rebased = self.with_conn(|conn| {
            let mut invocation = self.rebase.prepare_invoke();
            for arg in &args {
                invocation.arg(arg);
            }
            invocation.arg(&fence_arg).invoke::<()>(conn)
        });
        if let (Err(SnapshotStoreError::Fenced(_)), Some(fence)) = (&rebased, fence) {
            fence.guard.count_refused(true);
        }
        rebased
    }

    fn remove_run(&mut self, run: &str) -> Result<(), SnapshotStoreError> {
        self.with_conn(|conn| {
            self.remove_run
                .prepare_invoke()
                .arg(&self.prefix)
                .arg(run)
                .invoke::<()>(conn)
        })
    }

    fn workspace_key(&self, root: &Path) -> String {
        loom_core::workspace_line(&self.machine, root)
    }
}

impl crate::store::RedisStore {
    /// Forgets the workspace snapshots of at most `limit` runs removed
    /// from the store (`{p}snap-forget`; each run's points based on theirs
    /// recorded again first), on a blocking thread. A run whose snapshots
    /// could not be forgotten stays in the set, for the next sweep.
    pub(crate) async fn forget_snapshots(&self, limit: usize) {
        let (url, prefix) = (self.url().to_string(), self.prefix().to_string());
        let forgotten = tokio::task::spawn_blocking(move || -> Result<usize, SnapshotStoreError> {
            let mut snapshots = RedisSnapshots::new(&url, &prefix)?;
            let pending = format!("{prefix}snap-forget");
            let runs: Vec<String> =
                snapshots.with_conn(|conn| redis::cmd("SRANDMEMBER").arg(&pending).arg(limit).query(conn))?;
            let mut forgotten = 0;
            for run in &runs {
                match snapshots.forget(run) {
                    Ok(()) => {
                        snapshots.with_conn(|conn| redis::cmd("SREM").arg(&pending).arg(run).query::<()>(conn))?;
                        forgotten += 1;
                    }
                    Err(err) => {
                        tracing::warn!(run_id = %run, error = %err, "cannot forget a removed run's snapshots yet")
                    }
                }
            }
            Ok(forgotten)
        })
        .await;
        match forgotten {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "cannot forget removed runs' snapshots yet"),
            Err(err) => tracing::warn!(error = %err, "forgetting removed runs' snapshots failed"),
        }
    }
}
