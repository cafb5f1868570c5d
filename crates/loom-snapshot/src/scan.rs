//! Making the next manifest of a workspace: a walk that honours
//! `.gitignore` and the configured include/exclude globs, and reads only the
//! files whose stat changed since the last scan — so a turn that changed 10
//! files of 10 000 reads 10. With the kernel's watches ([`crate::watch`])
//! the walk enters only the folders where something changed, so it
//! `lstat`s the files there, not all 10 000.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, Metadata, MetadataExt, OpenOptions};
use loom_core::SkipReason;
use sha2::{Digest, Sha256};

use crate::filter::Filter;
use crate::manifest::{Delta, Entry, Manifest};
use crate::walk::{walk, Scope};
use crate::watch::{Changes, Watch};

/// What `stat` said of a file when it was last read: the same again means
/// the same content (unless it was written within the clock's grain of the
/// scan, see [`Scanner::scan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_ns: i128,
    ino: u64,
    mode: u32,
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ino: meta.ino(),
            mode: meta.mode(),
        }
    }
}

/// One scan's result.
#[derive(Debug, Default)]
pub struct Scanned {
    /// What changed since the scan before (since nothing, for the first).
    pub delta: Delta,
    /// The content of each file read (new or changed), by hash: what a
    /// store must keep.
    pub contents: Vec<(String, Vec<u8>)>,
    /// Files left out, and why.
    pub skipped: Vec<Skipped>,
    /// How many files were read (the rest were known by their stat).
    pub read: usize,
}

/// A file a scan left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path.
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// Why.
    pub reason: SkipReason,
}

/// A file as the last scan left it.
#[derive(Debug)]
struct Known {
    stamp: Stamp,
    entry: Entry,
    /// The scan that last saw it.
    seen: u64,
}

/// A workspace's scanner, remembering each file's stat and entry from the
/// last scan: the manifest is what it knows.
#[derive(Debug)]
pub struct Scanner {
    root: PathBuf,
    filter: Filter,
    known: HashMap<String, Known>,
    /// How many scans were made.
    scans: u64,
    /// When the last scan began (ns since the epoch).
    last_scan_ns: i128,
    /// The kernel's watches on the workspace's folders, set by the last
    /// whole walk (`None`: none could be, and every scan walks it all).
    watch: Option<Watch>,
    /// Whether to watch at all.
    watching: bool,
    /// Files in the workspace that the snapshots do not hold, and the scan
    /// that last saw them: a restore must not write over them unasked.
    left_out: HashMap<String, (SkipReason, u64)>,
}

/// A scan that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot scan {path}: {source}")]
pub struct ScanError {
    path: String,
    #[source]
    source: std::io::Error,
}

impl Scanner {
    /// A scanner of the workspace at `root`, keeping what `filter` admits.
    pub fn new(root: &Path, filter: Filter) -> Self {
        Self {
            root: root.to_path_buf(),
            filter,
            known: HashMap::new(),
            scans: 0,
            last_scan_ns: 0,
            watch: None,
            watching: true,
            left_out: HashMap::new(),
        }
    }

    /// The same without the kernel's watches: every scan walks the whole
    /// workspace (what a scan costs without them, for the benchmark).
    pub fn without_watches(mut self) -> Self {
        self.watching = false;
        self.watch = None;
        self
    }

    /// A scanner that already knows `manifest` (a run resumed, with its last
    /// snapshot): its first scan reads every file once and reports only
    /// what differs from it.
    pub fn knowing(root: &Path, filter: Filter, manifest: &Manifest) -> Self {
        let mut scanner = Self::new(root, filter);
        for (path, entry) in &manifest.0 {
            // No stamp matches this one: every file is read, once.
            let stamp = Stamp {
                len: u64::MAX,
                mtime_ns: 0,
                ino: 0,
                mode: 0,
            };
            scanner.known.insert(
                path.clone(),
                Known {
                    stamp,
                    entry: entry.clone(),
                    seen: 0,
                },
            );
        }
        scanner
    }

