//! Bringing a workspace back to a snapshot: what would change
//! ([`Plan`], for a dry run and for the refusal when a file changed
//! outside Loom), and the change itself — every path opened beneath a
//! handle of the workspace (no link leads out), each file written to a
//! temporary name and renamed over the old one, `.loom/` never touched.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, Permissions};

use crate::manifest::{Entry, Manifest};
use crate::store::{SnapshotStore, StoreError};

/// What restoring a snapshot changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Files written (created, changed back, or given their mode back).
    pub write: Vec<String>,
    /// Files removed (created after the snapshot).
    pub remove: Vec<String>,
}

impl Plan {
    /// What turns the workspace `now` into `target`.
    pub fn between(now: &Manifest, target: &Manifest) -> Self {
        let delta = now.delta(target);
        Self {
            write: delta.changed.into_keys().collect(),
            remove: delta.removed.into_iter().collect(),
        }
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty()
    }
}

/// The files of `plan` that are not as Loom last saw them (`last`): a
/// person (or another program) changed them since, and a restore would
/// lose their change.
pub fn changed_outside(plan: &Plan, now: &Manifest, last: &Manifest) -> Vec<String> {
    plan.write
        .iter()
        .chain(&plan.remove)
        .filter(|path| now.0.get(*path) != last.0.get(*path))
        .cloned()
        .collect()
}

/// A restore that failed part way (the files before `path` are restored).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A file could not be written or removed.
    #[error("cannot restore {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The store lacks a content the snapshot needs, or failed.
    #[error("cannot restore {path}: {reason}")]
    Content {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Carries out `plan` in the workspace at `root`, toward `target`, with
/// contents from `store`. Every path is reached one folder at a time
/// without following a link (a folder swapped for a link — to outside, or
/// to `.loom/` — stops the restore of that path with an error), and no
/// path under the workspace's `.loom/` is written or removed.
pub fn apply(root: &Path, plan: &Plan, target: &Manifest, store: &dyn SnapshotStore) -> Result<(), RestoreError> {
    let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(|source| RestoreError::File {
        path: ".".to_string(),
        source,
    })?;
    let failed = |path: &str| {
        let path = path.to_string();
        move |source| RestoreError::File { path, source }
    };
    // Removals first, and the folders they leave empty: a path that is a
    // folder now and a file in the snapshot (or the other way round) is
    // free before it is written.
    for path in &plan.remove {
        if is_loom_state(path) {
            continue;
        }
        let (folder, name) = match folder_of(&dir, path, false) {
            Ok(found) => found,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(failed(path)(source)),
        };
        match folder.remove_file(&name) {
            Ok(()) => prune_empty_parents(&dir, path),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(failed(path)(source)),
        }
    }
    for path in &plan.write {
        if is_loom_state(path) {
            continue;
        }
        let Some(entry) = target.0.get(path) else {
            continue;
        };
        let content = store.content(&entry.hash)?.ok_or_else(|| RestoreError::Content {
            path: path.clone(),
            reason: "its content is not in the snapshot store".to_string(),
        })?;
        let (folder, name) = folder_of(&dir, path, true).map_err(failed(path))?;
        write(&folder, &name, entry, &content).map_err(failed(path))?;
    }
    Ok(())
}

/// The folder holding `path` (opened one component at a time, never
/// through a link; made when missing if `create`), and the file's name.
fn folder_of(root: &Dir, path: &str, create: bool) -> std::io::Result<(Dir, String)> {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or_default().to_string();
    let unsafe_part = |part: &&str| part.is_empty() || *part == "." || *part == "..";
    if name.is_empty() || unsafe_part(&name.as_str()) || parts.iter().any(unsafe_part) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a plain path in the workspace",
        ));
    }
    let mut folder = root.try_clone()?;
    for part in parts {
        if create {
            match folder.create_dir(part) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err),
            }
        }
        folder = folder.open_dir_nofollow(part)?;
    }
    Ok((folder, name))
}

/// Removes the folders above `path` that are empty now, up to the
/// workspace (folders are not in snapshots: one a restore emptied goes, as
/// in git).
fn prune_empty_parents(root: &Dir, path: &str) {
    let mut folder = path.rsplit_once('/').map(|(folder, _)| folder);
    while let Some(at) = folder {
        let Ok((holder, name)) = folder_of(root, at, false) else {
            break;
        };
        if holder.remove_dir(&name).is_err() {
            break;
        }
        folder = at.rsplit_once('/').map(|(folder, _)| folder);
    }
}

fn is_loom_state(path: &str) -> bool {
    path == ".loom" || path.starts_with(".loom/")
}

