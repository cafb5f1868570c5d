//! Making the next manifest of a workspace: a walk that honours
//! `.gitignore` and the configured include/exclude globs, and reads only the
//! files whose stat changed since the last scan — so a turn that changed 10
//! files of 10 000 reads 10. With the kernel's watches ([`crate::watch`])
//! the walk enters only the folders where something changed, so it
//! `lstat`s the files there, not all 10 000.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use globset::{Glob, GlobSet, GlobSetBuilder};
use sha2::{Digest, Sha256};

use crate::manifest::{Delta, Entry, Manifest};
use crate::watch::{Changes, Watch};

/// Which files a snapshot holds.
#[derive(Debug, Clone)]
pub struct Filter {
    /// When set, only files matching one of these.
    include: Option<GlobSet>,
    /// Never files matching one of these.
    exclude: GlobSet,
    /// Files larger than this are left out, and reported.
    max_file_bytes: u64,
    /// Never these paths (Loom's own files, when they are in the workspace).
    never: HashSet<String>,
}

impl Filter {
    /// Files matching `include` (all when empty), not `exclude`, at most
    /// `max_file_bytes` each. Globs match the `/`-separated path in the
    /// workspace (`src/**`, `*.log`).
    pub fn new(include: &[String], exclude: &[String], max_file_bytes: u64) -> Result<Self, globset::Error> {
        let set = |globs: &[String]| -> Result<GlobSet, globset::Error> {
            let mut builder = GlobSetBuilder::new();
            for glob in globs {
                builder.add(Glob::new(glob)?);
            }
            builder.build()
        };
        Ok(Self {
            include: if include.is_empty() { None } else { Some(set(include)?) },
            exclude: set(exclude)?,
            max_file_bytes,
            never: HashSet::new(),
        })
    }

    /// Leaves out these paths too, whatever the globs say: a run database
    /// (and the snapshots' own) kept in the workspace, which a restore
    /// must never write.
    pub fn never(mut self, paths: impl IntoIterator<Item = String>) -> Self {
        self.never.extend(paths);
        self
    }

    fn admits(&self, path: &str) -> bool {
        !self.never.contains(path)
            && !self.exclude.is_match(path)
            && self.include.as_ref().is_none_or(|include| include.is_match(path))
    }
}

impl Default for Filter {
    /// Every file `.gitignore` does not leave out, up to 2 MiB each.
    fn default() -> Self {
        Self {
            include: None,
            exclude: GlobSet::empty(),
            max_file_bytes: 2 * 1024 * 1024,
            never: HashSet::new(),
        }
    }
}

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
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            len: meta.size(),
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
    /// Files left out for their size, with it.
    pub skipped: Vec<(String, u64)>,
    /// How many files were read (the rest were known by their stat).
    pub read: usize,
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
        let (entries, watch) = walk(&root, &scope, self.watch.take());
        self.watch = watch.filter(Watch::complete);
        for (path, meta) in &entries {
            let path = path.as_str();
            let link = meta.file_type().is_symlink();
            if !(meta.is_file() || link) || !self.filter.admits(path) {
                continue;
            }
            if meta.size() > self.filter.max_file_bytes {
                scanned.skipped.push((path.to_string(), meta.size()));
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
            let full = root.join(path);
            let content = if link {
                std::fs::read_link(&full).map(|target| target.into_os_string().into_encoded_bytes())
            } else {
                std::fs::read(&full)
            };
            let content = match content {
                Ok(content) => content,
                // Gone meanwhile: not in this snapshot.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(ScanError {
                        path: path.to_string(),
                        source,
                    })
                }
            };
            scanned.read += 1;
            let entry = Entry {
                hash: hex(&Sha256::digest(&content)),
                size: content.len() as u64,
                mode: meta.mode() & 0o7777,
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
}

/// What a scan looks at.
#[derive(Debug)]
enum Scope {
    /// The whole workspace.
    All,
    /// The entries of `dirs`, and all beneath `trees`.
    Part {
        dirs: HashSet<String>,
        trees: HashSet<String>,
        /// The folders the walk enters to reach them.
        path_to: HashSet<String>,
    },
}

