//! Which folders of a workspace changed since the last scan, from the
//! kernel (inotify): a scan then reads only those folders instead of
//! `lstat`-ing every file. Events come from the files themselves, so a
//! change made through any path reaches them — the `bash` tool's sandbox
//! sees the workspace through a bind mount, and its writes are reported
//! alike. When the kernel cannot say exactly (its queue overflowed, a
//! folder was moved, an ignore file changed, a watch could not be added),
//! the answer is "everything", and the scan walks the whole workspace.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::Path;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

/// What changed since the last [`Watch::take`].
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) enum Changes {
    /// Anything may have: walk the whole workspace.
    #[default]
    Everything,
    /// Entries of these folders changed (`""` is the workspace), and these
    /// folders appeared or went, with all beneath them.
    Within {
        /// Folders one of whose entries changed.
        dirs: HashSet<String>,
        /// Folders created or removed: everything beneath is new or gone.
        trees: HashSet<String>,
    },
}

/// The kernel's watches on a workspace's folders.
pub(crate) struct Watch {
    inotify: Inotify,
    /// Each watched folder, relative to the workspace.
    dirs: HashMap<WatchDescriptor, String>,
    /// A watch could not be added: changes in that folder go unseen.
    incomplete: bool,
    buffer: Vec<u8>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("dirs", &self.dirs.len())
            .field("incomplete", &self.incomplete)
            .finish_non_exhaustive()
    }
}

/// What a folder's watch reports: its entries created, written, changed
/// (mode, times), removed or moved, and the folder itself going.
fn mask() -> WatchMask {
    WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

impl Watch {
    /// No watches yet; `None` when the kernel gives no inotify instance.
    pub(crate) fn new() -> Option<Self> {
        Some(Self {
            inotify: Inotify::init().ok()?,
            dirs: HashMap::new(),
            incomplete: false,
            buffer: vec![0; 64 * 1024],
        })
    }

    /// Watches the folder `dir` (relative to `root`), before its entries
    /// are read, so no change after the read goes unseen.
    pub(crate) fn add(&mut self, root: &Path, dir: &str) {
        match self.inotify.watches().add(root.join(dir), mask()) {
            Ok(wd) => {
                self.dirs.insert(wd, dir.to_string());
            }
            // Too many watches, or the folder went meanwhile: this
            // folder's changes would go unseen, so every scan walks.
            Err(_) => self.incomplete = true,
        }
    }

    /// Whether every folder added is watched.
    pub(crate) fn complete(&self) -> bool {
        !self.incomplete
    }

    /// The changes reported since the last call (none waiting: nothing
    /// changed).
    pub(crate) fn take(&mut self) -> Changes {
        let mut dirs = HashSet::new();
        let mut trees = HashSet::new();
        let mut everything = self.incomplete;
        loop {
            let events = match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => events,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    everything = true;
                    break;
                }
            };
            let mut any = false;
            for event in events {
                any = true;
                let mask = event.mask;
                if mask.contains(EventMask::Q_OVERFLOW) || mask.contains(EventMask::MOVE_SELF) {
                    everything = true;
                    continue;
                }
                if mask.contains(EventMask::IGNORED) {
                    self.dirs.remove(&event.wd);
                    continue;
                }
                let Some(dir) = self.dirs.get(&event.wd) else {
                    continue;
                };
                let Some(name) = event.name else {
                    // The folder itself (DELETE_SELF): its parent says so too.
                    continue;
                };
                if is_ignore_file(name)
                    || (mask.contains(EventMask::ISDIR) && mask.intersects(EventMask::MOVED_FROM | EventMask::MOVED_TO))
                {
                    // New ignore rules, or a folder moved (its watches'
                    // paths are stale): walk everything again.
                    everything = true;
                    continue;
                }
                let path = join(dir, &name.to_string_lossy());
                if mask.contains(EventMask::ISDIR) && mask.intersects(EventMask::CREATE | EventMask::DELETE) {
                    trees.insert(path);
                }
                dirs.insert(dir.clone());
            }
            if !any {
                break;
            }
        }
        if everything {
            Changes::Everything
        } else {
            Changes::Within { dirs, trees }
        }
    }
}

fn is_ignore_file(name: &OsStr) -> bool {
    name == ".gitignore"
}

/// `dir/name`, or `name` in the workspace's own folder.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}
