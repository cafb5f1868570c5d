//! Where Loom keeps its own state: outside every workspace, so that no
//! tool — a file tool, or a `bash` command sandboxed or not — finds it
//! where it works (docs/security.md). One directory per workspace under
//! the state base (`LOOM_STATE_DIR`, else
//! `$XDG_STATE_HOME/loom`, else `~/.local/state/loom`), created
//! owner-only, holds the run database and the web page's session key;
//! the base also holds the user's trust records (`trust.rs`).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use sha2::{Digest, Sha256};

/// The state base: `LOOM_STATE_DIR`, else `$XDG_STATE_HOME/loom`, else
/// `~/.local/state/loom`.
pub(crate) fn base_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("LOOM_STATE_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local").join("state")))
        .ok_or_else(|| anyhow!("no place for Loom's state: set LOOM_STATE_DIR, XDG_STATE_HOME or HOME"))?;
    Ok(base.join("loom"))
}

/// The state directory of `workspace` (created owner-only), with any state
/// an older Loom kept in the workspace's `.loom/` moved into it.
pub(crate) fn workspace_dir(workspace: &Path) -> Result<PathBuf> {
    let real = workspace
        .canonicalize()
        .with_context(|| format!("workspace {}", workspace.display()))?;
    let base = base_dir()?;
    private_dir(&base)?;
    private_dir(&base.join("workspaces"))?;
    let dir = base.join("workspaces").join(key(&real));
    private_dir(&dir)?;
    migrate(&real.join(".loom"), &dir);
    Ok(dir)
}

/// `NAME-HASH`: the workspace's last component (for a person browsing the
/// directory) and 16 hex digits of its path's SHA-256 (so two workspaces
/// of the same name never share state).
fn key(workspace: &Path) -> String {
    let name: String = workspace
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".to_string())
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let digest = Sha256::digest(workspace.as_os_str().as_encoded_bytes());
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{name}-{hash}")
}

/// Creates `dir` (and its parents) readable by its owner only. A
/// directory that is already there keeps its mode: it may be one the user
/// chose (`LOOM_STATE_DIR`).
pub(crate) fn private_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))?;
    }
    Ok(())
}

/// Creates `file` empty and owner-only if it does not exist (SQLite would
/// create it world-readable under the usual umask; its journal files take
/// the database's mode).
pub(crate) fn private_file(file: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(file) {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(err).with_context(|| format!("cannot create {}", file.display())),
    }
}

/// Moves the state files of an older Loom from `legacy` (a workspace's
/// `.loom/`) to `dir`, unless `dir` already has a database. Project
/// configuration in `.loom/` stays where it is.
fn migrate(legacy: &Path, dir: &Path) {
    // Regular files in a real `.loom/` only: a link planted in a cloned
    // project must not bring another workspace's or another file's
    // contents into this workspace's state.
    let regular = |path: &Path| std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_file());
    let real_dir = std::fs::symlink_metadata(legacy).is_ok_and(|meta| meta.file_type().is_dir());
    if !real_dir || !regular(&legacy.join("loom.db")) || dir.join("loom.db").exists() {
        return;
    }
    let mut moved = Vec::new();
    for name in loom::LEGACY_STATE {
        let from = legacy.join(name);
        let to = dir.join(name);
        // Never over what the state directory already has.
        if !regular(&from) || to.exists() {
            continue;
        }
        let result = std::fs::rename(&from, &to).or_else(|_| {
            // Another file system: copy, then remove the original.
            std::fs::copy(&from, &to).and_then(|_| std::fs::remove_file(&from))
        });
        match result {
            Ok(()) => {
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let _ = std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600));
                }
                moved.push(*name);
            }
            Err(err) => say!(
                "loom: warning: could not move {} to {}: {err}",
                from.display(),
                to.display()
            ),
        }
    }
    if !moved.is_empty() {
        say!(
            "loom: note: moved Loom's state ({}) from {} to {}, out of the tools' reach",
            moved.join(", "),
            legacy.display(),
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_workspaces_of_one_name_have_their_own_keys() {
        let a = key(Path::new("/home/a/project"));
        let b = key(Path::new("/home/b/project"));
        assert!(a.starts_with("project-") && b.starts_with("project-"), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(key(Path::new("/")), format!("root-{}", &key(Path::new("/"))[5..]));
        assert!(key(Path::new("/x/we ird..name")).starts_with("we_ird__name-"));
    }
}
