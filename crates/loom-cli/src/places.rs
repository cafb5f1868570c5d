//! Every place where a Loom of this machine keeps what no command may see
//! (docs/security.md, "Loom's state"): each Loom's state base — which
//! `LOOM_STATE_DIR` may put anywhere — and each gateway's or worker's
//! `--config` file (tokens in clear). A Loom adds its own places to one
//! list per user when it starts (and every SQLite store it opens, which
//! `--db` or `store` may put anywhere), and hides every place on the list from
//! its tools and the programs it starts, so a plain `loom run` does not
//! hand another Loom's session key or gateway tokens to its commands.
//!
//! The list is `/var/lib/loom/places` for root (the user of most
//! containers), else `~/.local/state/loom/places`: fixed places, whatever
//! the state base of the Loom reading it (`LOOM_PLACES` names another). It holds paths only, one a line;
//! places that no longer exist are dropped as it is written.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The list: `LOOM_PLACES` (a file; for a machine whose `/var/lib` is
/// read-only, or tests that keep to themselves), else
/// `/var/lib/loom/places` for root, else `~/.local/state/loom/places`.
/// Its folder is one of the places hidden.
pub(crate) fn list_file() -> Option<PathBuf> {
    if let Some(file) = std::env::var_os("LOOM_PLACES").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(file));
    }
    // SAFETY: a plain system call.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/lib/loom/places"));
    }
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(".local/state/loom/places"))
}

/// Adds `places` (resolved: a link is recorded as what it leads to, so
/// that moving the link later uncovers nothing) to the list, each once
/// per process; a list that cannot be written is a warning, never a
/// failure: the places of this Loom are hidden from its own commands
/// either way.
pub(crate) fn register(places: &[PathBuf]) {
    static DONE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(PoisonError::into_inner);
    let new: Vec<PathBuf> = places
        .iter()
        .map(|place| resolved(place))
        .filter(|place| !done.contains(place))
        .collect();
    if new.is_empty() {
        return;
    }
    match add(&new) {
        Ok(()) => done.extend(new),
        Err(err) => tracing::warn!("cannot record Loom's places for other Looms to hide: {err}"),
    }
}

/// `path` absolute with its links resolved — the folder's when the file
/// itself does not exist yet (a database's `-wal`).
pub(crate) fn resolved(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => dir.canonicalize().map_or(absolute.clone(), |dir| dir.join(name)),
        _ => absolute,
    }
}

fn add(places: &[PathBuf]) -> std::io::Result<()> {
    let Some(list) = list_file() else {
        return Ok(());
    };
    if let Some(dir) = list.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // One writer at a time, through a lock file beside the list: the list
    // is read, pruned and written whole, then renamed over the old one,
    // so a reader (`known`) sees the old list or the new, never a part.
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let lock = options.open(list.with_extension("lock"))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let text = match std::fs::read_to_string(&list) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(err),
    };
    // A place is dropped only with its folder: a database's `-wal` comes
    // and goes, and stays listed while the database's folder is there.
    let mut listed: Vec<PathBuf> = text
        .lines()
        .map(PathBuf::from)
        .filter(|path| path.exists() || path.parent().is_some_and(Path::exists))
        .collect();
    for place in places {
        if !listed.contains(place) {
            listed.push(place.clone());
        }
    }
    let mut written = String::new();
    for path in &listed {
        match path.to_str().filter(|path| !path.contains('\n')) {
            Some(path) => {
                written.push_str(path);
                written.push('\n');
            }
            None => tracing::warn!(
                "cannot record {} for other Looms to hide: not a path of one line of UTF-8",
                path.display()
            ),
        }
    }
    let partial = list.with_extension("partial");
    let mut file = options.truncate(true).open(&partial)?;
    file.write_all(written.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, &list)
    // The lock goes with its descriptor.
}

/// The places on the list that exist, and the list's own folder; none
/// that holds the workspace, the temp folder or the home folder (a state
/// base put there: covering it would hide the work itself, or every
/// command's temp files).
pub(crate) fn known(workspace: &Path) -> Vec<PathBuf> {
    let Some(list) = list_file() else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(&list).unwrap_or_default();
    let dir = list.parent().map_or_else(|| list.clone(), Path::to_path_buf);
    let real = |path: PathBuf| path.canonicalize().unwrap_or(path);
    let mut needed = vec![real(workspace.to_path_buf()), real(std::env::temp_dir())];
    needed.extend(std::env::var_os("HOME").map(|home| real(PathBuf::from(home))));
    // Resolved again: a list an older Loom wrote may hold links, and a
    // link is judged by where it leads now.
    std::iter::once(dir)
        .chain(text.lines().map(PathBuf::from))
        .filter(|place| place.is_absolute())
        .filter_map(|place| place.canonicalize().ok())
        .filter(|place| !needed.iter().any(|path| path.starts_with(place)))
        .collect()
}