    /// The files of the workspace the snapshots do not hold, as the last
    /// scan found them, and why.
    pub fn left_out(&self) -> impl Iterator<Item = (&str, SkipReason)> {
        self.left_out.iter().map(|(path, (reason, _))| (path.as_str(), *reason))
    }

    /// The workspace's files as the last scan found them.
    pub fn manifest(&self) -> Manifest {
        Manifest(
            self.known
                .iter()
                .map(|(path, known)| (path.clone(), known.entry.clone()))
                .collect(),
        )
    }

    /// What changed in the workspace since the last scan. Never `.git/`
    /// (anywhere) or the workspace's own `.loom/`. Only the files whose
    /// stat changed are read.
    pub fn scan(&mut self) -> Result<Scanned, ScanError> {
        let started_ns = now_ns();
        self.scans += 1;
        let scan = self.scans;
        let mut scanned = Scanned::default();
        let root = self.root.clone();
        let changes = match self.watch.as_mut() {
            Some(watch) => watch.take(),
            None => Changes::Everything,
        };
        let scope = match changes {
            Changes::Everything => {
                // New watches, each set before its folder is read.
                self.watch = if self.watching { Watch::new() } else { None };
                Scope::All
            }
            Changes::Within { dirs, trees } => Scope::part(dirs, trees),
        };
        let scope = Arc::new(scope);
        // Every file is looked at and read beneath this handle: a name that
        // leads out of the workspace (a folder swapped for a link while the
        // scan runs) fails, and is not in the snapshot.
        let beneath = Arc::new(
            Dir::open_ambient_dir(&root, cap_std::ambient_authority()).map_err(|source| ScanError {
                path: ".".to_string(),
                source,
            })?,
        );
        let (entries, watch) = if scope.is_empty() {
            // The kernel saw nothing change: nothing to walk.
            (Vec::new(), self.watch.take())
        } else {
            walk(&root, &beneath, &scope, self.watch.take())
        };
        self.watch = watch.filter(Watch::complete);
        for (path, meta) in &entries {
            let path = path.as_str();
            let link = meta.file_type().is_symlink();
            if !(meta.is_file() || link) || !self.filter.admits(path) {
                continue;
            }
            if let Some(reason) = self.filter.too_large(meta.len()) {
                self.leave_out(&mut scanned, path, meta.len(), reason, scan);
                continue;
            }
            let stamp = Stamp::of(meta);
            // Written within a second of the last scan: the same stat may
            // hide a change, so it is read again (git's "racily clean").
            let racy = stamp.mtime_ns + 1_000_000_000 >= self.last_scan_ns;
            if let Some(known) = self.known.get_mut(path) {
                if known.stamp == stamp && !racy {
                    known.seen = scan;
                    continue;
                }
            }
            let content = if link {
                // The target as written (an absolute one too, so that a
                // rewind removes a link a step made; a restore never makes
                // one that leads out, docs/rewind.md): a link is kept as a
                // link, never followed.
                beneath
                    .read_link_contents(path)
                    .map(|target| target.into_os_string().into_encoded_bytes())
            } else {
                read_beneath(&beneath, path)
            };
            let content = match content {
                Ok(content) => content,
                // Gone meanwhile, or made a link (to outside, maybe), a
                // folder or a file under a link: not in this snapshot; the
                // next scan sees what it is then.
                Err(err) if changed_meanwhile(&err) => continue,
                Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                    self.leave_out(&mut scanned, path, meta.len(), SkipReason::Unreadable, scan);
                    continue;
                }
                Err(source) => {
                    return Err(ScanError {
                        path: path.to_string(),
                        source,
                    })
                }
            };
            scanned.read += 1;
            if let Some(reason) = self.filter.holds_secret(&content).filter(|_| !link) {
                self.leave_out(&mut scanned, path, meta.len(), reason, scan);
                continue;
            }
            self.left_out.remove(path);
            let entry = Entry {
                hash: hex(&Sha256::digest(&content)),
                size: content.len() as u64,
                // Permission bits only: a restore never makes a file setuid,
                // setgid or sticky.
                mode: meta.mode() & crate::manifest::PERMISSION_BITS,
                link,
            };
            let known = Known {
                stamp,
                entry: entry.clone(),
                seen: scan,
            };
            let before = self.known.insert(path.to_string(), known);
            if before.is_none_or(|before| before.entry != entry) {
                scanned.contents.push((entry.hash.clone(), content));
                scanned.delta.changed.insert(path.to_string(), entry);
            }
        }
        // Left out and no longer there.
        self.left_out
            .retain(|path, (_, seen)| *seen == scan || !scope.covers(path));
        // What this scan looked for and did not see is gone.
        self.known.retain(|path, known| {
            let gone = known.seen != scan && scope.covers(path);
            if gone {
                scanned.delta.removed.insert(path.clone());
            }
            !gone
        });
        self.last_scan_ns = started_ns;
        Ok(scanned)
    }

    /// `path` is left out of the snapshots (for `reason`): reported, and
    /// no longer known (a snapshot that held it no longer does).
    fn leave_out(&mut self, scanned: &mut Scanned, path: &str, bytes: u64, reason: SkipReason, scan: u64) {
        self.known
            .remove(path)
            .map(|_| scanned.delta.removed.insert(path.to_string()));
        self.left_out.insert(path.to_string(), (reason, scan));
        scanned.skipped.push(Skipped {
            path: path.to_string(),
            bytes,
            reason,
        });
    }
}