/// One file, atomically: written beside itself under a temporary name,
/// then renamed over it (the temporary file removed if that fails).
fn write(folder: &Dir, name: &str, entry: &Entry, content: &[u8]) -> std::io::Result<()> {
    let temporary = format!(".{name}.loom-restore-{}", std::process::id());
    let _ = folder.remove_file(&temporary);
    let written = if entry.link {
        let original = String::from_utf8_lossy(content).into_owned();
        folder.symlink_contents(original, &temporary)
    } else {
        folder.write(&temporary, content).and_then(|()| {
            folder.set_permissions(
                &temporary,
                Permissions::from_std(std::fs::Permissions::from_mode(entry.mode)),
            )
        })
    };
    let renamed = written.and_then(|()| folder.rename(&temporary, folder, name));
    if renamed.is_err() {
        let _ = folder.remove_file(&temporary);
    }
    renamed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Filter;
    use crate::scan::Scanner;
    use crate::store::SqliteSnapshots;

    /// The workspace `ws` scanned and recorded as step 0 of run `r`, in a
    /// database under `dir`; the scanner that knows it.
    fn first_snapshot(dir: &Path, ws: &Path) -> (SqliteSnapshots, Scanner) {
        let mut store = SqliteSnapshots::open(&dir.join("db")).unwrap();
        let mut scanner = Scanner::new(ws, Filter::default());
        let before = scanner.scan().unwrap();
        store
            .record(&crate::store::tests::point("r", 0, None, &before))
            .unwrap();
        (store, scanner)
    }

    #[test]
    fn a_workspace_goes_back_to_a_snapshot_byte_for_byte_and_mode_for_mode() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("src")).unwrap();
        std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(ws.join("run.sh"), "echo hi\n").unwrap();
        std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (store, mut scanner) = first_snapshot(dir.path(), &ws);

        // A turn: an edit, a deletion, a new file, a mode change, a link.
        std::fs::write(ws.join("src/main.rs"), "fn main() { panic!() }\n").unwrap();
        std::fs::remove_file(ws.join("run.sh")).unwrap();
        std::fs::write(ws.join("new.txt"), "new").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("src/link")).unwrap();
        std::fs::create_dir_all(ws.join(".loom")).unwrap();
        std::fs::write(ws.join(".loom/keep"), "x").unwrap();
        scanner.scan().unwrap();
        let now = scanner.manifest();

        let target = store.manifest_at("r", 0).unwrap().unwrap();
        let plan = Plan::between(&now, &target);
        assert_eq!(plan.write, ["run.sh", "src/main.rs"]);
        assert_eq!(plan.remove, ["new.txt", "src/link"]);
        apply(&ws, &plan, &target, &store).unwrap();
        let mut check = Scanner::new(&ws, Filter::default());
        check.scan().unwrap();
        assert_eq!(check.manifest(), target);
        assert_eq!(
            std::fs::read_to_string(ws.join("src/main.rs")).unwrap(),
            "fn main() {}\n"
        );
        assert_eq!(
            std::fs::metadata(ws.join("run.sh")).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(ws.join(".loom/keep").exists(), ".loom is never touched");
        assert!(Plan::between(&target, &target).is_empty());
    }

    #[test]
    fn a_folder_where_the_snapshot_had_a_file_and_a_file_where_it_had_a_folder_are_restored() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("x")).unwrap();
        std::fs::write(ws.join("x/inner"), "inner").unwrap();
        std::fs::write(ws.join("y"), "file y").unwrap();
        let (store, mut scanner) = first_snapshot(dir.path(), &ws);
        let target = scanner.manifest();

        // `x` becomes a file, `y` a folder.
        std::fs::remove_dir_all(ws.join("x")).unwrap();
        std::fs::write(ws.join("x"), "file x").unwrap();
        std::fs::remove_file(ws.join("y")).unwrap();
        std::fs::create_dir_all(ws.join("y/deep")).unwrap();
        std::fs::write(ws.join("y/deep/z"), "z").unwrap();
        scanner.scan().unwrap();
        let plan = Plan::between(&scanner.manifest(), &target);
        apply(&ws, &plan, &target, &store).unwrap();
        let mut check = Scanner::new(&ws, Filter::default());
        check.scan().unwrap();
        assert_eq!(check.manifest(), target);
        assert_eq!(std::fs::read_to_string(ws.join("y")).unwrap(), "file y");
    }

    #[test]
    fn a_file_changed_since_loom_last_saw_it_is_named() {
        let entry = |hash: &str| Entry {
            hash: hash.to_string(),
            size: 1,
            mode: 0o644,
            link: false,
        };
        let last = Manifest([("a".to_string(), entry("2")), ("b".to_string(), entry("2"))].into());
        let now = Manifest([("a".to_string(), entry("3")), ("b".to_string(), entry("2"))].into());
        let target = Manifest([("a".to_string(), entry("1")), ("b".to_string(), entry("1"))].into());
        let plan = Plan::between(&now, &target);
        assert_eq!(changed_outside(&plan, &now, &last), ["a"]);
    }

    /// The plan was made; then a folder was swapped for a link to `.loom/`
    /// (the race a second process could win): the restore stops at that
    /// path and writes nothing under `.loom/`.
    #[test]
    fn a_folder_swapped_for_a_link_after_the_plan_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(ws.join(".loom")).unwrap();
        std::fs::write(ws.join(".loom/keep"), "project").unwrap();
        std::fs::write(ws.join("sub/a"), "old").unwrap();
        let (store, mut scanner) = first_snapshot(dir.path(), &ws);
        std::fs::write(ws.join("sub/a"), "new").unwrap();
        std::fs::write(ws.join("sub/b"), "made later").unwrap();
        scanner.scan().unwrap();
        let target = store.manifest_at("r", 0).unwrap().unwrap();
        let plan = Plan::between(&scanner.manifest(), &target);
        assert_eq!((plan.write.len(), plan.remove.len()), (1, 1));
        std::fs::rename(ws.join("sub"), ws.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(".loom", ws.join("sub")).unwrap();
        assert!(apply(&ws, &plan, &target, &store).is_err());
        let mut loom: Vec<String> = std::fs::read_dir(ws.join(".loom"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        loom.sort();
        assert_eq!(loom, ["keep"], "nothing written or removed in .loom/");
        assert_eq!(std::fs::read_to_string(ws.join(".loom/keep")).unwrap(), "project");
    }
}
