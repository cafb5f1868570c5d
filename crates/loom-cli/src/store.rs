//! The store of `loom run`: `--db PATH`, `--redis URL` (or
//! `LOOM_REDIS_URL`), `[cluster] redis = URL`, `store = "sqlite:PATH" |
//! "none"`, else `loom.db` in the workspace's state directory (`state.rs`),
//! out of the tools' reach.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use loom::stores::{redacted_url, RedisStore, SqliteStore};
use loom::Store;

/// Where a Redis URL came from: the command line (`--redis` or
/// `LOOM_REDIS_URL`) wins over loom.toml; `[cluster] redis` beside `store`
/// in one file is a contradiction.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RedisFrom<'a> {
    CommandLine(&'a str),
    File(&'a str),
}

impl<'a> RedisFrom<'a> {
    /// The command line's URL, else the file's.
    pub(crate) fn pick(command_line: Option<&'a str>, file: Option<&'a str>) -> Option<Self> {
        command_line.map(Self::CommandLine).or(file.map(Self::File))
    }
}

/// Opens the run's store, or `None` when it is switched off: `--db`, else
/// the Redis of `redis`, else `store`, else the workspace's database.
pub(crate) async fn open(
    db: Option<&Path>,
    redis: Option<RedisFrom<'_>>,
    configured: Option<&str>,
    config_dir: Option<&Path>,
    workspace: &Path,
) -> Result<Option<Arc<dyn Store>>> {
    match (db, redis, configured) {
        (Some(_), _, _) | (None, None, _) => {}
        (None, Some(RedisFrom::File(_)), Some(store)) => {
            bail!("loom.toml sets both store = \"{store}\" and [cluster] redis: keep one")
        }
        (None, Some(RedisFrom::CommandLine(url) | RedisFrom::File(url)), _) => {
            return Ok(Some(Arc::new(open_redis(url).await?)))
        }
    }
    let path: PathBuf = match (db, configured) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some("none")) => return Ok(None),
        (None, Some(spec)) => {
            let Some(path) = spec.strip_prefix("sqlite:").filter(|p| !p.is_empty()) else {
                bail!("store = \"{spec}\" is not understood: use \"sqlite:PATH\" or \"none\"");
            };
            match config_dir {
                Some(dir) if Path::new(path).is_relative() => dir.join(path),
                _ => PathBuf::from(path),
            }
        }
        (None, None) => PathBuf::new(),
    };
    let workspace = workspace.to_path_buf();
    // File work (the state directory, perhaps moving an old database over
    // from the workspace): off the async thread.
    let store = tokio::task::spawn_blocking(move || -> Result<SqliteStore> {
        let path = if path.as_os_str().is_empty() {
            crate::state::workspace_dir(&workspace)?.join("loom.db")
        } else {
            path
        };
        if !path.exists() {
            if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|err| anyhow!("cannot create {}: {err}", dir.display()))?;
            }
            crate::state::private_file(&path)?;
        }
        SqliteStore::open(&path).map_err(|err| anyhow!("{err}"))
    })
    .await
    .map_err(|err| anyhow!("opening the run database failed: {err}"))??;
    Ok(Some(Arc::new(store)))
}

/// Connects to the Redis at `url`, saying which one failed (never with
/// its password: `redacted_url`).
pub(crate) async fn open_redis(url: &str) -> Result<RedisStore> {
    RedisStore::connect(url)
        .await
        .map_err(|err| anyhow!("cannot use the Redis at {}: {err}", shown_url(url)))
}

/// `url` as the CLI shows it: [`redacted_url`], loom-redis's one function
/// for every form of Redis URL (docs/cluster.md).
pub(crate) fn shown_url(url: &str) -> String {
    redacted_url(url)
}
