//! Confinement of file tools to the workspace.
//!
//! A requested path is refused when it is absolute and outside the
//! workspace, when `..` climbs out of it, or when a symlink on the way leads
//! out of it. The check resolves the deepest part of the path that exists
//! with `canonicalize`, so links are judged by where they really point.
//! Loom's own state (the workspace's `.loom/`, the run database) is refused
//! too, however it is reached.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use loom_core::ToolError;

/// The workspace root that file tools may not leave.
#[derive(Debug, Clone)]
pub struct Jail {
    root: PathBuf,
    /// Canonical paths no tool may touch (see `ToolContext::protected`).
    protected: Arc<[PathBuf]>,
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

impl From<PathError> for ToolError {
    fn from(err: PathError) -> Self {
        ToolError::InvalidArguments(err.to_string())
    }
}

impl Jail {
    /// A jail at `root`, which must exist.
    pub fn new(root: &Path) -> io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
            protected: Arc::from(Vec::new()),
        })
    }

    /// The same jail, also refusing `protected` paths and what is under them.
    pub fn protecting(mut self, protected: Arc<[PathBuf]>) -> Self {
        self.protected = protected;
        self
    }

    /// Whether `path` (real) is, or is under, a protected path.
    pub fn is_protected(&self, path: &Path) -> bool {
        loom_core::tool::is_protected(&self.protected, path)
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `requested` to a real path inside the workspace. The path
    /// need not exist (for files about to be written).
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, PathError> {
        let refuse = |reason: String| PathError {
            requested: requested.to_string(),
            reason,
        };
        let raw = Path::new(requested);
        let joined = if raw.is_absolute() {
            raw.to_path_buf()
        } else {
            self.root.join(raw)
        };
        let normalized = normalize(&joined);
        if !normalized.starts_with(&self.root) {
            return Err(refuse(format!("it is outside the workspace {}", self.root.display())));
        }

        // Judge symlinks by their targets: canonicalize the deepest ancestor
        // that exists (the path itself when it exists).
        for existing in normalized.ancestors() {
            match std::fs::symlink_metadata(existing) {
                Ok(_) => {
                    let real = existing
                        .canonicalize()
                        .map_err(|err| refuse(format!("it goes through a link that cannot be followed ({err})")))?;
                    if !real.starts_with(&self.root) {
                        return Err(refuse(format!(
                            "a symbolic link leads outside the workspace (to {})",
                            real.display()
                        )));
                    }
                    let rest = normalized.strip_prefix(existing).unwrap_or(Path::new(""));
                    let resolved = if rest.as_os_str().is_empty() {
                        real
                    } else {
                        real.join(rest)
                    };
                    if self.is_protected(&resolved) {
                        return Err(refuse(
                            "it is Loom's own state (its run database and records), which tools may not read or change"
                                .to_string(),
                        ));
                    }
                    return Ok(resolved);
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(refuse(format!("it cannot be inspected ({err})"))),
            }
        }
        Err(refuse("no part of it exists".to_string()))
    }

    /// `path` relative to the root, with `/` separators, for output.
    pub fn display(&self, path: &Path) -> String {
        let relative = path.strip_prefix(&self.root).unwrap_or(path);
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
    fn resolves_inside_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "x").unwrap();
        let jail = Jail::new(dir.path()).unwrap();
        let root = jail.root().to_path_buf();

        assert_eq!(jail.resolve("sub/a.txt").unwrap(), root.join("sub/a.txt"));
        assert_eq!(jail.resolve("./sub/../sub/a.txt").unwrap(), root.join("sub/a.txt"));
        assert_eq!(jail.resolve("new/dir/file.txt").unwrap(), root.join("new/dir/file.txt"));
        assert_eq!(
            jail.resolve(root.join("sub").to_str().unwrap()).unwrap(),
            root.join("sub")
        );
        assert_eq!(jail.resolve("").unwrap(), root);

        let err = jail.resolve("/etc/passwd").unwrap_err();
        assert!(err.to_string().contains("outside the workspace"), "{err}");
        assert!(jail.resolve("../outside.txt").is_err());
        assert!(jail.resolve("sub/../../x").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn refuses_loom_state_however_it_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".loom")).unwrap();
        std::fs::write(dir.path().join(".loom/loom.db"), "db").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::os::unix::fs::symlink(dir.path().join(".loom"), dir.path().join("state")).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join(".loom"), root.join("data/runs.db")].into());
        for path in [
            ".loom",
            ".loom/loom.db",
            ".loom/new.txt",
            "./sub/../.loom/loom.db",
            "state/loom.db",
            "data/runs.db",
        ] {
            let err = jail.resolve(path).unwrap_err();
            assert!(err.to_string().contains("Loom's own state"), "{path}: {err}");
        }
        assert!(jail.resolve("data/other.db").is_ok());
        assert!(jail.resolve(".loomish").is_ok(), "only the directory itself");
    }

    #[cfg(unix)]
    #[test]
    fn refuses_symlinks_that_lead_out() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("nothing"), dir.path().join("dangling")).unwrap();
        std::fs::write(dir.path().join("inside.txt"), "i").unwrap();
        std::os::unix::fs::symlink(dir.path().join("inside.txt"), dir.path().join("ok_link")).unwrap();
        let jail = Jail::new(dir.path()).unwrap();

        let err = jail.resolve("link/secret").unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(jail.resolve("link/new_file").is_err());
        assert!(jail.resolve("dangling").is_err());
        assert!(jail.resolve("ok_link").is_ok());
    }
}
