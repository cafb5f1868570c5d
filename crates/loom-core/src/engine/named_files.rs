//! The files a task names, as they are in the workspace when its run
//! begins (the turn machine sends back an answer given without touching
//! them, docs/context.md "Answers that are not answers"). Which words name
//! files is the machine's rule; this is the IO. A name is *existing* when it
//! is a regular file beneath the workspace (a symlink leading out is not)
//! and not Loom's own state; *missing* when nothing is there, it looks like
//! a file one makes, and a tool may write there.

use std::path::{Path, PathBuf};

use crate::machine::{may_be_made, named_file_candidates, NamedFiles, MAX_NAMED_FILES};

/// The files `task` names, in the order it names them, as the workspace
/// has them (off the async threads: a few `stat`s).
pub(super) async fn find(workspace: &Path, protected: &[PathBuf], read_only: &[PathBuf], task: &str) -> NamedFiles {
    let candidates = named_file_candidates(task);
    if candidates.is_empty() {
        return NamedFiles::default();
    }
    let (workspace, protected, read_only) = (workspace.to_path_buf(), protected.to_vec(), read_only.to_vec());
    tokio::task::spawn_blocking(move || find_now(&workspace, &protected, &read_only, candidates))
        .await
        .unwrap_or_default()
}

fn find_now(workspace: &Path, protected: &[PathBuf], read_only: &[PathBuf], candidates: Vec<String>) -> NamedFiles {
    let mut named = NamedFiles::default();
    let Ok(root) = workspace.canonicalize() else {
        return named;
    };
    for name in candidates.into_iter().take(MAX_NAMED_FILES) {
        let path = root.join(&name);
        match path.canonicalize() {
            Ok(real) => {
                if real.is_file() && real.starts_with(&root) && !crate::tool::is_protected(protected, &real) {
                    named.existing.push(name);
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                // Nothing there, not even a dangling link (which a write
                // would follow out of the workspace), and where it would be
                // made — its nearest folder that exists, as the kernel finds
                // it — beneath the workspace and not Loom's: a name through
                // a link leading out says nothing of what is out there.
                let nothing = path.symlink_metadata().is_err();
                let place = real_place(&path);
                let writable = place.as_ref().is_some_and(|place| {
                    place.starts_with(&root)
                        && !crate::tool::is_protected(protected, place)
                        && !crate::tool::is_protected(read_only, place)
                });
                if nothing && writable && may_be_made(&name) {
                    named.missing.push(name);
                }
            }
            Err(_) => {}
        }
    }
    named
}

/// Where `path`, which does not exist, would be: its nearest existing
/// ancestor resolved, with the rest of the path after it.
fn real_place(path: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = at.canonicalize() {
            return Some(rest.iter().rev().fold(real, |place, part| place.join(part)));
        }
        rest.push(at.file_name()?);
        at = at.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn existing_regular_files_beneath_the_workspace_and_missing_ones_a_tool_may_write() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("settings.ini"), "[a]").unwrap();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(root.join("src/app.py"), "").unwrap();
        std::fs::create_dir(root.join("data.d")).unwrap();
        std::fs::write(root.join("loom.db"), "").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let protected = [root.canonicalize().unwrap().join("loom.db")];
        let read_only = [root.canonicalize().unwrap().join(".loom")];
        let task = "Make config.json from settings.ini and src/app.py; not data.d, link.txt, loom.db or example.com";
        let named = find(root, &protected, &read_only, task).await;
        assert_eq!(named.existing, ["settings.ini", "src/app.py"]);
        assert_eq!(named.missing, ["config.json"]);
        // Through a link leading out, or into a read-only place: neither.
        let task = "Not .loom/notes.md, out/new.md or out/secret.txt; new/deeper/file.md is fine";
        let named = find(root, &protected, &read_only, task).await;
        assert!(named.existing.is_empty(), "{named:?}");
        assert_eq!(named.missing, ["new/deeper/file.md"]);
    }
}
