//! One workspace's snapshots, as the engine asks for them
//! ([`loom_core::WorkspaceSnapshots`]): a scanner that knows the files as
//! the last snapshot left them, and a SQLite file beside the run store.
//!
//! Each point is stored as the delta from a *base*: the step before it of
//! the same run, or — for a run's step 0, and when a step before was not
//! recorded — the workspace's *head*, the latest point recorded or
//! restored. A new run thus costs what changed since the last one, not a
//! copy of the workspace; every [`KEYFRAME_DEPTH`] points in a chain one is
//! stored whole, so reading a point never replays a workspace's history.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use loom_core::{async_trait, RestorePlan, SkippedFile, SnapshotError, StepFiles, WorkspaceSnapshots, WriteFence};

use crate::filter::Filter;
use crate::manifest::{Delta, Manifest};
use crate::restore::{apply, changed_outside, Plan, RestoreError};
use crate::scan::Scanner;
use crate::store::{NewPoint, Point, SnapshotStore, SqliteSnapshots};
use sha2::Digest;

/// A chain this long ends in a point stored whole.
pub const KEYFRAME_DEPTH: u32 = 64;

/// The snapshots of the workspace at one folder.
#[derive(Clone)]
pub struct Snapshots {
    root: PathBuf,
    /// The workspace's name in the store's heads.
    key: String,
    /// The file whose lock keeps restores of the workspace one at a time.
    lock: PathBuf,
    /// The file runs executing in the workspace hold shared, and a restore
    /// alone (`<lock>-runs`).
    runs_lock: PathBuf,
    /// The files the snapshots are kept in (none for a store elsewhere).
    files: Vec<PathBuf>,
    filter: Filter,
    /// Whether scans use the kernel's watches.
    watch: bool,
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    store: Box<dyn SnapshotStore>,
    /// Made at the first scan, from the head; dropped after a failure, so
    /// the next scan starts again from what is stored.
    scanner: Option<Scanner>,
    /// The point the scanner's files are: a delta from it is the scan's.
    scanner_at: Option<Point>,
    /// Contents read by scans that recorded nothing (a restore's plan):
    /// the next record may need them, as the scanner will not read those
    /// files again.
    unrecorded: Vec<(String, Vec<u8>)>,
    /// The next scanner reads every file, trusting nothing it would know
    /// from the head: a record failed (a content the store lacks, perhaps),
    /// or the point the scanner knew was forgotten.
    distrust: bool,
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshots")
            .field("root", &self.root)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn failed(err: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Failed(err.to_string())
}

fn refused(record: crate::validate::Refused) -> SnapshotError {
    SnapshotError::Refused(record.to_string())
}

/// A SQLite file's companions: what Loom's protected paths must hold.
pub fn database_files(db: &Path) -> Vec<PathBuf> {
    let name = db
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    ["", "-wal", "-shm", "-journal", ".lock", ".lock-runs"]
        .iter()
        .map(|suffix| db.with_file_name(format!("{name}{suffix}")))
        .collect()
}

/// The SQLite store at `db`, its folder made if missing.
fn sqlite(db: &Path) -> Result<Box<dyn SnapshotStore>, SnapshotError> {
    if let Some(parent) = db.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|err| failed(format!("{}: {err}", parent.display())))?;
    }
    Ok(Box::new(SqliteSnapshots::open(db).map_err(failed)?))
}

/// `<lock>-runs`: the lock runs executing in the workspace share (a
/// restore takes it alone).
pub fn runs_lock_of(lock: &Path) -> PathBuf {
    let name = lock
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    lock.with_file_name(format!("{name}-runs"))
}

/// A lock file, made owner-only if missing.
fn open_lock(path: &Path) -> Result<std::fs::File, SnapshotError> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).truncate(false).write(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|err| failed(format!("{}: {err}", path.display())))
}

/// What is at `path` beneath `root` when it is reached through folders
/// only (a link on the way: nothing is there, for the restore replaces it).
fn beneath_without_links(root: &Path, path: &str) -> Option<std::fs::Metadata> {
    let mut at = root.to_path_buf();
    let mut parts = path.split('/').peekable();
    while let Some(part) = parts.next() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at).ok()?;
        if parts.peek().is_none() {
            return Some(meta);
        }
        if !meta.is_dir() {
            return None;
        }
    }
    None
}

/// `<db>.lock`.
fn lock_beside(db: &Path) -> PathBuf {
    let name = db
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    db.with_file_name(format!("{name}.lock"))
}

