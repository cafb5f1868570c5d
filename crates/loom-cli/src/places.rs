//! Every place where a Loom of this machine keeps what no command may see
//! (docs/security.md, "Loom's state"): each Loom's state base — which
//! `LOOM_STATE_DIR` may put anywhere — and each gateway's or worker's
//! `--config` file (tokens in clear). A Loom adds its own places to one
//! list per user when it starts, and hides every place on the list from
//! its tools and the programs it starts, so a plain `loom run` does not
//! hand another Loom's session key or gateway tokens to its commands.
//!
//! The list is `/var/lib/loom/places` for root (the user of most
//! containers), else `~/.local/state/loom/places`: fixed places, whatever
//! the state base of the Loom reading it. It holds paths only, one a line;
//! places that no longer exist are dropped as it is written.

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The folder of the list: itself one of the places hidden.
pub(crate) fn list_dir() -> Option<PathBuf> {
    // SAFETY: a plain system call.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/lib/loom"));
    }
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(".local/state/loom"))
}

/// Adds `places` (made absolute) to the list, once per process; a list
/// that cannot be written is a warning, never a failure: the places of
/// this Loom are hidden from its own commands either way.
pub(crate) fn register(places: &[PathBuf]) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        if let Err(err) = add(places) {
            tracing::warn!("cannot record Loom's places for other Looms to hide: {err}");
        }
    });
}

fn add(places: &[PathBuf]) -> std::io::Result<()> {
    let Some(dir) = list_dir() else {
        return Ok(());
    };
    std::fs::create_dir_all(&dir)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(dir.join("places"))?;
    // One writer at a time: the list is read, pruned and written whole.
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut listed: Vec<PathBuf> = text.lines().map(PathBuf::from).filter(|path| path.exists()).collect();
    for place in places {
        let place = std::path::absolute(place)?;
        if !listed.contains(&place) {
            listed.push(place);
        }
    }
    let written: String = listed
        .iter()
        .filter_map(|path| path.to_str())
        .filter(|path| !path.contains('\n'))
        .map(|path| format!("{path}\n"))
        .collect();
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(written.as_bytes())?;
    file.sync_all()
    // The lock goes with the descriptor.
}

/// The places on the list that exist, and the list's own folder; none
/// that holds the workspace, the temp folder or the home folder (a state
/// base put there: covering it would hide the work itself, or every
/// command's temp files).
pub(crate) fn known(workspace: &Path) -> Vec<PathBuf> {
    let Some(dir) = list_dir() else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(dir.join("places")).unwrap_or_default();
    let real = |path: PathBuf| path.canonicalize().unwrap_or(path);
    let mut needed = vec![real(workspace.to_path_buf()), real(std::env::temp_dir())];
    needed.extend(std::env::var_os("HOME").map(|home| real(PathBuf::from(home))));
    std::iter::once(dir)
        .chain(text.lines().map(PathBuf::from))
        .filter(|place| place.is_absolute() && place.exists() && !needed.iter().any(|path| path.starts_with(place)))
        .collect()
}
