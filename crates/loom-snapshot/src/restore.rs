//! Bringing a workspace back to a snapshot: what would change
//! ([`Plan`], for a dry run and for the refusal when a file changed
//! outside Loom), and the change itself — every record it writes and its
//! content judged first ([`crate::validate`]: one that fails refuses the
//! whole restore, naming it, before anything is written), every path
//! opened beneath a handle of the workspace (no link leads out, nor to the
//! workspace itself), each file written to a new temporary name and
//! renamed over the old one, `.git/`, `.loom/` and `loom.toml` never
//! touched.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt, Permissions};

use crate::manifest::{Entry, Manifest};
use crate::store::{SnapshotStore, SnapshotStoreError};
use crate::validate::{self, Refused, Why};

/// Contents kept in memory between their check and their write, up to
/// this many bytes in all; past it a content is read again as it is
/// written, and checked again.
const KEEP_CHECKED_BYTES: usize = 64 * 1024 * 1024;

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

/// A restore that was refused, or failed part way (the files before
/// `path` are restored).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A record of the snapshot, or its content, is not one a restore
    /// writes: nothing was written.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A file could not be written or removed.
    #[error("cannot restore {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] SnapshotStoreError),
}

/// Carries out `plan` in the workspace at `root`, toward `target`, with
/// contents from `store`. Every record written and its content are judged
/// first ([`crate::validate`]); one that fails refuses the restore before
/// anything is written. `root` is reached without following a link in any
/// of its components, and every path beneath it one folder at a time
/// without following a link (a folder swapped for a link — to outside, or
/// to `.loom/` — stops the restore of that path with an error). No path
/// under `.git/`, the workspace's `.loom/` or its `loom.toml` is written
/// or removed.
pub fn apply(root: &Path, plan: &Plan, target: &Manifest, store: &dyn SnapshotStore) -> Result<(), RestoreError> {
    let writes: Vec<(&str, &Entry)> = plan
        .write
        .iter()
        .filter_map(|path| Some((path.as_str(), target.0.get(path)?)))
        .collect();
    let checked = check_all(&writes, store)?;
    let dir = open_without_links(root).map_err(|source| RestoreError::File {
        path: root.display().to_string(),
        source,
    })?;
    let failed = |path: &str| {
        let path = path.to_string();
        move |source| RestoreError::File { path, source }
    };
    // Removals first, and the folders they leave empty: a path that is a
    // folder now and a file in the snapshot (or the other way round) is
    // free before it is written. They come from the scan of the workspace
    // as it is; a path no snapshot holds is left alone all the same.
    for path in &plan.remove {
        if crate::reserved::is_reserved(path) {
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
    for (path, entry) in writes {
        let content = match checked.get(entry.hash.as_str()) {
            Some(content) => Cow::Borrowed(content.as_slice()),
            // Past what is kept in memory: read again, and judged again.
            None => Cow::Owned(checked_content(store, path, entry)?),
        };
        let (folder, name) = folder_of(&dir, path, true).map_err(failed(path))?;
        write(&folder, &name, entry, &content).map_err(failed(path))?;
    }
    Ok(())
}

/// Judges every record of `writes` and its content, before anything is
/// written; the contents checked, by hash, as far as they fit in
/// [`KEEP_CHECKED_BYTES`].
fn check_all<'a>(
    writes: &[(&str, &'a Entry)],
    store: &dyn SnapshotStore,
) -> Result<HashMap<&'a str, Vec<u8>>, RestoreError> {
    let mut kept: HashMap<&str, Vec<u8>> = HashMap::new();
    let mut kept_bytes = 0;
    for (path, entry) in writes {
        validate::record(path, entry)?;
        match kept.get(entry.hash.as_str()) {
            // Checked for another path: a link's target is judged for this one.
            Some(content) => validate::content(path, entry, content)?,
            None => {
                let content = checked_content(store, path, entry)?;
                if kept_bytes + content.len() <= KEEP_CHECKED_BYTES {
                    kept_bytes += content.len();
                    kept.insert(entry.hash.as_str(), content);
                }
            }
        }
    }
    Ok(kept)
}

/// The content `entry` names, from `store`, judged against the record.
fn checked_content(store: &dyn SnapshotStore, path: &str, entry: &Entry) -> Result<Vec<u8>, RestoreError> {
    let content = store.content(&entry.hash)?.ok_or_else(|| Refused {
        path: path.to_string(),
        why: Why::Missing,
    })?;
    validate::content(path, entry, &content)?;
    Ok(content)
}

/// The folder at `root`, opened one component at a time without following
/// a link in any of them (a fork's `--into` reached through a link a run
/// planted would lead wherever the link does).
fn open_without_links(root: &Path) -> std::io::Result<Dir> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let start = if root.is_absolute() { "/" } else { "." };
    let mut at = openat(CWD, start, flags, Mode::empty())?;
    for component in root.components() {
        let name: &OsStr = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(name) => name,
            Component::Prefix(_) => return Err(std::io::ErrorKind::InvalidInput.into()),
        };
        at = openat(&at, name, flags, Mode::empty()).map_err(|errno| {
            if errno == rustix::io::Errno::LOOP || errno == rustix::io::Errno::NOTDIR {
                std::io::Error::other(format!(
                    "{} is reached through a symbolic link, or is not a folder: a restore goes only into a folder named by its real path",
                    root.display()
                ))
            } else {
                errno.into()
            }
        })?;
    }
    Ok(Dir::from_std_file(std::fs::File::from(at)))
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

/// One file, atomically: written beside itself under a temporary name,
/// then renamed over it (the temporary file removed if that fails). A
/// regular file is made new (never opened through a link planted at the
/// temporary name), owner-only until its content is in, then given the
/// record's permission bits — never more.
fn write(folder: &Dir, name: &str, entry: &Entry, content: &[u8]) -> std::io::Result<()> {
    let temporary = format!(".{name}.loom-restore-{}", std::process::id());
    let _ = folder.remove_file(&temporary);
    let written = if entry.link {
        folder.symlink_contents(Path::new(OsStr::from_bytes(content)), &temporary)
    } else {
        // Never writable by group or others from a record: a crafted one
        // must not hand the file to every local user.
        write_new(
            folder,
            &temporary,
            content,
            entry.mode & validate::PERMISSION_BITS & !0o022,
        )
    };
    let renamed = written.and_then(|()| folder.rename(&temporary, folder, name));
    if renamed.is_err() {
        let _ = folder.remove_file(&temporary);
    }
    renamed
}

/// A new regular file `name` in `folder` holding `content`, with `mode`.
fn write_new(folder: &Dir, name: &str, content: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = OpenOptions::new();
    options.write(true).create_new(true).mode(0o600);
    let mut file = folder.open_with(name, &options)?;
    file.write_all(content)?;
    file.set_permissions(Permissions::from_std(std::fs::Permissions::from_mode(mode)))
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

    fn entry_of(content: &[u8], mode: u32, link: bool) -> Entry {
        use sha2::Digest;
        Entry {
            hash: crate::scan::hex(&sha2::Sha256::digest(content)),
            size: content.len() as u64,
            mode,
            link,
        }
    }

    /// Records written into the store by someone else than this
    /// workspace's scans (whoever reaches a shared Redis): each bad one
    /// refuses the whole restore, naming it, and nothing is written — not
    /// even the good record that sorts before it.
    #[test]
    fn a_crafted_record_refuses_the_whole_restore_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("a.txt"), "as it is").unwrap();
        let hook = b"#!/bin/sh\nid > /tmp/pwned\n".to_vec();
        let wrong_size = Entry {
            size: 3,
            ..entry_of(&hook, 0o644, false)
        };
        let other = entry_of(b"what the record claims", 0o644, false);
        let cases: Vec<(&str, Entry, Vec<u8>, &str)> = vec![
            (
                ".git/hooks/pre-commit",
                entry_of(&hook, 0o755, false),
                hook.clone(),
                "no snapshot holds",
            ),
            (
                "vendor/.git/hooks/pre-commit",
                entry_of(&hook, 0o755, false),
                hook.clone(),
                "no snapshot holds",
            ),
            (
                ".loom/x",
                entry_of(&hook, 0o644, false),
                hook.clone(),
                "no snapshot holds",
            ),
            (
                "loom.toml",
                entry_of(&hook, 0o644, false),
                hook.clone(),
                "no snapshot holds",
            ),
            ("zz-root-shell", entry_of(&hook, 0o6755, false), hook.clone(), "0o6755"),
            ("zz-fifo", entry_of(&hook, 0o010_644, false), hook.clone(), "file type"),
            ("zz-size", wrong_size, hook.clone(), "the record says 3"),
            (
                "zz-hash",
                other.clone(),
                b"what the record CLAIMS".to_vec(),
                "does not hash",
            ),
            ("zz-link", entry_of(b"/etc", 0o777, true), b"/etc".to_vec(), "leads out"),
            (
                "../zz-out",
                entry_of(&hook, 0o644, false),
                hook.clone(),
                "plain relative path",
            ),
        ];
        for (path, entry, content, said) in cases {
            let mut store = SqliteSnapshots::open(&dir.path().join(format!("{}.db", path.replace('/', "_")))).unwrap();
            let good = entry_of(b"from the snapshot", 0o644, false);
            let delta = crate::manifest::Delta {
                changed: [("a.txt".to_string(), good.clone()), (path.to_string(), entry.clone())].into(),
                removed: Default::default(),
            };
            let contents = vec![
                (good.hash.clone(), b"from the snapshot".to_vec()),
                (entry.hash.clone(), content),
            ];
            store
                .record(&crate::store::NewPoint {
                    run: "r",
                    step: 0,
                    base: None,
                    delta: &delta,
                    contents: &contents,
                    left_out: &[],
                    head_of: None,
                    fence: None,
                })
                .unwrap();
            let target = store.manifest_at("r", 0).unwrap().unwrap();
            let plan = Plan {
                write: target.0.keys().cloned().collect(),
                remove: Vec::new(),
            };
            let refused = apply(&ws, &plan, &target, &store).unwrap_err();
            let told = refused.to_string();
            assert!(
                matches!(&refused, RestoreError::Refused(r) if r.path == path),
                "{path}: {told}"
            );
            assert!(told.contains(said), "{path}: {told}");
            assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "as it is", "{path}");
            let names: Vec<_> = std::fs::read_dir(&ws)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["a.txt"], "{path}: nothing else written");
        }
        // A content the store lacks.
        let store = SqliteSnapshots::open(&dir.path().join("missing.db")).unwrap();
        let target = Manifest([("b.txt".to_string(), other)].into());
        let plan = Plan::between(&Manifest::default(), &target);
        let refused = apply(&ws, &plan, &target, &store).unwrap_err();
        assert!(refused.to_string().contains("not in the snapshot store"), "{refused}");
    }

    /// A setuid, setgid or sticky file in the workspace is recorded with
    /// its permission bits only, and restored without them.
    #[test]
    fn a_restore_gives_a_file_its_permission_bits_and_never_setuid_setgid_or_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(ws.join("tool"), std::fs::Permissions::from_mode(0o7755)).unwrap();
        let (store, mut scanner) = first_snapshot(dir.path(), &ws);
        let target = store.manifest_at("r", 0).unwrap().unwrap();
        assert_eq!(target.0["tool"].mode, 0o755);
        std::fs::remove_file(ws.join("tool")).unwrap();
        scanner.scan().unwrap();
        let plan = Plan::between(&scanner.manifest(), &target);
        apply(&ws, &plan, &target, &store).unwrap();
        let mode = std::fs::metadata(ws.join("tool")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "{mode:o}");
    }

    /// A restore into a folder reached through a link (one a run planted,
    /// to the user's configuration) is refused: nothing is written there.
    #[test]
    fn a_restore_into_a_folder_reached_through_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("AGENTS.md"), "the model's").unwrap();
        let (store, _) = first_snapshot(dir.path(), &ws);
        let target = store.manifest_at("r", 0).unwrap().unwrap();
        let config = dir.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        std::os::unix::fs::symlink(&config, ws.join("planted")).unwrap();
        let plan = Plan::between(&Manifest::default(), &target);
        for into in [ws.join("planted"), ws.join("planted/loom")] {
            let refused = apply(&into, &plan, &target, &store).unwrap_err();
            assert!(refused.to_string().contains("symbolic link"), "{refused}");
        }
        assert_eq!(std::fs::read_dir(&config).unwrap().count(), 0);
    }
}