impl Snapshots {
    /// The snapshots of the workspace at `root` (canonicalized), kept in the
    /// SQLite file `db`, holding the files `filter` admits (recorded with
    /// them, for [`Snapshots::open_as_recorded`]).
    pub fn open(root: &Path, db: &Path, filter: Filter) -> Result<Self, SnapshotError> {
        Self::open_in(root, sqlite(db)?, &lock_beside(db), filter).map(|opened| opened.keeping_files(db))
    }

    /// The same, with the filter the workspace's snapshots were taken with
    /// (else `fallback`): what a rewind judges the workspace by.
    pub fn open_as_recorded(root: &Path, db: &Path, fallback: Filter) -> Result<Self, SnapshotError> {
        Self::open_in_as_recorded(root, sqlite(db)?, &lock_beside(db), fallback).map(|opened| opened.keeping_files(db))
    }

    /// The snapshots of the workspace at `root`, kept in `store` (a
    /// cluster's, shared by machines), restores of this workspace kept one
    /// at a time across this machine's processes by a lock on the file
    /// `lock`.
    pub fn open_in(
        root: &Path,
        store: Box<dyn SnapshotStore>,
        lock: &Path,
        filter: Filter,
    ) -> Result<Self, SnapshotError> {
        let snapshots = Self::opened(root, store, lock, filter)?;
        {
            let mut inner = snapshots.lock()?;
            let spec = snapshots.filter.spec().clone();
            if inner.store.filter_spec(&snapshots.key).map_err(failed)?.as_ref() != Some(&spec) {
                inner.store.set_filter_spec(&snapshots.key, &spec).map_err(failed)?;
            }
        }
        Ok(snapshots)
    }

    /// [`Snapshots::open_in`] with the filter the workspace's snapshots
    /// were taken with (else `fallback`).
    pub fn open_in_as_recorded(
        root: &Path,
        store: Box<dyn SnapshotStore>,
        lock: &Path,
        fallback: Filter,
    ) -> Result<Self, SnapshotError> {
        let mut snapshots = Self::opened(root, store, lock, fallback)?;
        let recorded = snapshots.lock()?.store.filter_spec(&snapshots.key).map_err(failed)?;
        if let Some(spec) = recorded {
            let never = snapshots.filter.clone();
            snapshots.filter = Filter::from_spec(&spec).map_err(failed)?.with_never_of(&never);
        }
        Ok(snapshots)
    }

