//! The walk of a scan: every file and link in its scope that `.gitignore`
//! leaves in, with its `lstat`; the folders the kernel's watches do not
//! know yet are watched before they are read. The names come from a walk
//! by path, which a folder swapped for a link while it runs could lead
//! outside; each name's `lstat` is taken beneath a handle of the workspace
//! (`cap-std`), so a name that leads outside is dropped, never followed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cap_std::fs::{Dir, Metadata};

use crate::reserved::reserved_name;
use crate::watch::Watch;

/// What a scan looks at.
#[derive(Debug)]
pub(crate) enum Scope {
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
    pub(crate) fn part(dirs: HashSet<String>, trees: HashSet<String>) -> Self {
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

    /// Whether nothing is looked at.
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Self::Part { dirs, trees, .. } if dirs.is_empty() && trees.is_empty())
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
    pub(crate) fn covers(&self, path: &str) -> bool {
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
/// with its `lstat`: never `.git/` (anywhere), `root`'s own `.loom/` and
/// `loom.toml` ([`reserved_name`]), nor a name that is not UTF-8 (no path
/// of a snapshot could name it).
/// Each folder entered that `watch` does not know yet is watched before it
/// is read. The walk runs on two threads: stat-ing files is most of a
/// scan's cost.
pub(crate) fn walk(
    root: &Path,
    beneath: &Arc<Dir>,
    scope: &Arc<Scope>,
    mut watch: Option<Watch>,
) -> (Vec<(String, Metadata)>, Option<Watch>) {
    if let (Some(watch), Scope::All) = (watch.as_mut(), scope.as_ref()) {
        watch.add(root, "");
    }
    let watch = Arc::new(Mutex::new(watch));
    let found = Mutex::new(Vec::new());
    let folders = Folders::new(beneath.clone());
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
            if entry.depth() > 0 && name.to_str().is_none_or(|name| reserved_name(name, entry.depth())) {
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
            let folders = &folders;
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
                if let Ok(meta) = folders.lstat(&path) {
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

/// The folders of one walk, each opened once beneath the workspace's
/// handle: a file's `lstat` is then one call on its folder's handle.
struct Folders {
    beneath: Arc<Dir>,
    /// By path; `None`: it could not be opened beneath the workspace (it
    /// went, or now leads outside).
    opened: Mutex<HashMap<String, Option<Arc<Dir>>>>,
}

impl Folders {
    fn new(beneath: Arc<Dir>) -> Self {
        Self {
            beneath,
            opened: Mutex::new(HashMap::new()),
        }
    }

    /// The `lstat` of `path`, through its folder's handle.
    fn lstat(&self, path: &str) -> std::io::Result<Metadata> {
        let (folder, name) = path.rsplit_once('/').unwrap_or(("", path));
        if folder.is_empty() {
            return self.beneath.symlink_metadata(name);
        }
        let handle = {
            let mut opened = self.opened.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            opened
                .entry(folder.to_string())
                .or_insert_with(|| self.beneath.open_dir(folder).ok().map(Arc::new))
                .clone()
        };
        match handle {
            Some(handle) => handle.symlink_metadata(name),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }
}
