//! One workspace's snapshots, as the engine asks for them
//! ([`loom_core::WorkspaceSnapshots`]): a scanner that knows the files as
//! the last snapshot left them, and a SQLite file beside the run store.
//!
//! Each point is stored as the delta from a *base*: the step before it of
//! the same run, or — for a run's step 0, and when a step before was not
//! recorded — the workspace's *head*, the latest point recorded or
//! restored. A new run thus costs what changed since the last one, not a
//! copy of the workspace.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use loom_core::{async_trait, RestorePlan, SkippedFile, SnapshotError, StepFiles, WorkspaceSnapshots};

use crate::manifest::Manifest;
use crate::restore::{apply, changed_outside, Plan};
use crate::scan::{Filter, Scanner};
use crate::store::{Point, SnapshotStore, SqliteSnapshots};

/// The snapshots of the workspace at one folder.
#[derive(Clone)]
pub struct Snapshots {
    root: PathBuf,
    /// The workspace's name in the store's heads.
    key: String,
    db: PathBuf,
    filter: Filter,
    /// Whether scans use the kernel's watches.
    watch: bool,
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    store: SqliteSnapshots,
    /// Made at the first scan, from the head.
    scanner: Option<Scanner>,
    /// The point the scanner's files are: a delta from it is the scan's.
    scanner_at: Option<Point>,
    /// Contents read by scans that recorded nothing (a restore's plan):
    /// the next record may need them, as the scanner will not read those
    /// files again.
    unrecorded: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshots")
            .field("root", &self.root)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

fn failed(err: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Failed(err.to_string())
}

impl Snapshots {
    /// The snapshots of the workspace at `root` (canonicalized), kept in the
    /// SQLite file `db`, holding the files `filter` admits.
    pub fn open(root: &Path, db: &Path, filter: Filter) -> Result<Self, SnapshotError> {
        let root = root
            .canonicalize()
            .map_err(|err| failed(format!("{}: {err}", root.display())))?;
        if let Some(parent) = db.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|err| failed(format!("{}: {err}", parent.display())))?;
        }
        let store = SqliteSnapshots::open(db).map_err(failed)?;
        Ok(Self {
            key: root.display().to_string(),
            root,
            db: db.to_path_buf(),
            filter,
            watch: true,
            inner: Arc::new(Mutex::new(Inner {
                store,
                scanner: None,
                scanner_at: None,
                unrecorded: Vec::new(),
            })),
        })
    }

    /// Without the kernel's watches (`[snapshots] watch = false`): every
    /// scan walks the whole workspace — for file systems whose changes the
    /// kernel does not report (a network file system changed from another
    /// machine).
    pub fn without_watches(mut self) -> Self {
        self.watch = false;
        self
    }

    /// Records the workspace as `step` of `run` now, on this thread.
    pub fn record_now(&self, run: &str, step: u32) -> Result<StepFiles, SnapshotError> {
        let mut inner = self.lock()?;
        let store = &inner.store;
        let before = step
            .checked_sub(1)
            .map(|before| (run.to_string(), before))
            .filter(|point| store.delta_of(&point.0, point.1).is_ok_and(|row| row.is_some()));
        let mut base = match before {
            Some(point) => Some(point),
            None => store.head(&self.key).map_err(failed)?,
        };
        let this = (run.to_string(), step);
        if base.as_ref() == Some(&this) {
            // Recorded again (a resumed run): from what it was based on.
            base = store.delta_of(run, step).map_err(failed)?.and_then(|(_, base)| base);
        }
        self.ensure_scanner(&mut inner)?;
        let Inner {
            store,
            scanner,
            scanner_at,
            unrecorded,
        } = &mut *inner;
        let Some(scanner) = scanner.as_mut() else {
            return Err(failed("no scanner"));
        };
        let mut scanned = scanner.scan().map_err(failed)?;
        scanned.contents.append(unrecorded);
        let delta = if base.is_some() && *scanner_at == base {
            scanned.delta
        } else {
            let from = match &base {
                Some((base_run, base_step)) => store.manifest_at(base_run, *base_step).map_err(failed)?,
                None => None,
            };
            from.unwrap_or_default().delta(&scanner.manifest())
        };
        store
            .record(run, step, base.as_ref(), &delta, &scanned.contents)
            .map_err(failed)?;
        store.set_head(&self.key, &this).map_err(failed)?;
        *scanner_at = Some(this);
        Ok(StepFiles {
            changed: delta.changed.into_keys().collect(),
            removed: delta.removed.into_iter().collect(),
            skipped: scanned
                .skipped
                .into_iter()
                .map(|(path, bytes)| SkippedFile { path, bytes })
                .collect(),
        })
    }

    /// Bytes the snapshot database holds ([`SqliteSnapshots::bytes_used`]).
    pub fn bytes_used(&self) -> Result<u64, SnapshotError> {
        self.lock()?.store.bytes_used().map_err(failed)
    }

    /// The scanner, made from the head when missing: its first scan reads
    /// every file once and tells what differs from the head.
    fn ensure_scanner(&self, inner: &mut Inner) -> Result<(), SnapshotError> {
        if inner.scanner.is_some() {
            return Ok(());
        }
        let head = inner.store.head(&self.key).map_err(failed)?;
        let manifest = match &head {
            Some((run, step)) => inner.store.manifest_at(run, *step).map_err(failed)?,
            None => None,
        };
        let scanner = match &manifest {
            Some(manifest) => Scanner::knowing(&self.root, self.filter.clone(), manifest),
            None => Scanner::new(&self.root, self.filter.clone()),
        };
        inner.scanner = Some(if self.watch { scanner } else { scanner.without_watches() });
        inner.scanner_at = head.filter(|_| manifest.is_some());
        Ok(())
    }

    /// The workspace's files now (a scan that is no point: the next
    /// record diffs against its base instead of trusting the scan).
    fn files_now(&self, inner: &mut Inner) -> Result<Manifest, SnapshotError> {
        self.ensure_scanner(inner)?;
        let Some(scanner) = inner.scanner.as_mut() else {
            return Err(failed("no scanner"));
        };
        let scanned = scanner.scan().map_err(failed)?;
        let now = scanner.manifest();
        inner.unrecorded.extend(scanned.contents);
        inner.scanner_at = None;
        Ok(now)
    }

    fn target(store: &SqliteSnapshots, run: &str, step: u32) -> Result<Manifest, SnapshotError> {
        store
            .manifest_at(run, step)
            .map_err(failed)?
            .ok_or_else(|| SnapshotError::NotRecorded {
                run_id: run.to_string(),
                step,
            })
    }

    /// What restoring `step` of `run` changes here or in `into`, with the
    /// snapshot it restores.
    fn plan_now(
        &self,
        inner: &mut Inner,
        run: &str,
        step: u32,
        into: Option<&Path>,
    ) -> Result<(RestorePlan, Plan, Manifest), SnapshotError> {
        let target = Self::target(&inner.store, run, step)?;
        let (now, last) = match into {
            Some(into) => {
                let mut scanner = Scanner::new(into, self.filter.clone());
                scanner.scan().map_err(failed)?;
                let now = scanner.manifest();
                (now.clone(), now)
            }
            None => {
                let now = self.files_now(inner)?;
                let last = match inner.store.head(&self.key).map_err(failed)? {
                    Some((head_run, head_step)) => inner
                        .store
                        .manifest_at(&head_run, head_step)
                        .map_err(failed)?
                        .unwrap_or_default(),
                    None => now.clone(),
                };
                (now, last)
            }
        };
        let plan = Plan::between(&now, &target);
        let outside = changed_outside(&plan, &now, &last);
        let told = RestorePlan {
            write: plan.write.clone(),
            remove: plan.remove.clone(),
            changed_outside: outside,
        };
        Ok((told, plan, target))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, SnapshotError> {
        self.inner
            .lock()
            .map_err(|_| failed("the snapshot store was poisoned by a panic"))
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

#[async_trait]
impl WorkspaceSnapshots for Snapshots {
    async fn record(&self, run_id: &str, step: u32) -> Result<StepFiles, SnapshotError> {
        let run = run_id.to_string();
        self.off_thread(move |this| this.record_now(&run, step)).await
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
            let (delta, _) = this
                .lock()?
                .store
                .delta_of(&run, step)
                .map_err(failed)?
                .ok_or_else(|| SnapshotError::NotRecorded {
                    run_id: run.clone(),
                    step,
                })?;
            Ok(StepFiles {
                changed: delta.changed.into_keys().collect(),
                removed: delta.removed.into_iter().collect(),
                skipped: Vec::new(),
            })
        })
        .await
    }

    async fn file_at(&self, run_id: &str, step: u32, path: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        let (run, path) = (run_id.to_string(), path.to_string());
        self.off_thread(move |this| {
            let inner = this.lock()?;
            let target = Self::target(&inner.store, &run, step)?;
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

    async fn restore(&self, run_id: &str, step: u32, into: Option<&Path>) -> Result<RestorePlan, SnapshotError> {
        let (run, into) = (run_id.to_string(), into.map(Path::to_path_buf));
        self.off_thread(move |this| {
            let mut inner = this.lock()?;
            let (told, plan, target) = this.plan_now(&mut inner, &run, step, into.as_deref())?;
            let root = into.as_deref().unwrap_or(&this.root);
            apply(root, &plan, &target, &inner.store).map_err(failed)?;
            if into.is_none() {
                // The workspace is that point now; the scanner finds out
                // what the restore changed by their stat.
                inner.store.set_head(&this.key, &(run.clone(), step)).map_err(failed)?;
                inner.scanner_at = None;
            }
            Ok(told)
        })
        .await
    }

    fn files(&self) -> Vec<PathBuf> {
        let name = self
            .db
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        vec![
            self.db.clone(),
            self.db.with_file_name(format!("{name}-wal")),
            self.db.with_file_name(format!("{name}-shm")),
        ]
    }
}
