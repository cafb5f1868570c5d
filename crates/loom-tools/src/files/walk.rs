//! The walk of `glob` and `grep`: a directory tree read through handles.
//!
//! Each subdirectory is opened beneath its parent's handle without following
//! a link, and each file is opened through its directory's handle the same
//! way, so a directory swapped for a link to the outside mid-walk is simply
//! not entered (docs/tools.md, "How paths are resolved"). `.gitignore` files
//! are read through the same handles; hidden entries and Loom's own state are
//! skipped, and symbolic links are not followed at all.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use cap_std::fs::{Dir, FileType, OpenOptions, OpenOptionsExt};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;
use loom_core::{CancellationToken, ToolError};

use super::open_error;
use crate::jail::{display, Jail, OpenError};

/// A regular file the walk found.
pub(super) struct Found<'a> {
    /// Its path relative to the workspace root.
    pub(super) relative: &'a Path,
    source: Source<'a>,
}

enum Source<'a> {
    /// An entry of a directory opened during the walk.
    Entry(&'a Dir, &'a OsStr),
    /// The walk's base, which is a file: opened as any requested path is.
    Base(&'a Jail, &'a str),
}

impl Found<'_> {
    /// The file opened for reading; `None` when it cannot be opened or is no
    /// longer a regular file (it changed since it was listed).
    pub(super) fn open(&self) -> Option<std::fs::File> {
        let file = match self.source {
            Source::Entry(dir, name) => {
                let mut options = OpenOptions::new();
                // Not through a link swapped in since the listing, and not
                // hanging on a FIFO.
                options.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
                dir.open_with(name, &options).ok()?.into_std()
            }
            Source::Base(jail, requested) => jail.open_read(requested, self.relative).ok()?,
        };
        file.metadata().ok()?.is_file().then_some(file)
    }
}

/// Calls `visit` with each regular file under `base` (relative to the
/// workspace root; `requested` is how the model named it), in name order,
/// honouring `.gitignore` (also outside git repositories) and skipping hidden
/// entries, links and Loom's own state. A base that is a file is visited
/// alone; one that cannot be opened has no files. Stops with `Cancelled` as
/// soon as `cancel` fires.
pub(super) fn walk_files(
    jail: &Jail,
    requested: &str,
    base: &Path,
    cancel: &CancellationToken,
    visit: impl FnMut(&Found<'_>) -> Result<(), ToolError>,
) -> Result<(), ToolError> {
    let mut walker = Walker {
        jail,
        cancel,
        visit,
        ignores: Vec::new(),
    };
    let dir = match jail.open_dir(requested, base) {
        Ok(dir) => dir,
        Err(OpenError::Io(err)) if err.kind() == std::io::ErrorKind::NotADirectory => {
            return (walker.visit)(&Found {
                relative: base,
                source: Source::Base(jail, requested),
            });
        }
        Err(refused @ OpenError::Refused(_)) => return Err(open_error("search", &display(base), refused)),
        Err(OpenError::Io(_)) => return Ok(()),
    };
    // The rules of the directories above the base, inside the workspace.
    let mut above: Vec<&Path> = base.ancestors().skip(1).collect();
    above.reverse();
    for relative in above {
        if let Ok(parent) = jail.open_dir(requested, relative) {
            walker.push_ignore(&parent, relative);
        }
    }
    walker.walk_dir(&dir, base)
}

struct Walker<'a, F> {
    jail: &'a Jail,
    cancel: &'a CancellationToken,
    visit: F,
    /// The `.gitignore` rules of the directories from the root down to the
    /// one being walked (those that have one).
    ignores: Vec<Gitignore>,
}

impl<F> Walker<'_, F>
where
    F: FnMut(&Found<'_>) -> Result<(), ToolError>,
{
    fn walk_dir(&mut self, dir: &Dir, relative: &Path) -> Result<(), ToolError> {
        let pushed = self.push_ignore(dir, relative);
        let result = self.walk_entries(dir, relative);
        if pushed {
            self.ignores.pop();
        }
        result
    }

    fn walk_entries(&mut self, dir: &Dir, relative: &Path) -> Result<(), ToolError> {
        if self.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let real = self.jail.real_dir_path(dir);
        let Ok(reader) = dir.entries() else {
            return Ok(());
        };
        let mut entries: Vec<(OsString, FileType)> = reader
            .filter_map(|entry| {
                let entry = entry.ok()?;
                Some((entry.file_name(), entry.file_type().ok()?))
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in entries {
            if self.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            if name.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            if real
                .as_ref()
                .is_some_and(|real| self.jail.is_protected(&real.join(&name)))
            {
                continue;
            }
            let child = relative.join(&name);
            if kind.is_dir() {
                if self.ignored(&child, true) {
                    continue;
                }
                let Some(sub) = open_subdir(dir, &name) else {
                    continue;
                };
                if self
                    .jail
                    .real_dir_path(&sub)
                    .is_some_and(|real| self.jail.is_protected(&real))
                {
                    continue;
                }
                self.walk_dir(&sub, &child)?;
            } else if kind.is_file() && !self.ignored(&child, false) {
                (self.visit)(&Found {
                    relative: &child,
                    source: Source::Entry(dir, &name),
                })?;
            }
        }
        Ok(())
    }

    /// Adds the rules of `dir`'s `.gitignore`, if it has a readable one.
    fn push_ignore(&mut self, dir: &Dir, relative: &Path) -> bool {
        let mut options = OpenOptions::new();
        options.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
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
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW);
    let file = dir.open_with(name, &options).ok()?;
    Some(Dir::from_std_file(file.into_std()))
}
