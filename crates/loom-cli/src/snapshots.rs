//! The workspace snapshots of a command's runs (`[snapshots]`,
//! docs/rewind.md): kept beside a SQLite run store (`loom.db` →
//! `loom-snapshots.db`), one per workspace and process, so the runs of a
//! chat or a gateway share one scanner. A store that is not SQLite (Redis,
//! or none) keeps no snapshots yet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Result};
use loom::workspace::{database_files, Filter, Snapshots};
use loom::Store;
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
/// loom.toml switches them off or the store is not a SQLite file.
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
    let store_files = store.map(Store::files).unwrap_or_default();
    let Some(db) = store_files.first().cloned() else {
        return Ok(None);
    };
    let filter = Filter::new(
        &config.include,
        &config.exclude,
        config.max_file_bytes.unwrap_or(2 * 1024 * 1024),
    )
    .map_err(|err| anyhow!("[snapshots]: {err}"))?;
    let path = beside(&db);
    // A database kept in the workspace is never in a snapshot, nor
    // written by a restore.
    let ours = store_files.iter().cloned().chain(database_files(&path));
    // Nor the project's loom.toml, which tools may not change either: a
    // rewind never takes a person's configuration back.
    let filter = filter.never(inside(workspace, ours).into_iter().chain(["loom.toml".to_string()]));
    let workspace = workspace.to_path_buf();
    let watch = config.watch.unwrap_or(true);
    tokio::task::spawn_blocking(move || shared(&workspace, &path, filter, watch, purpose))
        .await
        .map_err(|err| anyhow!("opening the snapshots failed: {err}"))?
        .map(Some)
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

/// The snapshots opened in this process, by workspace and database.
type Opened = HashMap<(PathBuf, PathBuf, bool), Arc<Snapshots>>;

/// One instance per workspace and database in this process.
fn shared(workspace: &Path, db: &Path, filter: Filter, watch: bool, purpose: Purpose) -> Result<Arc<Snapshots>> {
    static OPEN: OnceLock<Mutex<Opened>> = OnceLock::new();
    let key = (workspace.to_path_buf(), db.to_path_buf(), purpose == Purpose::Runs);
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("the snapshots were poisoned by a panic"))?;
    if let Some(snapshots) = open.get(&key) {
        return Ok(snapshots.clone());
    }
    if !db.exists() {
        crate::state::private_file(db)?;
    }
    let mut snapshots = match purpose {
        Purpose::Runs => Snapshots::open(workspace, db, filter)?,
        Purpose::Rewind => Snapshots::open_as_recorded(workspace, db, filter)?,
    };
    if !watch {
        snapshots = snapshots.without_watches();
    }
    let snapshots = Arc::new(snapshots);
    open.insert(key, snapshots.clone());
    Ok(snapshots)
}