    fn opened(root: &Path, store: Box<dyn SnapshotStore>, lock: &Path, filter: Filter) -> Result<Self, SnapshotError> {
        let root = root
            .canonicalize()
            .map_err(|err| failed(format!("{}: {err}", root.display())))?;
        if let Some(parent) = lock.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|err| failed(format!("{}: {err}", parent.display())))?;
        }
        let runs_lock = runs_lock_of(lock);
        Ok(Self {
            key: store.workspace_key(&root),
            root,
            files: vec![lock.to_path_buf(), runs_lock.clone()],
            runs_lock,
            lock: lock.to_path_buf(),
            filter,
            watch: true,
            inner: Arc::new(Mutex::new(Inner {
                store,
                scanner: None,
                scanner_at: None,
                unrecorded: Vec::new(),
                distrust: false,
            })),
        })
    }

    /// Its SQLite file's companions join the files it keeps.
    fn keeping_files(mut self, db: &Path) -> Self {
        self.files = database_files(db);
        self
    }

    /// Without the kernel's watches (`[snapshots] watch = false`): every
    /// scan walks the whole workspace — for file systems whose changes the
    /// kernel does not report (a network file system changed from another
    /// machine).
    pub fn without_watches(mut self) -> Self {
        self.watch = false;
        self
    }

    /// The workspace's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Records the workspace as `step` of `run` now, on this thread. After
    /// a failure the scanner is dropped: the next record reads the
    /// workspace again against what is stored, so nothing a failed scan
    /// saw is lost.
    pub fn record_now(&self, run: &str, step: u32, fence: Option<&WriteFence>) -> Result<StepFiles, SnapshotError> {
        let mut inner = self.lock()?;
        let recorded = self.record_locked(&mut inner, run, step, fence);
        if recorded.is_err() {
            inner.scanner = None;
            inner.scanner_at = None;
            inner.distrust = true;
        }
        recorded
    }

    fn record_locked(
        &self,
        inner: &mut Inner,
        run: &str,
        step: u32,
        fence: Option<&WriteFence>,
    ) -> Result<StepFiles, SnapshotError> {
        let this = (run.to_string(), step);
        let base = self.base_of(inner.store.as_ref(), &this)?;
        if base.is_none() && inner.scanner_at.is_some() {
            // The point the scanner knew is gone (forgotten with its run):
            // contents of files it would not read again may be gone too.
            inner.scanner = None;
            inner.scanner_at = None;
            inner.distrust = true;
        }
        self.ensure_scanner(inner)?;
        let Inner {
            store,
            scanner,
            scanner_at,
            unrecorded,
            distrust: _,
        } = inner;
        let Some(scanner) = scanner.as_mut() else {
            return Err(failed("the workspace's scanner could not be made"));
        };
        let mut scanned = scanner.scan().map_err(failed)?;
        let mut keyframe = match &base {
            Some(point) => store.depth(point).map_err(failed)?.unwrap_or(0) + 1 >= KEYFRAME_DEPTH,
            None => true,
        };
        let (base, delta) = if keyframe {
            (None, Manifest::default().delta(&scanner.manifest()))
        } else if *scanner_at == base {
            (base, std::mem::take(&mut scanned.delta))
        } else {
            let from = match &base {
                Some((base_run, base_step)) => store.manifest_at(base_run, *base_step),
                None => Ok(None),
            };
            match from {
                Ok(from) => (base, from.unwrap_or_default().delta(&scanner.manifest())),
                // A base whose chain is broken (a base of it forgotten by
                // another process meanwhile): this point is stored whole.
                Err(crate::store::SnapshotStoreError::Broken { .. }) => {
                    keyframe = true;
                    (None, Manifest::default().delta(&scanner.manifest()))
                }
                Err(err) => return Err(failed(err)),
            }
        };
        // A keyframe or a slow path may name files this scan did not read:
        // their contents are stored already, or were kept back by a plan.
        scanned.contents.append(unrecorded);
        let mut left_out: Vec<String> = scanner.left_out().map(|(path, _)| path.to_string()).collect();
        left_out.sort();
        store
            .record(&NewPoint {
                run,
                step,
                base: base.as_ref(),
                delta: &delta,
                contents: &scanned.contents,
                left_out: &left_out,
                head_of: Some(&self.key),
                fence,
            })
            .map_err(failed)?;
        *scanner_at = Some(this);
        Ok(step_files(
            &delta_for_event(&delta, keyframe, scanned.delta),
            scanned.skipped.into_iter().map(|skipped| SkippedFile {
                path: skipped.path,
                bytes: skipped.bytes,
                reason: skipped.reason,
            }),
        ))
    }

    /// A point's base: the run's step before (when recorded), else the
    /// head — never the point itself or one based on it (a resumed run's
    /// step recorded again takes the base it had).
    fn base_of(&self, store: &dyn SnapshotStore, this: &Point) -> Result<Option<Point>, SnapshotError> {
        let before = this.1.checked_sub(1).map(|before| (this.0.clone(), before));
        // The step before, if recorded here: a run taken over by a worker
        // of another folder has its earlier steps there.
        let here = |point: &Point| -> Result<bool, SnapshotError> {
            Ok(store.delta_of(&point.0, point.1).map_err(failed)?.is_some()
                && store
                    .recorded_in(point)
                    .map_err(failed)?
                    .is_none_or(|workspace| workspace == self.key))
        };
        let mut base = match before {
            Some(point) if here(&point)? => Some(point),
            _ => store.head(&self.key).map_err(failed)?,
        };
        if base.as_ref() == Some(this) {
            base = store
                .delta_of(&this.0, this.1)
                .map_err(failed)?
                .and_then(|(_, base)| base);
        }
        Ok(base)
    }

    /// The scanner, made from the head when missing: its first scan reads
    /// every file once and tells what differs from the head.
    fn ensure_scanner(&self, inner: &mut Inner) -> Result<(), SnapshotError> {
        if inner.scanner.is_some() {
            return Ok(());
        }
        let head = inner.store.head(&self.key).map_err(failed)?;
        let distrust = std::mem::take(&mut inner.distrust);
        let manifest = match &head {
            // Distrusted, the head is not even read: its chain may be what failed.
            Some((run, step)) if !distrust => inner.store.manifest_at(run, *step).map_err(|err| {
                inner.distrust = true;
                failed(err)
            })?,
            _ => None,
        };
        let (scanner, knows_head) = match &manifest {
            Some(manifest) => (Scanner::knowing(&self.root, self.filter.clone(), manifest), true),
            // Its first scan is from nothing: no point is what it knows.
            None => (Scanner::new(&self.root, self.filter.clone()), false),
        };
        inner.scanner = Some(if self.watch { scanner } else { scanner.without_watches() });
        inner.scanner_at = head.filter(|_| knows_head);
        Ok(())
    }

    /// The workspace's files now (a scan that is no point: the next
    /// record diffs against its base instead of trusting the scan), and
    /// the files it leaves out.
    fn files_now(&self, inner: &mut Inner) -> Result<(Manifest, Vec<String>), SnapshotError> {
        self.ensure_scanner(inner)?;
        let Some(scanner) = inner.scanner.as_mut() else {
            return Err(failed("the workspace's scanner could not be made"));
        };
        let scanned = match scanner.scan() {
            Ok(scanned) => scanned,
            Err(err) => {
                inner.scanner = None;
                inner.scanner_at = None;
                return Err(failed(err));
            }
        };
        let now = scanner.manifest();
        let left_out = scanner.left_out().map(|(path, _)| path.to_string()).collect();
        inner.unrecorded.extend(scanned.contents);
        inner.scanner_at = None;
        Ok((now, left_out))
    }

    fn target(store: &dyn SnapshotStore, run: &str, step: u32) -> Result<Manifest, SnapshotError> {
        store
            .manifest_at(run, step)
            .map_err(failed)?
            .ok_or_else(|| SnapshotError::NotRecorded {
                run_id: run.to_string(),
                step,
            })
    }

    /// What restoring `step` of `run` changes here or in `into`, with the
    /// snapshot it restores. Files the plan would change that are not as
    /// Loom last recorded them — or that the snapshots do not hold (too
    /// large, holding a secret, unreadable) — are changed outside Loom.
    fn plan_now(
        &self,
        inner: &mut Inner,
        run: &str,
        step: u32,
        into: Option<&Path>,
    ) -> Result<(RestorePlan, Plan, Manifest), SnapshotError> {
        let target = Self::target(inner.store.as_ref(), run, step)?;
        // A record this workspace's scans could not have written (one that
        // whoever reaches a shared store wrote) refuses the whole restore
        // before anything is read or written (docs/rewind.md, "Safety").
        crate::validate::manifest(&target, &self.filter).map_err(refused)?;
        let recorded_in = inner.store.recorded_in(&(run.to_string(), step)).map_err(failed)?;
        if let Some(workspace) = recorded_in.filter(|workspace| into.is_none() && *workspace != self.key) {
            // Another folder's files, restored here, would remove this one's.
            return Err(SnapshotError::Elsewhere {
                run_id: run.to_string(),
                step,
                workspace,
            });
        }
        let (now, last, left_out) = match into {
            Some(into) => {
                let mut scanner = Scanner::new(into, self.filter.clone()).without_watches();
                scanner.scan().map_err(failed)?;
                let now = scanner.manifest();
                let left_out = scanner.left_out().map(|(path, _)| path.to_string()).collect();
                (now.clone(), now, left_out)
            }
            None => {
                let (now, left_out) = self.files_now(inner)?;
                let last = match inner.store.head(&self.key).map_err(failed)? {
                    Some((head_run, head_step)) => inner
                        .store
                        .manifest_at(&head_run, head_step)
                        .map_err(failed)?
                        .unwrap_or_default(),
                    None => now.clone(),
                };
                (now, last, left_out)
            }
        };
        let mut plan = Plan::between(&now, &target);
        // A file the snapshot does not hold was not necessarily absent then:
        // ignored by the `.gitignore` of that time, excluded, or left out.
        // It is not removed (its content then is nowhere to bring back).
        let untracked = Untracked::at(
            inner.store.as_ref(),
            &self.root,
            &self.filter,
            &target,
            &(run.to_string(), step),
        )?;
        plan.remove.retain(|path| !untracked.covers(path));
        // A file the plan writes that is there but not tracked now (ignored
        // or excluded since): as the step had it, nothing to write; else
        // its content is in no snapshot, and writing over it loses it.
        let root = into.unwrap_or(&self.root);
        let mut untracked_now = Vec::new();
        plan.write.retain(|path| {
            if now.0.contains_key(path) {
                return true;
            }
            let Some(meta) = beneath_without_links(root, path) else {
                return true;
            };
            let same = meta.is_file()
                && target.0.get(path).is_some_and(|entry| {
                    !entry.link
                        && entry.size == meta.len()
                        && entry.mode
                            == std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
                                & crate::manifest::PERMISSION_BITS
                        && std::fs::read(root.join(path))
                            .is_ok_and(|content| crate::scan::hex(&sha2::Sha256::digest(&content)) == entry.hash)
                });
            if !same {
                untracked_now.push(path.clone());
            }
            !same
        });
        let mut outside = changed_outside(&plan, &now, &last);
        outside.extend(untracked_now);
        outside.extend(plan.write.iter().filter(|path| left_out.contains(*path)).cloned());
        outside.sort();
        outside.dedup();
        let told = RestorePlan {
            write: plan.write.clone(),
            remove: plan.remove.clone(),
            changed_outside: outside,
        };
        Ok((told, plan, target))
    }

    /// An exclusive lock on its lock file (`<db>.lock`), held while it lives: restores of
    /// this workspace's snapshots by other processes wait for it.
    fn exclusive(&self) -> Result<std::fs::File, SnapshotError> {
        let file = open_lock(&self.lock)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|err| failed(format!("{}: {err}", self.lock.display())))?;
        Ok(file)
    }

    /// The runs' lock, alone and without waiting: refused
    /// ([`SnapshotError::InUse`]) while a run executing in the workspace
    /// holds it.
    fn alone(&self) -> Result<std::fs::File, SnapshotError> {
        let file = open_lock(&self.runs_lock)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(file),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(SnapshotError::InUse),
            Err(err) => Err(failed(format!("{}: {err}", self.runs_lock.display()))),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, SnapshotError> {
        self.inner
            .lock()
            .map_err(|_| failed("the snapshot store was poisoned by a panic"))
    }

    /// Bytes the snapshot store holds, where it can tell
    /// ([`SqliteSnapshots::bytes_used`]).
    pub fn bytes_used(&self) -> Result<Option<u64>, SnapshotError> {
        self.lock()?.store.bytes_used().map_err(failed)
    }

    /// Runs `work` on a blocking thread.
    async fn off_thread<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Snapshots) -> Result<T, SnapshotError> + Send + 'static,
    ) -> Result<T, SnapshotError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || work(&this))
            .await
            .map_err(|err| failed(format!("the snapshot task failed: {err}")))?
    }
}

