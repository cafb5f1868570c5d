//! The workspace snapshots of a command's runs (`[snapshots]`,
//! docs/rewind.md): kept beside the run store — a SQLite one's
//! `loom-snapshots.db` beside `loom.db`, or the cluster's Redis — one per
//! workspace and process, so the runs of a chat, a gateway or a worker
//! share one scanner. Without a store, no snapshots.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Result};
use loom::stores::RedisSnapshots;
use loom::workspace::{database_files, runs_lock_of, Filter, Snapshots};
use loom::{Store, StoreAddress};
use loom_config::SnapshotsConfig;

/// How the snapshots are opened: for runs, which record with loom.toml's
/// filter; for a rewind, which judges the workspace by the filter its runs
/// recorded with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    Runs,
    Rewind,
}

/// The snapshots of `workspace` for runs recorded in `store`, unless
/// loom.toml switches them off or there is no store.
pub(crate) async fn open(
    config: Option<&SnapshotsConfig>,
    store: Option<&dyn Store>,
    workspace: &Path,
    purpose: Purpose,
) -> Result<Option<Arc<Snapshots>>> {
    let config = config.cloned().unwrap_or_default();
    // Switched off, runs record none; what was recorded before can still
    // be rewound to.
    if config.enabled == Some(false) && purpose == Purpose::Runs {
        return Ok(None);
    }
    let filter = Filter::new(
        &config.include,
        &config.exclude,
        config.max_file_bytes.unwrap_or(2 * 1024 * 1024),
    )
    .map_err(|err| anyhow!("[snapshots]: {err}"))?;
    let store_files = store.map(Store::files).unwrap_or_default();
    let address = store.and_then(Store::address);
    if address.is_none() && store_files.is_empty() {
        return Ok(None);
    }
    let workspace = workspace.to_path_buf();
    let watch = config.watch.unwrap_or(true);
    // File work (the state directory, paths made canonical): off the async thread.
    tokio::task::spawn_blocking(move || {
        let kept = match (address, store_files.first()) {
            // The cluster's Redis: restores of this workspace are kept one
            // at a time on this machine by a lock in its state directory.
            (Some(address), _) => Kept::Redis {
                lock: crate::state::workspace_dir(&workspace)?.join("loom-snapshots.lock"),
                address,
            },
            (None, Some(db)) => Kept::Sqlite(beside(db)),
            (None, None) => return Ok(None),
        };
        // A database kept in the workspace is never in a snapshot, nor
        // written by a restore.
        let ours = store_files.iter().cloned().chain(kept.files());
        // Nor the project's loom.toml, which tools may not change either:
        // a rewind never takes a person's configuration back.
        let filter = filter.never(inside(&workspace, ours).into_iter().chain(["loom.toml".to_string()]));
        shared(&workspace, kept, filter, watch, purpose).map(Some)
    })
    .await
    .map_err(|err| anyhow!("opening the snapshots failed: {err}"))?
}

/// Where a command's snapshots are kept.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Kept {
    /// In a SQLite file.
    Sqlite(PathBuf),
    /// In the cluster's Redis, restores locked with a local file.
    Redis { address: StoreAddress, lock: PathBuf },
}

impl Kept {
    /// The local files they are kept (or locked) with.
    fn files(&self) -> Vec<PathBuf> {
        match self {
            Self::Sqlite(db) => database_files(db),
            Self::Redis { lock, .. } => vec![lock.clone(), runs_lock_of(lock)],
        }
    }

    fn open(&self, workspace: &Path, filter: Filter, purpose: Purpose) -> Result<Snapshots> {
        Ok(match (self, purpose) {
            (Self::Sqlite(db), Purpose::Runs) => Snapshots::open(workspace, db, filter)?,
            (Self::Sqlite(db), Purpose::Rewind) => Snapshots::open_as_recorded(workspace, db, filter)?,
            (Self::Redis { address, lock }, purpose) => {
                let store = Box::new(
                    RedisSnapshots::new(&address.url, &address.prefix)
                        .map_err(|err| anyhow!("workspace snapshots: {err}"))?,
                );
                match purpose {
                    Purpose::Runs => Snapshots::open_in(workspace, store, lock, filter)?,
                    Purpose::Rewind => Snapshots::open_in_as_recorded(workspace, store, lock, filter)?,
                }
            }
        })
    }
}

/// Those of `files` beneath `workspace`, as paths relative to it.
fn inside(workspace: &Path, files: impl Iterator<Item = PathBuf>) -> Vec<String> {
    let Ok(root) = workspace.canonicalize() else {
        return Vec::new();
    };
    files
        .filter_map(|file| {
            let parent = file
                .parent()
                .filter(|dir| !dir.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let dir = parent.canonicalize().ok()?;
            let relative = dir
                .join(file.file_name()?)
                .strip_prefix(&root)
                .ok()?
                .to_str()?
                .to_string();
            Some(relative)
        })
        .collect()
}

/// `loom-snapshots.db` for `loom.db`.
fn beside(db: &Path) -> PathBuf {
    let stem = db
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    db.with_file_name(format!("{stem}-snapshots.db"))
}

/// The snapshots opened in this process, by workspace and where they are kept.
type Opened = HashMap<(PathBuf, Kept, bool), Arc<Snapshots>>;

/// One instance per workspace and store in this process.
fn shared(workspace: &Path, kept: Kept, filter: Filter, watch: bool, purpose: Purpose) -> Result<Arc<Snapshots>> {
    static OPEN: OnceLock<Mutex<Opened>> = OnceLock::new();
    let key = (workspace.to_path_buf(), kept.clone(), purpose == Purpose::Runs);
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("the snapshots were poisoned by a panic"))?;
    if let Some(snapshots) = open.get(&key) {
        return Ok(snapshots.clone());
    }
    for file in kept.files().iter().take(1) {
        if !file.exists() {
            crate::state::private_file(file)?;
        }
    }
    let mut snapshots = kept.open(workspace, filter, purpose)?;
    if !watch {
        snapshots = snapshots.without_watches();
    }
    let snapshots = Arc::new(snapshots);
    open.insert(key, snapshots.clone());
    Ok(snapshots)
}
