//! Confinement of the file tools to the workspace.
//!
//! A call opens the workspace once as a directory handle and does every open,
//! create, mkdir, listing and stat *through* it with `cap-std`, which resolves
//! a path beneath the handle (`openat2` with `RESOLVE_BENEATH` on Linux) and
//! refuses any step — `..`, an absolute link, a link that climbs out — that
//! would leave it. There is no check of a path followed by a second open of
//! it, so a link swapped in between cannot redirect the call (docs/tools.md,
//! "How paths are resolved").
//!
//! Loom's own state (`protected`) and configuration tools may only read
//! (`read_only`) are judged on what was actually opened: the real path of the
//! opened handle, read back from `/proc/self/fd`, since a link inside the
//! workspace may lead to them.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use loom_core::ToolError;

/// Why Loom's state is refused, in words the model can act on.
const STATE_REASON: &str = "it is Loom's own state (its run database and records), which tools may not read or change";

/// The workspace root that file tools may not leave, opened as a handle.
#[derive(Debug)]
pub struct Jail {
    dir: Dir,
    /// The real path of `dir`.
    root: PathBuf,
    /// The workspace as configured, normalized: absolute paths the model
    /// copies from it are inside too.
    given: PathBuf,
    /// Canonical paths no tool may touch (see `ToolContext::protected`).
    protected: Arc<[PathBuf]>,
    /// Canonical paths tools may read but not change (see `ToolContext::read_only`).
    read_only: Arc<[PathBuf]>,
}

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
#[error("path '{requested}' is refused: {reason}. Use a path inside the workspace, relative to its root")]
pub struct PathError {
    /// The path as the model gave it.
    pub requested: String,
    /// Why it was refused.
    pub reason: String,
}

impl PathError {
    fn new(requested: &str, reason: impl Into<String>) -> Self {
        Self {
            requested: requested.to_string(),
            reason: reason.into(),
        }
    }
}

impl From<PathError> for ToolError {
    fn from(err: PathError) -> Self {
        ToolError::InvalidArguments(err.to_string())
    }
}

/// Why an open through the jail failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The path is refused (outside, Loom's state, read-only, hard-linked).
    #[error(transparent)]
    Refused(#[from] PathError),
    /// The file system said no (missing, permission, a directory…).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// How a file is opened for changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Replace the whole content (`write_file`); created when missing.
    Replace,
    /// Add at the end (`write_file` with `append`); created when missing.
    Append,
    /// Read then rewrite (`edit_file`); it must exist.
    Edit,
}