/// The files a point did not track though they may have been there: left
/// out of it (too large, holding a secret, unreadable), excluded by the
/// filter, or ignored by the `.gitignore` files it holds.
struct Untracked {
    left_out: std::collections::HashSet<String>,
    filter: Filter,
    ignores: Vec<ignore::gitignore::Gitignore>,
    root: PathBuf,
}

impl Untracked {
    fn at(
        store: &dyn SnapshotStore,
        root: &Path,
        filter: &Filter,
        target: &Manifest,
        point: &Point,
    ) -> Result<Self, SnapshotError> {
        let mut ignores = Vec::new();
        for (path, entry) in &target.0 {
            let folder = match path.strip_suffix(".gitignore") {
                Some(folder) if folder.is_empty() || folder.ends_with('/') => folder,
                _ => continue,
            };
            let Some(content) = store.content(&entry.hash).map_err(failed)? else {
                continue;
            };
            let mut rules = ignore::gitignore::GitignoreBuilder::new(root.join(folder));
            for line in String::from_utf8_lossy(&content).lines() {
                // A rule the parser refuses is a rule git ignores too.
                let _ = rules.add_line(None, line);
            }
            if let Ok(rules) = rules.build() {
                ignores.push(rules);
            }
        }
        Ok(Self {
            left_out: store.left_out_at(point).map_err(failed)?.into_iter().collect(),
            filter: filter.clone(),
            ignores,
            root: root.to_path_buf(),
        })
    }