/// An error that means the path is no longer what its `lstat` said.
fn changed_meanwhile(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::NotFound
        || matches!(
            err.raw_os_error(),
            Some(libc::ELOOP | libc::EINVAL | libc::ENOTDIR | libc::EISDIR)
        )
}

/// A file's content, opened beneath the workspace's handle without
/// following a link in its last component.
fn read_beneath(beneath: &Dir, path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    let mut file = beneath.open_with(path, &options)?;
    let mut content = Vec::new();
    file.read_to_end(&mut content)?;
    Ok(content)
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_scan_reads_only_what_changed_and_honours_gitignore() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::write(root.join("target/big.o"), "x").unwrap();
        std::fs::create_dir_all(root.join(".loom")).unwrap();
        std::fs::write(root.join(".loom/agents.md"), "x").unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        for i in 0..20 {
            std::fs::write(root.join(format!("src/{i}.rs")), format!("fn f{i}() {{}}")).unwrap();
        }
        let mut scanner = Scanner::new(root, Filter::default());
        let first = scanner.scan().unwrap();
        let manifest = scanner.manifest();
        assert_eq!(manifest.0.len(), 21, "{:?}", manifest.0.keys());
        assert_eq!(first.delta.changed.len(), 21);
        assert!(!manifest.0.contains_key("target/big.o"));
        assert!(!manifest.0.keys().any(|path| path.starts_with(".loom")));
        // Old enough that the stat can be trusted.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(scanner.scan().unwrap().delta.is_empty());
        std::fs::write(root.join("src/3.rs"), "changed").unwrap();
        std::fs::remove_file(root.join("src/4.rs")).unwrap();
        let third = scanner.scan().unwrap();
        assert_eq!(third.read, 1, "only the changed file is read");
        assert_eq!(third.delta.changed.keys().collect::<Vec<_>>(), ["src/3.rs"]);
        assert_eq!(third.delta.removed.len(), 1);
        assert_eq!(manifest.delta(&scanner.manifest()), third.delta);
    }

    #[test]
    fn files_over_the_limit_are_reported_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.bin"), vec![0u8; 100]).unwrap();
        std::fs::write(dir.path().join("small.txt"), "x").unwrap();
        let filter = Filter::new(&[], &["*.log".to_string()], 50).unwrap();
        std::fs::write(dir.path().join("run.log"), "x").unwrap();
        let mut scanner = Scanner::new(dir.path(), filter);
        let scanned = scanner.scan().unwrap();
        assert_eq!(scanner.manifest().0.keys().collect::<Vec<_>>(), ["small.txt"]);
        assert_eq!(
            scanned.skipped,
            [Skipped {
                path: "big.bin".to_string(),
                bytes: 100,
                reason: SkipReason::Size
            }]
        );
    }

    /// The watched scanner against a fresh whole walk, after rounds of
    /// random changes: files written, changed, removed, made executable,
    /// folders made with files and removed whole, files and folders
    /// renamed, an ignore rule added. Each round's delta must also turn the
    /// last manifest into the next.
    #[test]
    fn a_watched_scan_sees_what_a_whole_walk_sees() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in 0..6 {
            std::fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
            for f in 0..5 {
                std::fs::write(root.join(format!("d{d}/f{f}")), format!("{d}{f}")).unwrap();
            }
        }
        let mut watched = Scanner::new(root, Filter::default());
        watched.scan().unwrap();
        assert!(watched.watch.is_some(), "the kernel gives watches here");
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for round in 0..40 {
            let before = watched.manifest();
            for _ in 0..4 {
                let (d, f) = (next(8), next(6));
                let folder = root.join(format!("d{d}"));
                let file = folder.join(format!("f{f}"));
                match next(9) {
                    0 | 1 => {
                        std::fs::create_dir_all(&folder).unwrap();
                        std::fs::write(&file, format!("round {round}")).unwrap();
                    }
                    2 => {
                        let _ = std::fs::remove_file(&file);
                    }
                    3 => {
                        if file.is_file() {
                            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
                        }
                    }
                    4 => {
                        std::fs::create_dir_all(folder.join("deep/er")).unwrap();
                        std::fs::write(folder.join("deep/er/x"), format!("{round}")).unwrap();
                    }
                    5 => {
                        let _ = std::fs::remove_dir_all(&folder);
                    }
                    6 => {
                        let _ = std::fs::rename(&file, folder.join(format!("moved{round}")));
                    }
                    7 => {
                        let _ = std::fs::rename(&folder, root.join(format!("d{}", next(8) + 10)));
                    }
                    _ => {
                        let rule = if next(2) == 0 { "*.log\n" } else { "f1\n" };
                        std::fs::write(root.join(".gitignore"), rule).unwrap();
                        std::fs::write(root.join("d0.log"), "x").unwrap();
                    }
                }
            }
            let scanned = watched.scan().unwrap();
            let mut fresh = Scanner::new(root, Filter::default()).without_watches();
            fresh.scan().unwrap();
            assert_eq!(watched.manifest(), fresh.manifest(), "round {round}");
            let mut replayed = before;
            replayed.apply(&scanned.delta);
            assert_eq!(replayed, fresh.manifest(), "round {round}: the delta");
        }
    }

    #[test]
    fn a_scan_after_a_small_change_reads_only_the_folder_it_was_in() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in 0..20 {
            std::fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
            for f in 0..20 {
                std::fs::write(root.join(format!("d{d}/f{f}")), "x").unwrap();
            }
        }
        let mut scanner = Scanner::new(root, Filter::default());
        scanner.scan().unwrap();
        std::fs::write(root.join("d7/f3"), "changed").unwrap();
        std::fs::write(root.join("d7/new"), "new").unwrap();
        let scope = match scanner.watch.as_mut().unwrap().take() {
            Changes::Within { dirs, trees } => Scope::part(dirs, trees),
            Changes::Everything => panic!("a small change is not everything"),
        };
        assert!(scope.covers("d7/f0") && !scope.covers("d8/f0"));
        let beneath = Arc::new(Dir::open_ambient_dir(root, cap_std::ambient_authority()).unwrap());
        let (entries, _) = walk(root, &beneath, &Arc::new(scope), None);
        assert_eq!(entries.len(), 21, "the folder's files only");
    }

    /// A file redaction finds a secret in is left out (Loom keeps no copy),
    /// and remembered as left out, so a restore does not write over it.
    #[test]
    fn a_file_holding_a_secret_is_left_out_and_remembered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain.txt"), "hello").unwrap();
        std::fs::write(
            dir.path().join("creds.json"),
            "{\"key\": \"AKIAIOSFODNN7EXAMPLE\", \"secret\": \"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\"}",
        )
        .unwrap();
        let mut scanner = Scanner::new(dir.path(), Filter::default());
        let scanned = scanner.scan().unwrap();
        assert_eq!(scanner.manifest().0.keys().collect::<Vec<_>>(), ["plain.txt"]);
        assert_eq!(scanned.skipped.len(), 1);
        assert_eq!(scanned.skipped[0].reason, SkipReason::Secret);
        assert!(scanned.contents.iter().all(|(_, content)| !content.starts_with(b"{")));
        assert_eq!(
            scanner.left_out().collect::<Vec<_>>(),
            [("creds.json", SkipReason::Secret)]
        );
        std::fs::remove_file(dir.path().join("creds.json")).unwrap();
        scanner.scan().unwrap();
        assert_eq!(scanner.left_out().count(), 0, "gone, and forgotten");
        let mut keeping = Scanner::new(dir.path(), Filter::default().keeping_secrets());
        std::fs::write(
            dir.path().join("creds.json"),
            "token = ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
        )
        .unwrap();
        keeping.scan().unwrap();
        assert_eq!(keeping.manifest().0.len(), 2);
    }

    /// `.git/` at any depth, the workspace's own `.loom/` and `loom.toml`
    /// are never held; a project's own below are.
    #[test]
    fn git_and_the_workspaces_loom_files_are_never_held() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in [".git/hooks", "vendor/.git", "sub/.loom", ".loom"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        for file in [
            ".git/config",
            "vendor/.git/HEAD",
            ".loom/x",
            "loom.toml",
            "sub/.loom/x",
            "sub/loom.toml",
            "a",
        ] {
            std::fs::write(root.join(file), "x").unwrap();
        }
        std::fs::write(root.join(".GIT"), "x").unwrap();
        let mut scanner = Scanner::new(root, Filter::default());
        scanner.scan().unwrap();
        assert_eq!(
            scanner.manifest().0.keys().collect::<Vec<_>>(),
            ["a", "sub/.loom/x", "sub/loom.toml"]
        );
    }

    /// A folder swapped for a link to outside while scans run: nothing
    /// outside is ever named or read into a snapshot.
    #[test]
    fn a_folder_swapped_for_a_link_never_brings_outside_files_in() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("outside-only.txt"), "OUTSIDE SECRET").unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("swap")).unwrap();
        std::fs::write(root.join("swap/inside.txt"), "inside").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (root, stop) = (root.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut swaps = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::rename(root.join("swap"), root.join("tmp"));
                    let _ = std::fs::rename(root.join("link"), root.join("swap"));
                    let _ = std::fs::rename(root.join("swap"), root.join("link"));
                    let _ = std::fs::rename(root.join("tmp"), root.join("swap"));
                    swaps += 1;
                }
                swaps
            })
        };
        for watching in [true, false] {
            let mut scanner = Scanner::new(&root, Filter::default());
            if !watching {
                scanner = scanner.without_watches();
            }
            for _ in 0..200 {
                let scanned = scanner.scan().unwrap();
                let named = format!("{:?}{:?}", scanned.delta, scanned.skipped);
                assert!(!named.contains("outside-only"), "{named}");
                assert!(
                    scanned.contents.iter().all(|(_, content)| content != b"OUTSIDE SECRET"),
                    "an outside file was read"
                );
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(swapper.join().unwrap() > 100, "the swapper hardly ran");
    }
}