impl Jail {
    /// A jail at `root`, which must be an existing directory. The root is
    /// the one path opened with ambient authority.
    pub fn new(root: &Path) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
        let real = real_path(&dir).or_else(|_| root.canonicalize())?;
        Ok(Self {
            dir,
            root: real,
            // Absolute, so that only absolute paths can be under it.
            given: normalize(&std::path::absolute(root)?),
            protected: Arc::from(Vec::new()),
            read_only: Arc::from(Vec::new()),
        })
    }

    /// The same jail, also refusing `protected` paths and what is under them.
    pub fn protecting(mut self, protected: Arc<[PathBuf]>) -> Self {
        self.protected = protected;
        self
    }

    /// The same jail, refusing to change `read_only` paths and what is under them.
    pub fn keeping_read_only(mut self, read_only: Arc<[PathBuf]>) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether `path` (real) is, or is under, a protected path.
    pub fn is_protected(&self, path: &Path) -> bool {
        loom_core::tool::is_protected(&self.protected, path)
    }

    /// Whether `path` (real) is, or is under, a read-only path.
    pub fn is_read_only(&self, path: &Path) -> bool {
        loom_core::tool::is_protected(&self.read_only, path)
    }

    /// Whether anything is protected, so real paths are worth reading.
    pub(crate) fn protects_anything(&self) -> bool {
        !self.protected.is_empty()
    }

    /// The real path of the root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `requested` as a path relative to the root, without `.` or `..` (an
    /// empty path is the root). Touches no file: absolute paths outside,
    /// `..` that climbs out and what is plainly Loom's state are refused.
    /// Links are judged later, when the path is opened through the handle.
    pub fn relative(&self, requested: &str) -> Result<PathBuf, PathError> {
        let normalized = normalize(&self.root.join(requested));
        let outside = || {
            PathError::new(
                requested,
                format!("it is outside the workspace {}", self.root.display()),
            )
        };
        let relative = match normalized.strip_prefix(&self.root) {
            Ok(rest) => rest.to_path_buf(),
            // An absolute path under the workspace as configured (through a
            // link to it, say) is inside too.
            Err(_) => normalized
                .strip_prefix(&self.given)
                .map(Path::to_path_buf)
                .map_err(|_| outside())?,
        };
        // Whatever is handed to cap-std is plainly relative; it would refuse
        // anything else too, in words less clear.
        if relative.has_root() || relative.components().any(|c| c == Component::ParentDir) {
            return Err(outside());
        }
        if self.is_protected(&self.root.join(&relative)) {
            return Err(PathError::new(requested, STATE_REASON));
        }
        Ok(relative)
    }

    /// Opens the file (or directory) at `relative` for reading, following
    /// links while they stay beneath the root. Refuses Loom's state.
    pub fn open_read(&self, requested: &str, relative: &Path) -> Result<std::fs::File, OpenError> {
        let mut options = OpenOptions::new();
        // Non-blocking, so a FIFO cannot hang the call; callers refuse
        // anything that is not a regular file before reading.
        options.read(true).custom_flags(libc::O_NONBLOCK);
        let file = self
            .dir
            .open_with(here(relative), &options)
            .map_err(|err| refusal(requested, err))?
            .into_std();
        self.check(requested, &file, None, false)?;
        Ok(file)
    }

    /// Opens the directory at `relative`, following links while they stay
    /// beneath the root. Refuses Loom's state.
    pub fn open_dir(&self, requested: &str, relative: &Path) -> Result<Dir, OpenError> {
        let dir = self
            .dir
            .open_dir(here(relative))
            .map_err(|err| refusal(requested, err))?;
        self.check(requested, &dir, None, false)?;
        Ok(dir)
    }

    /// Opens the file at `relative` for changing it, and whether it existed.
    /// An existing file is opened without creating or truncating anything,
    /// then judged on the opened handle: Loom's state, read-only paths, a
    /// non-regular file and a file with more than one hard link (which may
    /// be shared with a file outside) are refused. A missing file is created
    /// in its parent directory, opened (and made when missing) through the
    /// handle and judged before anything is created in it.
    pub fn open_write(
        &self,
        requested: &str,
        relative: &Path,
        mode: WriteMode,
    ) -> Result<(std::fs::File, bool), OpenError> {
        let Some(name) = relative.file_name() else {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "the workspace root is a directory").into());
        };
        // A file that appears between the two opens is judged as existing:
        // a few rounds, then a dangling link is what stands in the way.
        for _ in 0..3 {
            let mut options = OpenOptions::new();
            match mode {
                WriteMode::Replace => options.write(true),
                WriteMode::Append => options.append(true),
                WriteMode::Edit => options.read(true).write(true),
            };
            // Non-blocking: opening a FIFO for writing must not wait for a reader.
            options.custom_flags(libc::O_NONBLOCK);
            match self.dir.open_with(relative, &options) {
                Ok(file) => {
                    let file = file.into_std();
                    self.check_writable(requested, &file)?;
                    return Ok((file, true));
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound && mode != WriteMode::Edit => {}
                Err(err) => return Err(refusal(requested, err)),
            }

            let parent = self.make_dir_all(requested, relative.parent().unwrap_or(Path::new("")))?;
            self.check(requested, &parent, Some(name), true)?;
            let mut options = OpenOptions::new();
            options.write(true).create_new(true);
            if mode == WriteMode::Append {
                options.append(true);
            }
            match parent.open_with(name, &options) {
                Ok(file) => return Ok((file.into_std(), false)),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(refusal(requested, err)),
            }
        }
        Err(PathError::new(
            requested,
            "it is a symbolic link to a file that does not exist; write to a path that is not a link",
        )
        .into())
    }

    /// Opens the directory at `relative`, creating what is missing one
    /// directory at a time through handles, each judged (as the directory
    /// it would be) before it is made, so nothing is made where Loom's state
    /// or a read-only path is.
    fn make_dir_all(&self, requested: &str, relative: &Path) -> Result<Dir, OpenError> {
        match self.open_dir(requested, relative) {
            Ok(dir) => return Ok(dir),
            Err(OpenError::Io(err)) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let mut current = self.dir.try_clone()?;
        let mut prefix = PathBuf::new();
        for component in relative.components() {
            prefix.push(component);
            let next = match self.open_dir(requested, &prefix) {
                Ok(dir) => dir,
                Err(OpenError::Io(err)) if err.kind() == io::ErrorKind::NotFound => {
                    // Judge the directory about to be made, by its parent's
                    // real path and its name, before making it: made first,
                    // a refused one (`.loom/`, `loom.toml/`) would be left.
                    self.check(requested, &current, Some(component.as_os_str()), true)?;
                    match current.create_dir(component) {
                        Ok(()) => {}
                        // Made meanwhile by someone else: use it.
                        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(err) => return Err(refusal(requested, err)),
                    }
                    let dir = current.open_dir(component).map_err(|err| refusal(requested, err))?;
                    self.check(requested, &dir, None, true)?;
                    dir
                }
                Err(err) => return Err(err),
            };
            current = next;
        }
        Ok(current)
    }

    /// Refuses an opened file that must not be changed.
    fn check_writable(&self, requested: &str, file: &std::fs::File) -> Result<(), OpenError> {
        self.check(requested, file, None, true)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory").into());
        }
        if !meta.is_file() {
            return Err(PathError::new(requested, "it is not a regular file").into());
        }
        if meta.nlink() > 1 {
            return Err(PathError::new(
                requested,
                format!(
                    "it has {} hard links, and a hard link may be a file outside the workspace, so it is never changed in place; \
                     write a new file instead",
                    meta.nlink()
                ),
            )
            .into());
        }
        Ok(())
    }

    /// Refuses `handle` (with `name`, for a file about to be created in it)
    /// when its real path is Loom's state or, when `writing`, read-only.
    fn check(&self, requested: &str, handle: &impl AsFd, name: Option<&OsStr>, writing: bool) -> Result<(), PathError> {
        if self.protected.is_empty() && (!writing || self.read_only.is_empty()) {
            return Ok(());
        }
        let real = real_path(handle)
            .map_err(|err| PathError::new(requested, format!("where it really is cannot be told ({err})")))?;
        let real = match name {
            Some(name) => real.join(name),
            None => real,
        };
        if self.is_protected(&real) {
            return Err(PathError::new(requested, STATE_REASON));
        }
        if writing && self.is_read_only(&real) {
            return Err(PathError::new(
                requested,
                "it is configuration Loom reads (such as loom.toml), which tools may read but not change",
            ));
        }
        Ok(())
    }

    /// The real path of an opened directory when something is protected
    /// (`None` when nothing is), to judge its entries by name. An error when
    /// it cannot be told: the caller must then skip or refuse the directory,
    /// as [`Jail::check`] does, never show it unjudged.
    pub(crate) fn real_dir_path(&self, dir: &Dir) -> io::Result<Option<PathBuf>> {
        if !self.protects_anything() {
            return Ok(None);
        }
        real_path(dir).map(Some)
    }

    /// Whether an opened file or directory may be read: not Loom's state,
    /// and where it is can be told when anything is protected.
    pub(crate) fn may_read(&self, handle: &impl AsFd) -> bool {
        self.check("", handle, None, false).is_ok()
    }

    /// What the link (or other entry) at `relative` leads to, followed
    /// beneath the root only. `Ok(None)` when that is Loom's state or where
    /// it is cannot be told: nothing of it, not even its size, may be shown.
    /// Opened as a path only (`O_PATH`), so nothing is read, no permission
    /// is needed and no device or FIFO is touched.
    pub(crate) fn target_metadata(&self, relative: &Path) -> io::Result<Option<std::fs::Metadata>> {
        let mut options = OpenOptions::new();
        options.read(true).custom_flags(libc::O_PATH);
        let target = self.dir.open_with(here(relative), &options)?.into_std();
        if !self.may_read(&target) {
            return Ok(None);
        }
        target.metadata().map(Some)
    }
}