impl Scope {
    fn part(dirs: HashSet<String>, trees: HashSet<String>) -> Self {
        let mut path_to = HashSet::from([String::new()]);
        for dir in dirs.iter().chain(&trees) {
            let mut at = dir.as_str();
            loop {
                path_to.insert(at.to_string());
                match at.rfind('/') {
                    Some(slash) => at = &at[..slash],
                    None => break,
                }
            }
        }
        Self::Part { dirs, trees, path_to }
    }

    fn under_tree(trees: &HashSet<String>, path: &str) -> bool {
        trees.iter().any(|tree| {
            path == tree
                || path
                    .strip_prefix(tree.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// Whether the walk enters the folder `dir`.
    fn enters(&self, dir: &str) -> bool {
        match self {
            Self::All => true,
            Self::Part { trees, path_to, .. } => path_to.contains(dir) || Self::under_tree(trees, dir),
        }
    }

    /// Whether the folder `dir` is new to the watches.
    fn is_new(&self, dir: &str) -> bool {
        match self {
            Self::All => true,
            Self::Part { trees, .. } => Self::under_tree(trees, dir),
        }
    }

    /// Whether the file `path` is looked at.
    fn covers(&self, path: &str) -> bool {
        match self {
            Self::All => true,
            Self::Part { dirs, trees, .. } => {
                let parent = path.rfind('/').map_or("", |slash| &path[..slash]);
                dirs.contains(parent) || Self::under_tree(trees, path)
            }
        }
    }
}

/// Every file and link in `scope` that `.gitignore` does not leave out,
/// with its `lstat`: never `.git/` (anywhere) or `root`'s own `.loom/`.
/// Each folder entered that `watch` does not know yet is watched before it
/// is read. The walk runs on two threads: stat-ing files is most of a
/// scan's cost.
fn walk(
    root: &Path,
    scope: &Arc<Scope>,
    mut watch: Option<Watch>,
) -> (Vec<(String, std::fs::Metadata)>, Option<Watch>) {
    if let (Some(watch), Scope::All) = (watch.as_mut(), scope.as_ref()) {
        watch.add(root, "");
    }
    let watch = Arc::new(Mutex::new(watch));
    let found = Mutex::new(Vec::new());
    let base: Arc<Path> = root.into();
    let relative = move |path: &Path| path.strip_prefix(&base).ok().and_then(Path::to_str).map(str::to_string);
    let (entered, watching, at) = (scope.clone(), watch.clone(), relative.clone());
    let owned_root: Arc<Path> = root.into();
    ignore::WalkBuilder::new(root)
        .hidden(false)
        .ignore(false)
        .parents(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .threads(2)
        .filter_entry(move |entry| {
            let (scope, watch, relative, root) = (&entered, &watching, &at, &owned_root);
            let name = entry.file_name();
            if name == ".git" || (name == ".loom" && entry.depth() == 1) {
                return false;
            }
            if !entry.file_type().is_some_and(|kind| kind.is_dir()) || entry.depth() == 0 {
                return true;
            }
            let Some(dir) = relative(entry.path()) else {
                return false;
            };
            if !scope.enters(&dir) {
                return false;
            }
            if scope.is_new(&dir) {
                let mut watch = watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if let Some(watch) = watch.as_mut() {
                    watch.add(root, &dir);
                }
            }
            true
        })
        .build_parallel()
        .run(|| {
            let found = &found;
            let relative = &relative;
            let scope = scope.as_ref();
            Box::new(move |item| {
                let Ok(item) = item else {
                    return ignore::WalkState::Continue;
                };
                if item.depth() == 0 || item.file_type().is_some_and(|kind| kind.is_dir()) {
                    return ignore::WalkState::Continue;
                }
                let Some(path) = relative(item.path()).filter(|path| scope.covers(path)) else {
                    return ignore::WalkState::Continue;
                };
                if let Ok(meta) = item.path().symlink_metadata() {
                    let mut found = found.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    found.push((path, meta));
                }
                ignore::WalkState::Continue
            })
        });
    let watch = watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    (
        found.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner()),
        watch,
    )
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

fn hex(bytes: &[u8]) -> String {
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
        assert_eq!(scanned.skipped, [("big.bin".to_string(), 100)]);
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
        let (entries, _) = walk(root, &Arc::new(scope), None);
        assert_eq!(entries.len(), 21, "the folder's files only");
    }
}