    fn covers(&self, path: &str) -> bool {
        let full = self.root.join(path);
        self.left_out.contains(path)
            || !self.filter.admits(path)
            || self.ignores.iter().any(|rules| {
                full.starts_with(rules.path()) && rules.matched_path_or_any_parents(&full, false).is_ignore()
            })
    }
}

/// What a point tells in its event: a keyframe's stored delta holds every
/// file, so the scan's own change is told instead.
fn delta_for_event(stored: &Delta, keyframe: bool, scanned: Delta) -> Delta {
    if keyframe {
        scanned
    } else {
        stored.clone()
    }
}

fn step_files(delta: &Delta, skipped: impl Iterator<Item = SkippedFile>) -> StepFiles {
    StepFiles {
        changed: delta.changed.keys().cloned().collect(),
        removed: delta.removed.iter().cloned().collect(),
        skipped: skipped.collect(),
    }
}

#[async_trait]
impl WorkspaceSnapshots for Snapshots {
    async fn record(&self, run_id: &str, step: u32, fence: Option<&WriteFence>) -> Result<StepFiles, SnapshotError> {
        let (run, fence) = (run_id.to_string(), fence.cloned());
        self.off_thread(move |this| this.record_now(&run, step, fence.as_ref()))
            .await
    }

    async fn recorded(&self, run_id: &str, step: u32) -> Result<bool, SnapshotError> {
        let run = run_id.to_string();
        self.off_thread(move |this| Ok(this.lock()?.store.delta_of(&run, step).map_err(failed)?.is_some()))
            .await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<u32>, SnapshotError> {
        let run = run_id.to_string();
        self.off_thread(move |this| this.lock()?.store.steps(&run).map_err(failed))
            .await
    }

    async fn step_files(&self, run_id: &str, step: u32) -> Result<StepFiles, SnapshotError> {
        let run = run_id.to_string();
        self.off_thread(move |this| {
            let inner = this.lock()?;
            let after = Self::target(inner.store.as_ref(), &run, step)?;
            // What the step changed from the point before it (its stored
            // delta may be a whole keyframe).
            let before = match step.checked_sub(1) {
                Some(before) => inner.store.manifest_at(&run, before).map_err(failed)?,
                None => match inner
                    .store
                    .delta_of(&run, step)
                    .map_err(failed)?
                    .and_then(|(_, base)| base)
                {
                    Some((base_run, base_step)) => inner.store.manifest_at(&base_run, base_step).map_err(failed)?,
                    None => None,
                },
            };
            Ok(step_files(
                &before.unwrap_or_default().delta(&after),
                std::iter::empty(),
            ))
        })
        .await
    }

    async fn file_at(&self, run_id: &str, step: u32, path: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        let (run, path) = (run_id.to_string(), path.to_string());
        self.off_thread(move |this| {
            let inner = this.lock()?;
            let target = Self::target(inner.store.as_ref(), &run, step)?;
            match target.0.get(&path) {
                Some(entry) => inner.store.content(&entry.hash).map_err(failed),
                None => Ok(None),
            }
        })
        .await
    }

    async fn plan(&self, run_id: &str, step: u32, into: Option<&Path>) -> Result<RestorePlan, SnapshotError> {
        let (run, into) = (run_id.to_string(), into.map(Path::to_path_buf));
        self.off_thread(move |this| {
            let mut inner = this.lock()?;
            Ok(this.plan_now(&mut inner, &run, step, into.as_deref())?.0)
        })
        .await
    }

    async fn restore(
        &self,
        run_id: &str,
        step: u32,
        into: Option<&Path>,
        force: bool,
    ) -> Result<RestorePlan, SnapshotError> {
        let (run, into) = (run_id.to_string(), into.map(Path::to_path_buf));
        self.off_thread(move |this| {
            // One restore at a time across processes (two `loom runs rewind`
            // at once would interleave their files), and in this one.
            let _exclusive = this.exclusive()?;
            // In place, only while no run executes in the workspace (in
            // any process of this machine); runs starting wait for it.
            let _alone = match into {
                None => Some(this.alone()?),
                Some(_) => None,
            };
            let mut inner = this.lock()?;
            // Judged again under the lock the restore holds: a change made
            // since the caller's plan is not lost unasked.
            let (told, plan, target) = this.plan_now(&mut inner, &run, step, into.as_deref())?;
            if !force && !told.changed_outside.is_empty() {
                return Err(SnapshotError::ChangedOutside {
                    files: told.changed_outside,
                });
            }
            let root = into.as_deref().unwrap_or(&this.root);
            let applied = apply(root, &plan, &target, inner.store.as_ref()).map_err(|err| match err {
                RestoreError::Refused(record) => refused(record),
                other => failed(other),
            });
            if into.is_none() {
                // The workspace is that point now (or partly, after a
                // failure: the scanner finds out by the files' stat).
                if applied.is_ok() {
                    inner.store.set_head(&this.key, &(run.clone(), step)).map_err(failed)?;
                }
                inner.scanner_at = None;
            }
            applied.map(|()| told)
        })
        .await
    }

    async fn recorded_in(&self, run_id: &str, step: u32) -> Result<Option<String>, SnapshotError> {
        let point = (run_id.to_string(), step);
        self.off_thread(move |this| this.lock()?.store.recorded_in(&point).map_err(failed))
            .await
    }

    async fn hold(&self) -> Result<Box<dyn std::any::Any + Send + Sync>, SnapshotError> {
        self.off_thread(|this| {
            let file = open_lock(&this.runs_lock)?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)
                .map_err(|err| failed(format!("{}: {err}", this.runs_lock.display())))?;
            Ok(Box::new(file) as Box<dyn std::any::Any + Send + Sync>)
        })
        .await
    }

