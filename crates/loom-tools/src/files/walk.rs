//! The walk of `glob` and `grep`: a directory tree read through handles.
//!
//! Each subdirectory is opened beneath its parent's handle without following
//! a link, and each file is opened through its directory's handle the same
//! way and judged on what was opened, so a directory swapped for a link to
//! the outside mid-walk is simply not entered (docs/tools.md, "How paths are
//! resolved"). `.gitignore` files are read through the same handles; hidden
//! entries and Loom's own state are skipped, and symbolic links are not
//! followed at all.
//!
//! The walk is a loop over an explicit stack, not a recursion: a workspace
//! may hold directories nested thousands deep (one `mkdir -p` makes them),
//! and a recursion would overflow the blocking thread's stack, which aborts
//! the whole process. For the same reason it goes at most [`MAX_DEPTH`]
//! levels down and keeps only the handles of the few innermost directories
//! open; those further up are reopened, level by level and never through a
//! link, when the walk comes back to them.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use cap_fs_ext::{DirExt, FollowSymlinks, MetadataExt, OpenOptionsFollowExt};
use cap_std::fs::{Dir, FileType, OpenOptions, OpenOptionsExt};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;
use loom_core::{CancellationToken, ToolError};

use super::open_error;
use crate::jail::{display, Jail, OpenError};

/// How many directory levels below the starting one the walk enters.
pub(super) const MAX_DEPTH: usize = 128;

/// How many of the innermost directories being walked keep their handle
/// open (besides the starting one): the walk never holds more, however deep.
const HELD: usize = 8;

/// A regular file the walk found.
pub(super) struct Found<'a> {
    /// Its path relative to the workspace root.
    pub(super) relative: &'a Path,
    source: Source<'a>,
}

enum Source<'a> {
    /// An entry of a directory opened during the walk.
    Entry(&'a Jail, &'a Dir, &'a OsStr),
    /// The walk's base, which is a file: opened as any requested path is.
    Base(&'a Jail, &'a str),
}

impl Found<'_> {
    /// The file opened for reading; `None` when it cannot be opened, is no
    /// longer a regular file (it changed since it was listed) or is Loom's
    /// state (or where it is cannot be told).
    pub(super) fn open(&self) -> Option<std::fs::File> {
        let file = match self.source {
            Source::Entry(jail, dir, name) => {
                let mut options = OpenOptions::new();
                // Not through a link swapped in since the listing (cap-std's
                // own no-follow, which holds on every path it takes, unlike
                // a raw `O_NOFOLLOW`), and not hanging on a FIFO.
                options
                    .read(true)
                    .follow(FollowSymlinks::No)
                    .custom_flags(libc::O_NONBLOCK);
                let file = dir.open_with(name, &options).ok()?.into_std();
                // Judged on what was opened, as every other tool does: the
                // entry's name was judged, but it may have changed since.
                if !jail.may_read(&file) {
                    return None;
                }
                file
            }
            Source::Base(jail, requested) => jail.open_read(requested, self.relative).ok()?,
        };
        file.metadata().ok()?.is_file().then_some(file)
    }
}

/// What a walk left out, for the tool to say.
#[derive(Debug, Default)]
pub(super) struct Walked {
    /// Directories not entered because they are deeper than [`MAX_DEPTH`].
    pub(super) too_deep: usize,
}

impl Walked {
    /// A line for the tool's result saying what was not searched, if anything.
    pub(super) fn note(&self) -> Option<String> {
        (self.too_deep > 0).then(|| {
            let (count, were) = if self.too_deep == 1 {
                ("1 directory".to_string(), "was")
            } else {
                (format!("{} directories", self.too_deep), "were")
            };
            format!("[{count} deeper than {MAX_DEPTH} levels below the starting directory {were} not searched]\n")
        })
    }
}