/// `relative`, relative to the workspace root, with `/` separators, for output.
pub fn display(relative: &Path) -> String {
    let shown = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/");
    if shown.is_empty() {
        ".".to_string()
    } else {
        shown
    }
}

/// The real path of an opened file or directory, as the kernel knows it.
pub fn real_path(handle: &impl AsFd) -> io::Result<PathBuf> {
    let path = std::fs::read_link(format!("/proc/self/fd/{}", handle.as_fd().as_raw_fd()))?;
    #[cfg(test)]
    if UNREADABLE.with_borrow_mut(|unreadable| unreadable.as_mut().is_some_and(|unreadable| unreadable(&path))) {
        return Err(io::Error::other("cannot be read back (test)"));
    }
    Ok(path)
}

/// A test's stand-in for a `/proc` that cannot be read: tells which real
/// paths this thread cannot read back.
#[cfg(test)]
type Unreadable = Box<dyn FnMut(&Path) -> bool>;

#[cfg(test)]
thread_local! {
    pub(crate) static UNREADABLE: std::cell::RefCell<Option<Unreadable>> = const { std::cell::RefCell::new(None) };
}

/// The root itself for an empty path: cap-std takes `.` for it.
fn here(relative: &Path) -> &Path {
    if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    }
}

/// Whether cap-std refused `err`'s path because it would leave the root.
pub fn is_escape(err: &io::Error) -> bool {
    // cap-std reports an escape as PermissionDenied with no OS error code;
    // a real EACCES carries one.
    err.kind() == io::ErrorKind::PermissionDenied && err.raw_os_error().is_none()
}