    fn files(&self) -> Vec<PathBuf> {
        self.files.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<T>(work: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(work)
    }

    fn snapshots(dir: &Path, filter: Filter) -> Snapshots {
        std::fs::create_dir_all(dir.join("ws")).unwrap();
        Snapshots::open(&dir.join("ws"), &dir.join("snapshots.db"), filter).unwrap()
    }

    /// Snapshots of a workspace where run `r` wrote `a` = "1" at step 0
    /// and "2" at step 1; its folder.
    fn two_steps(dir: &Path) -> (Snapshots, PathBuf) {
        let store = snapshots(dir, Filter::default());
        let ws = store.root().to_path_buf();
        std::fs::write(ws.join("a"), "1").unwrap();
        store.record_now("r", 0, None).unwrap();
        std::fs::write(ws.join("a"), "2").unwrap();
        store.record_now("r", 1, None).unwrap();
        (store, ws)
    }

    #[test]
    fn a_point_recorded_again_leaves_the_points_based_on_it_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ws) = two_steps(dir.path());
        // Another run starts from the head, (r, 1).
        std::fs::write(ws.join("b"), "q").unwrap();
        store.record_now("q", 0, None).unwrap();
        let before = store.lock().unwrap().store.manifest_at("q", 0).unwrap().unwrap();
        // r resumes and records its step 1 again, with other files.
        std::fs::write(ws.join("a"), "3").unwrap();
        store.record_now("r", 1, None).unwrap();
        let inner = store.lock().unwrap();
        assert_eq!(inner.store.manifest_at("q", 0).unwrap().unwrap(), before);
        assert_eq!(inner.store.manifest_at("r", 1).unwrap().unwrap().0["a"].size, 1);
    }

    #[test]
    fn long_chains_end_in_a_whole_point_and_every_point_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = snapshots(dir.path(), Filter::default());
        let ws = store.root().to_path_buf();
        let mut expected = Vec::new();
        for step in 0..(KEYFRAME_DEPTH + 10) {
            std::fs::write(ws.join(format!("f{}", step % 7)), format!("{step}")).unwrap();
            store.record_now("r", step, None).unwrap();
            let mut fresh = Scanner::new(&ws, Filter::default()).without_watches();
            fresh.scan().unwrap();
            expected.push(fresh.manifest());
        }
        let inner = store.lock().unwrap();
        for (step, manifest) in expected.iter().enumerate() {
            let depth = inner.store.depth(&("r".to_string(), step as u32)).unwrap().unwrap();
            assert!(depth < KEYFRAME_DEPTH, "step {step}: depth {depth}");
            assert_eq!(
                &inner.store.manifest_at("r", step as u32).unwrap().unwrap(),
                manifest,
                "step {step}"
            );
        }
    }

    #[test]
    fn a_restore_does_not_write_over_a_file_the_snapshots_do_not_hold_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let store = snapshots(dir.path(), Filter::new(&[], &[], 10).unwrap());
        let ws = store.root().to_path_buf();
        std::fs::write(ws.join("small"), "small").unwrap();
        store.record_now("r", 0, None).unwrap();
        // Grown past the limit: left out from now on, its content kept nowhere.
        std::fs::write(ws.join("small"), "grown past the limit").unwrap();
        store.record_now("r", 1, None).unwrap();
        let plan = block(store.plan("r", 0, None)).unwrap();
        assert_eq!(plan.write, ["small"]);
        assert_eq!(plan.changed_outside, ["small"]);
        let refused = block(store.restore("r", 0, None, false)).unwrap_err();
        assert!(matches!(refused, SnapshotError::ChangedOutside { .. }), "{refused}");
        assert_eq!(
            std::fs::read_to_string(ws.join("small")).unwrap(),
            "grown past the limit"
        );
        block(store.restore("r", 0, None, true)).unwrap();
        assert_eq!(std::fs::read_to_string(ws.join("small")).unwrap(), "small");
    }

    /// Files a point did not track are never removed by going back to it:
    /// one its `.gitignore` ignored (the model then rewrote the rules), one
    /// too large then (the model then shrank it).
    #[test]
    fn a_restore_never_removes_a_file_the_point_did_not_track() {
        let dir = tempfile::tempdir().unwrap();
        let store = snapshots(dir.path(), Filter::new(&[], &[], 100).unwrap());
        let ws = store.root().to_path_buf();
        std::fs::write(ws.join(".gitignore"), "data/\n").unwrap();
        std::fs::create_dir_all(ws.join("data")).unwrap();
        std::fs::write(ws.join("data/important"), "a person's data").unwrap();
        std::fs::write(ws.join("big.txt"), "x".repeat(500)).unwrap();
        std::fs::write(ws.join("made.txt"), "tracked").unwrap();
        store.record_now("r", 0, None).unwrap();
        // The model's step: no more ignore rules, the big file shrunk, a new file.
        std::fs::write(ws.join(".gitignore"), "").unwrap();
        std::fs::write(ws.join("big.txt"), "small now").unwrap();
        std::fs::write(ws.join("new.txt"), "made by the step").unwrap();
        store.record_now("r", 1, None).unwrap();
        let plan = block(store.plan("r", 0, None)).unwrap();
        assert_eq!(plan.remove, ["new.txt"], "{plan:?}");
        block(store.restore("r", 0, None, true)).unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.join("data/important")).unwrap(),
            "a person's data"
        );
        assert_eq!(std::fs::read_to_string(ws.join("big.txt")).unwrap(), "small now");
        assert_eq!(std::fs::read_to_string(ws.join(".gitignore")).unwrap(), "data/\n");
        assert!(!ws.join("new.txt").exists());
    }

    /// A run executing in the workspace (in any process of this machine)
    /// holds it: a restore in place is refused meanwhile; a copy is not.
    #[test]
    fn a_restore_in_place_is_refused_while_a_run_holds_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ws) = two_steps(dir.path());
        // Another process's view of the same workspace and lock files.
        let other = Snapshots::open(&ws, &dir.path().join("snapshots.db"), Filter::default()).unwrap();
        let held = block(other.hold()).unwrap();
        let refused = block(store.restore("r", 0, None, false)).unwrap_err();
        assert!(matches!(refused, SnapshotError::InUse), "{refused}");
        assert_eq!(std::fs::read_to_string(ws.join("a")).unwrap(), "2");
        std::fs::create_dir(dir.path().join("copy")).unwrap();
        block(store.restore("r", 0, Some(&dir.path().join("copy")), false)).unwrap();
        drop(held);
        block(store.restore("r", 0, None, false)).unwrap();
        assert_eq!(std::fs::read_to_string(ws.join("a")).unwrap(), "1");
    }

    /// A file the step tracked that is ignored now and was changed since:
    /// its content is in no snapshot, so it is not written over unasked;
    /// one ignored now but as the step had it is left alone.
    #[test]
    fn a_file_ignored_since_and_changed_is_not_written_over_unasked() {
        let dir = tempfile::tempdir().unwrap();
        let store = snapshots(dir.path(), Filter::default());
        let ws = store.root().to_path_buf();
        std::fs::write(ws.join("notes.txt"), "tracked then").unwrap();
        std::fs::write(ws.join("same.txt"), "unchanged").unwrap();
        store.record_now("r", 0, None).unwrap();
        std::fs::write(ws.join(".gitignore"), "notes.txt\nsame.txt\n").unwrap();
        store.record_now("r", 1, None).unwrap();
        std::fs::write(ws.join("notes.txt"), "a person's later notes").unwrap();
        let plan = block(store.plan("r", 0, None)).unwrap();
        assert_eq!(plan.changed_outside, ["notes.txt"], "{plan:?}");
        assert!(!plan.write.contains(&"same.txt".to_string()), "{plan:?}");
        block(store.restore("r", 0, None, false)).unwrap_err();
        assert_eq!(
            std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
            "a person's later notes"
        );
    }
}