/// Calls `visit` with each regular file under `base` (relative to the
/// workspace root; `requested` is how the model named it), in name order,
/// honouring `.gitignore` (also outside git repositories) and skipping hidden
/// entries, links, Loom's own state and directories more than [`MAX_DEPTH`]
/// levels down. A base that is a file is visited alone; one that cannot be
/// opened has no files. Stops with `Cancelled` as soon as `cancel` fires.
pub(super) fn walk_files(
    jail: &Jail,
    requested: &str,
    base: &Path,
    cancel: &CancellationToken,
    visit: impl FnMut(&Found<'_>) -> Result<(), ToolError>,
) -> Result<Walked, ToolError> {
    let mut walker = Walker {
        jail,
        cancel,
        visit,
        ignores: Vec::new(),
        walked: Walked::default(),
    };
    let dir = match jail.open_dir(requested, base) {
        Ok(dir) => dir,
        Err(OpenError::Io(err)) if err.kind() == std::io::ErrorKind::NotADirectory => {
            (walker.visit)(&Found {
                relative: base,
                source: Source::Base(jail, requested),
            })?;
            return Ok(walker.walked);
        }
        Err(refused @ OpenError::Refused(_)) => return Err(open_error("search", &display(base), refused)),
        Err(OpenError::Io(_)) => return Ok(walker.walked),
    };
    // The rules of the directories above the base, inside the workspace.
    let mut above: Vec<&Path> = base.ancestors().skip(1).collect();
    above.reverse();
    for relative in above {
        if let Ok(parent) = jail.open_dir(requested, relative) {
            walker.push_ignore(&parent, relative);
        }
    }
    walker.walk(dir, base)?;
    Ok(walker.walked)
}

struct Walker<'a, F> {
    jail: &'a Jail,
    cancel: &'a CancellationToken,
    visit: F,
    /// The `.gitignore` rules of the directories from the root down to the
    /// one being walked (those that have one).
    ignores: Vec<Gitignore>,
    walked: Walked,
}

/// A directory being walked: one level of the walk's stack.
struct Frame {
    /// Its path relative to the workspace root.
    relative: PathBuf,
    /// Its name in its parent, to reopen it.
    name: OsString,
    /// Its device and inode, to tell that a reopened one is the same.
    id: (u64, u64),
    /// Its handle, while it is one of the innermost; `None` once released.
    dir: Option<Dir>,
    /// Its real path when anything is protected, to judge entries by name.
    real: Option<PathBuf>,
    /// Its entries not yet walked, in name order.
    entries: std::vec::IntoIter<(OsString, FileType)>,
    /// Whether it added `.gitignore` rules, taken off when it is done.
    rules: bool,
}