/// cap-std's refusal of a path that would leave the root, in the jail's
/// words; any other error as it is.
fn refusal(requested: &str, err: io::Error) -> OpenError {
    if is_escape(&err) {
        return PathError::new(
            requested,
            "a symbolic link on the way leads outside the workspace (links are followed only while they \
             stay inside it, and only when their target is a relative path)",
        )
        .into();
    }
    OpenError::Io(err)
}

/// Removes `.` and resolves `..` without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let jail = Jail::new(dir.path()).unwrap();
        let root = jail.root().to_path_buf();

        assert_eq!(jail.relative("sub/a.txt").unwrap(), Path::new("sub/a.txt"));
        assert_eq!(jail.relative("./sub/../sub/a.txt").unwrap(), Path::new("sub/a.txt"));
        assert_eq!(
            jail.relative("new/dir/file.txt").unwrap(),
            Path::new("new/dir/file.txt")
        );
        assert_eq!(
            jail.relative(root.join("sub").to_str().unwrap()).unwrap(),
            Path::new("sub")
        );
        assert_eq!(jail.relative("").unwrap(), Path::new(""));
        assert_eq!(jail.relative(".").unwrap(), Path::new(""));

        let err = jail.relative("/etc/passwd").unwrap_err();
        assert!(err.to_string().contains("outside the workspace"), "{err}");
        assert!(jail.relative("../outside.txt").is_err());
        assert!(jail.relative("sub/../../x").is_err());
    }

    #[test]
    fn absolute_paths_through_the_configured_workspace_are_inside() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("real")).unwrap();
        std::os::unix::fs::symlink(base.path().join("real"), base.path().join("alias")).unwrap();
        let jail = Jail::new(&base.path().join("alias")).unwrap();
        let through_alias = base.path().join("alias/sub/a.txt");
        assert_eq!(
            jail.relative(through_alias.to_str().unwrap()).unwrap(),
            Path::new("sub/a.txt")
        );
        let root = base.path().join("alias");
        assert_eq!(jail.relative(root.to_str().unwrap()).unwrap(), Path::new(""));
    }

    #[test]
    fn a_relative_workspace_path_lets_nothing_else_in() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        let relative = pathdiff(dir.path().join("ws"));
        let jail = Jail::new(&relative).unwrap();
        let err = jail.relative("../elsewhere.txt").unwrap_err();
        assert!(err.to_string().contains("outside the workspace"), "{err}");
        assert!(jail.relative("/etc/passwd").is_err());
        assert_eq!(
            jail.relative(dir.path().join("ws/a.txt").to_str().unwrap()).unwrap(),
            Path::new("a.txt")
        );

        // The current directory itself: `.` must not make every path inside.
        let here = Jail::new(Path::new(".")).unwrap();
        assert!(here.relative("../x").is_err());
        assert!(here.relative("/etc/passwd").is_err());
        assert_eq!(here.relative("src/lib.rs").unwrap(), Path::new("src/lib.rs"));
    }

    /// `path` relative to the current directory (`../..` up to `/`, then down).
    fn pathdiff(path: PathBuf) -> PathBuf {
        let cwd = std::env::current_dir().unwrap();
        let mut out = PathBuf::new();
        for _ in cwd.components().skip(1) {
            out.push("..");
        }
        out.join(path.strip_prefix("/").unwrap())
    }

    #[test]
    fn refuses_loom_state_however_it_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".loom")).unwrap();
        std::fs::write(dir.path().join(".loom/loom.db"), "db").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::os::unix::fs::symlink(".loom", dir.path().join("state")).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join(".loom"), root.join("data/runs.db")].into());
        for path in [
            ".loom",
            ".loom/loom.db",
            ".loom/new.txt",
            "./sub/../.loom/loom.db",
            "data/runs.db",
        ] {
            let err = jail.relative(path).unwrap_err();
            assert!(err.to_string().contains("Loom's own state"), "{path}: {err}");
        }
        // Through a link, the opened handle tells.
        let relative = jail.relative("state/loom.db").unwrap();
        let err = jail.open_read("state/loom.db", &relative).unwrap_err();
        assert!(err.to_string().contains("Loom's own state"), "{err}");
        let relative = jail.relative("state/new.txt").unwrap();
        let err = jail
            .open_write("state/new.txt", &relative, WriteMode::Replace)
            .unwrap_err();
        assert!(err.to_string().contains("Loom's own state"), "{err}");
        let err = jail
            .open_write(
                "state/deeper/new.txt",
                Path::new("state/deeper/new.txt"),
                WriteMode::Replace,
            )
            .unwrap_err();
        assert!(err.to_string().contains("Loom's own state"), "{err}");
        assert!(!dir.path().join(".loom/new.txt").exists());
        assert!(
            !dir.path().join(".loom/deeper").exists(),
            "nothing made under Loom's state"
        );

        assert!(jail.relative("data/other.db").is_ok());
        assert!(jail.relative(".loomish").is_ok(), "only the directory itself");
    }

    #[test]
    fn refuses_symlinks_that_lead_out_when_opening() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("nothing"), dir.path().join("dangling")).unwrap();
        std::fs::write(dir.path().join("inside.txt"), "i").unwrap();
        std::os::unix::fs::symlink("inside.txt", dir.path().join("ok_link")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("../inside.txt", dir.path().join("sub/up_link")).unwrap();
        let jail = Jail::new(dir.path()).unwrap();

        let err = jail.open_read("link/secret", Path::new("link/secret")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(jail
            .open_write("link/new_file", Path::new("link/new_file"), WriteMode::Replace)
            .is_err());
        assert!(!outside.path().join("new_file").exists());
        assert!(jail
            .open_write("dangling", Path::new("dangling"), WriteMode::Replace)
            .is_err());
        assert!(!outside.path().join("nothing").exists());
        assert!(jail.open_read("ok_link", Path::new("ok_link")).is_ok());
        assert!(jail.open_read("sub/up_link", Path::new("sub/up_link")).is_ok());
    }

    #[test]
    fn makes_no_directory_where_one_would_be_protected_or_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join("state")].into())
            .keeping_read_only(vec![root.join(".loom"), root.join("loom.toml"), root.join("conf")].into());
        for path in [".loom/x", "loom.toml/x", "conf/deep/x"] {
            let err = jail.open_write(path, Path::new(path), WriteMode::Replace).unwrap_err();
            assert!(err.to_string().contains("may read but not change"), "{path}: {err}");
        }
        // Protected: refused up front by `relative`, and by the open too.
        let err = jail
            .open_write("state/x", Path::new("state/x"), WriteMode::Replace)
            .unwrap_err();
        assert!(err.to_string().contains("Loom's own state"), "{err}");
        for made in [".loom", "loom.toml", "conf", "state"] {
            assert!(!dir.path().join(made).exists(), "{made} was made");
        }
        assert!(jail
            .open_write("fine/deeper/x", Path::new("fine/deeper/x"), WriteMode::Replace)
            .is_ok());
    }
}
