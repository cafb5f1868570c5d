//! The workspace snapshots of a command's runs (`[snapshots]`,
//! docs/rewind.md): kept beside a SQLite run store (`loom.db` →
//! `loom-snapshots.db`), one per workspace and process, so the runs of a
//! chat or a gateway share one scanner. A store that is not SQLite (Redis,
//! or none) keeps no snapshots yet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Result};
use loom::workspace::{Filter, Snapshots};
use loom::Store;
use loom_config::SnapshotsConfig;

/// The snapshots of `workspace` for runs recorded in `store`, unless
/// loom.toml switches them off or the store is not a SQLite file.
pub(crate) async fn open(
    config: Option<&SnapshotsConfig>,
    store: Option<&dyn Store>,
    workspace: &Path,
) -> Result<Option<Arc<Snapshots>>> {
    let config = config.cloned().unwrap_or_default();
    if config.enabled == Some(false) {
        return Ok(None);
    }
    let Some(db) = store.and_then(|store| store.files().into_iter().next()) else {
        return Ok(None);
    };
    let filter = Filter::new(
        &config.include,
        &config.exclude,
        config.max_file_bytes.unwrap_or(2 * 1024 * 1024),
    )
    .map_err(|err| anyhow!("[snapshots]: {err}"))?;
    let path = beside(&db);
    let workspace = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || shared(&workspace, &path, filter))
        .await
        .map_err(|err| anyhow!("opening the snapshots failed: {err}"))?
        .map(Some)
}

/// `loom-snapshots.db` for `loom.db`.
fn beside(db: &Path) -> PathBuf {
    let stem = db
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    db.with_file_name(format!("{stem}-snapshots.db"))
}

/// One instance per workspace and database in this process.
fn shared(workspace: &Path, db: &Path, filter: Filter) -> Result<Arc<Snapshots>> {
    static OPEN: OnceLock<Mutex<HashMap<(PathBuf, PathBuf), Arc<Snapshots>>>> = OnceLock::new();
    let key = (workspace.to_path_buf(), db.to_path_buf());
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
    let snapshots = Arc::new(Snapshots::open(workspace, db, filter)?);
    open.insert(key, snapshots.clone());
    Ok(snapshots)
}