impl<F> Walker<'_, F>
where
    F: FnMut(&Found<'_>) -> Result<(), ToolError>,
{
    fn walk(&mut self, base: Dir, relative: &Path) -> Result<(), ToolError> {
        let Some(frame) = self.enter(base, relative.to_path_buf(), OsString::new()) else {
            return Ok(());
        };
        let mut stack = vec![frame];
        while let Some(top) = stack.last_mut() {
            if self.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            let Some((name, kind)) = top.entries.next() else {
                if stack.pop().is_some_and(|done| done.rules) {
                    self.ignores.pop();
                }
                continue;
            };
            if name.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            if top
                .real
                .as_ref()
                .is_some_and(|real| self.jail.is_protected(&real.join(&name)))
            {
                continue;
            }
            let child = top.relative.join(&name);
            if kind.is_dir() {
                if self.ignored(&child, true) {
                    continue;
                }
                // The stack holds the base and each level below it.
                if stack.len() > MAX_DEPTH {
                    self.walked.too_deep += 1;
                    continue;
                }
                let Some(dir) = handle(&mut stack) else {
                    continue;
                };
                let Some(sub) = open_subdir(dir, &name) else {
                    continue;
                };
                let Some(frame) = self.enter(sub, child, name) else {
                    continue;
                };
                stack.push(frame);
                release_outer(&mut stack);
            } else if kind.is_file() && !self.ignored(&child, false) {
                let Some(dir) = handle(&mut stack) else {
                    continue;
                };
                (self.visit)(&Found {
                    relative: &child,
                    source: Source::Entry(self.jail, dir, &name),
                })?;
            }
        }
        Ok(())
    }

    /// A frame for the opened directory `dir`, its entries read and its
    /// `.gitignore` rules added; `None` when it is Loom's state, or when
    /// where it is cannot be told while anything is protected (left out,
    /// as a refused open would be).
    fn enter(&mut self, dir: Dir, relative: PathBuf, name: OsString) -> Option<Frame> {
        let real = self.jail.real_dir_path(&dir).ok()?;
        if real.as_ref().is_some_and(|real| self.jail.is_protected(real)) {
            return None;
        }
        let meta = dir.dir_metadata().ok()?;
        let mut entries: Vec<(OsString, FileType)> = match dir.entries() {
            Ok(reader) => reader
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    Some((entry.file_name(), entry.file_type().ok()?))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let rules = self.push_ignore(&dir, &relative);
        Some(Frame {
            relative,
            name,
            id: (meta.dev(), meta.ino()),
            dir: Some(dir),
            real,
            entries: entries.into_iter(),
            rules,
        })
    }

    /// Adds the rules of `dir`'s `.gitignore`, if it has a readable one.
    fn push_ignore(&mut self, dir: &Dir, relative: &Path) -> bool {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .follow(FollowSymlinks::No)
            .custom_flags(libc::O_NONBLOCK);
        let Ok(file) = dir.open_with(".gitignore", &options) else {
            return false;
        };
        let mut file = file.into_std();
        if !file.metadata().is_ok_and(|meta| meta.is_file()) {
            return false;
        }
        let mut text = String::new();
        if std::io::Read::read_to_string(&mut file, &mut text).is_err() {
            return false;
        }
        let mut builder = GitignoreBuilder::new(self.jail.root().join(relative));
        for line in text.lines() {
            // A bad pattern is skipped, as git does.
            let _ = builder.add_line(None, line);
        }
        match builder.build() {
            Ok(rules) => {
                self.ignores.push(rules);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the deepest `.gitignore` with a say on `relative` ignores it.
    fn ignored(&self, relative: &Path, is_dir: bool) -> bool {
        let path = self.jail.root().join(relative);
        for rules in self.ignores.iter().rev() {
            match rules.matched(&path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }
}

/// The subdirectory `name` of `dir`, not through a link.
fn open_subdir(dir: &Dir, name: &OsStr) -> Option<Dir> {
    dir.open_dir_nofollow(name).ok()
}

/// The handle of the innermost directory on `stack`, reopened when it was
/// released: from the nearest directory above it that still has one, a
/// level at a time and never through a link. The innermost [`HELD`] levels
/// keep the reopened handles. `None` (and the directory is left, its
/// remaining entries dropped) when one of them is no longer the directory
/// that was walked: it was moved or swapped meanwhile.
fn handle(stack: &mut [Frame]) -> Option<&Dir> {
    let top = stack.len().checked_sub(1)?;
    if stack[top].dir.is_none() {
        let Some(held) = stack.iter().rposition(|frame| frame.dir.is_some()) else {
            stack[top].entries = Vec::new().into_iter();
            return None;
        };
        for level in held + 1..=top {
            let reopened = stack[level - 1]
                .dir
                .as_ref()
                .and_then(|parent| open_subdir(parent, &stack[level].name))
                .filter(|dir| {
                    dir.dir_metadata()
                        .is_ok_and(|meta| (meta.dev(), meta.ino()) == stack[level].id)
                });
            let Some(reopened) = reopened else {
                stack[top].entries = Vec::new().into_iter();
                return None;
            };
            stack[level].dir = Some(reopened);
            // Handles between the base and the innermost levels go again
            // once used, so no more than `HELD` of them are ever open.
            if level > 1 && level + HELD <= top + 1 {
                stack[level - 1].dir = None;
            }
        }
    }
    stack[top].dir.as_ref()
}

/// Closes the handle of the level just above the innermost [`HELD`], once
/// a level is added (never the base's, from which the others are reopened).
fn release_outer(stack: &mut [Frame]) {
    if let Some(outer) = stack.len().checked_sub(HELD + 1) {
        if outer > 0 {
            stack[outer].dir = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::jail::UNREADABLE;

    fn walked(jail: &Jail) -> Vec<String> {
        let mut seen = Vec::new();
        walk_files(jail, ".", Path::new(""), &CancellationToken::new(), |found| {
            seen.push(display(found.relative));
            Ok(())
        })
        .unwrap();
        seen
    }

    #[test]
    fn skips_a_directory_whose_real_path_cannot_be_told() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/secret.db"), "s").unwrap();
        std::fs::write(dir.path().join("top.txt"), "t").unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join("sub/secret.db")].into());
        let sub = root.join("sub");
        UNREADABLE.set(Some(Box::new(move |path: &Path| path == sub)));
        let seen = walked(&jail);
        UNREADABLE.set(None);
        assert_eq!(seen, ["top.txt"]);
    }

    #[test]
    fn a_found_file_is_judged_on_what_was_opened() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        std::fs::write(dir.path().join("state/loom.db"), "s").unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join("state")].into());
        // As if the walk had listed a plain file that became Loom's state
        // (say, its directory swapped) before it was opened.
        let state = Dir::open_ambient_dir(root.join("state"), cap_std::ambient_authority()).unwrap();
        let found = Found {
            relative: Path::new("plain/loom.db"),
            source: Source::Entry(&jail, &state, OsStr::new("loom.db")),
        };
        assert!(found.open().is_none());
    }

    #[test]
    fn holds_few_directories_open_however_deep() {
        fn open_fds() -> usize {
            std::fs::read_dir("/proc/self/fd").unwrap().count()
        }
        let dir = tempfile::tempdir().unwrap();
        let mut deep = PathBuf::from(dir.path());
        for _ in 0..100 {
            deep.push("d");
            std::fs::create_dir(&deep).unwrap();
            std::fs::write(deep.join("f.txt"), "f").unwrap();
        }
        let jail = Jail::new(dir.path()).unwrap();
        let before = open_fds();
        let mut most = 0;
        let mut files = 0;
        walk_files(&jail, ".", Path::new(""), &CancellationToken::new(), |_| {
            most = most.max(open_fds());
            files += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(files, 100);
        // Other tests run alongside and open files too: a margin, well
        // under one descriptor per level.
        assert!(
            most < before + 50,
            "{most} descriptors open during the walk, {before} before"
        );
    }

    /// Makes `openat2` fail with `ENOSYS` on this thread, as on a kernel
    /// without it, so that cap-std resolves paths itself (and remembers to
    /// for the rest of the process: only ever in a child process).
    fn deny_openat2() {
        // Classic BPF: load the syscall number, return ENOSYS for openat2,
        // allow everything else.
        let filter = [
            libc::sock_filter {
                code: 0x20,
                jt: 0,
                jf: 0,
                k: 0,
            },
            libc::sock_filter {
                code: 0x15,
                jt: 0,
                jf: 1,
                k: libc::SYS_openat2 as u32,
            },
            libc::sock_filter {
                code: 0x06,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
            },
            libc::sock_filter {
                code: 0x06,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ALLOW,
            },
        ];
        let program = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr().cast_mut(),
        };
        // SAFETY: plain prctl calls with a filter that outlives them.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &program as *const libc::sock_fprog
                ),
                0
            );
        }
        let how = [0u64; 3];
        // SAFETY: openat2 with a valid path and a zeroed `open_how`.
        let result = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD,
                c".".as_ptr(),
                how.as_ptr(),
                std::mem::size_of_val(&how),
            )
        };
        assert_eq!(result, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOSYS));
    }

    #[test]
    fn a_found_link_is_not_followed_where_cap_std_resolves_paths_itself() {
        const CHILD: &str = "LOOM_WALK_TEST_WITHOUT_OPENAT2";
        const NAME: &str = "files::walk::tests::a_found_link_is_not_followed_where_cap_std_resolves_paths_itself";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        deny_openat2();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        std::fs::write(dir.path().join("state/loom.db"), "s").unwrap();
        std::fs::write(dir.path().join("plain.txt"), "p").unwrap();
        std::os::unix::fs::symlink("plain.txt", dir.path().join("to_plain")).unwrap();
        std::os::unix::fs::symlink("state/loom.db", dir.path().join("to_state")).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join("state")].into());
        let handle = Dir::open_ambient_dir(&root, cap_std::ambient_authority()).unwrap();
        // cap-std, resolving by itself, does follow a link beneath the root.
        assert!(handle.open("to_plain").is_ok());
        // As if the walk had listed plain files that became links before
        // they were opened.
        for name in ["to_plain", "to_state"] {
            let found = Found {
                relative: Path::new(name),
                source: Source::Entry(&jail, &handle, OsStr::new(name)),
            };
            assert!(found.open().is_none(), "{name} was followed");
        }
        let plain = Found {
            relative: Path::new("plain.txt"),
            source: Source::Entry(&jail, &handle, OsStr::new("plain.txt")),
        };
        assert!(plain.open().is_some());

        // The whole walk, resolving by itself: into plain directories only.
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/x.txt"), "x").unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("to_sub")).unwrap();
        assert_eq!(walked(&jail), ["plain.txt", "sub/x.txt"]);
    }
}
