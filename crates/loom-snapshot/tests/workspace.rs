//! Workspace snapshots through the public interface, as the engine and the
//! CLI use them (`Snapshots`, the engine's `WorkspaceSnapshots`): steps
//! recorded, restored in place and into a folder, judged from outside by
//! reading the files back — including a link swapped in before a restore, a
//! file changed outside Loom, a secret, and the names a snapshot never
//! holds (docs/rewind.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use loom_core::{SkipReason, SnapshotError, WorkspaceSnapshots};
use loom_snapshot::{Filter, Snapshots};

/// What a folder holds, read from outside: each path beneath it with its
/// content (or link target) and permission bits; links are not followed.
fn tree(root: &Path) -> BTreeMap<String, (String, u32)> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<String, (String, u32)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                into.insert(name, (format!("-> {}", target.display()), 0));
            } else if meta.is_dir() {
                into.insert(format!("{name}/"), (String::new(), meta.permissions().mode() & 0o777));
                walk(root, &path, into);
            } else {
                let content = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                into.insert(name, (content, meta.permissions().mode() & 0o777));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(root, root, &mut files);
    files
}

fn write(root: &Path, path: &str, content: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// A workspace `ws` and its snapshots kept in `snapshots.db` beside it
/// (outside the workspace, as Loom keeps them in its state directory).
fn workspace(dir: &Path) -> (Snapshots, PathBuf) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let snapshots = Snapshots::open(&ws, &dir.join("snapshots.db"), Filter::default()).unwrap();
    (snapshots, ws.canonicalize().unwrap())
}

#[tokio::test]
async fn a_step_restored_in_place_is_the_workspace_as_it_was_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshots, ws) = workspace(dir.path());
    write(&ws, "src/main.py", "print('one')\n");
    write(&ws, "src/util/helpers.py", "def helper():\n    return 1\n");
    write(&ws, "run.sh", "#!/bin/sh\necho hi\n");
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let first = snapshots.record("run", 0, None).await.unwrap();
    assert_eq!(first.changed.len(), 3, "{first:?}");
    let before = tree(&ws);

    // The run's step: one file changed, one removed, one made, a mode changed.
    write(&ws, "src/main.py", "print('two')\n");
    std::fs::remove_file(ws.join("src/util/helpers.py")).unwrap();
    write(&ws, "notes/new.md", "# new\n");
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let second = snapshots.record("run", 1, None).await.unwrap();
    let mut changed = second.changed.clone();
    changed.sort();
    assert_eq!(changed, ["notes/new.md", "run.sh", "src/main.py"]);
    assert_eq!(second.removed, ["src/util/helpers.py"]);
    assert_eq!(snapshots.steps("run").await.unwrap(), [0, 1]);
    assert_eq!(
        snapshots.file_at("run", 0, "src/main.py").await.unwrap().as_deref(),
        Some(&b"print('one')\n"[..])
    );
    assert_eq!(snapshots.file_at("run", 0, "notes/new.md").await.unwrap(), None);

    let plan = snapshots.plan("run", 0, None).await.unwrap();
    let mut written = plan.write.clone();
    written.sort();
    assert_eq!(written, ["run.sh", "src/main.py", "src/util/helpers.py"]);
    assert_eq!(plan.remove, ["notes/new.md"]);
    assert!(plan.changed_outside.is_empty(), "{plan:?}");

    snapshots.restore("run", 0, None, false).await.unwrap();
    let after = tree(&ws);
    // The folder the restore emptied stays (a restore removes files, not
    // the folders a person may have made); every file is as it was.
    let files = |t: &BTreeMap<String, (String, u32)>| {
        t.iter()
            .filter(|(path, _)| !path.ends_with('/'))
            .map(|(path, entry)| (path.clone(), entry.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(files(&after), files(&before));
    assert_eq!(after["run.sh"].1, 0o755, "the mode came back");

    // Restoring the later step again brings the run's work back.
    snapshots.restore("run", 1, None, false).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("src/main.py")).unwrap(),
        "print('two')\n"
    );
    assert!(!ws.join("src/util/helpers.py").exists());
}

#[tokio::test]
async fn a_fork_into_a_folder_leaves_the_workspace_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshots, ws) = workspace(dir.path());
    write(&ws, "a.txt", "first\n");
    write(&ws, "deep/b.txt", "b\n");
    snapshots.record("run", 0, None).await.unwrap();
    write(&ws, "a.txt", "second\n");
    snapshots.record("run", 1, None).await.unwrap();
    let workspace_before = tree(&ws);

    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    snapshots.restore("run", 0, Some(&copy), false).await.unwrap();
    assert_eq!(std::fs::read_to_string(copy.join("a.txt")).unwrap(), "first\n");
    assert_eq!(std::fs::read_to_string(copy.join("deep/b.txt")).unwrap(), "b\n");
    assert_eq!(tree(&ws), workspace_before, "the workspace was not touched");
}

#[tokio::test]
async fn a_link_swapped_in_before_a_restore_is_not_followed_out_of_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshots, ws) = workspace(dir.path());
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    write(&outside, "config.txt", "the user's own file\n");
    write(&outside, "keep.txt", "keep\n");
    let outside_before = tree(&outside);

    write(&ws, "sub/config.txt", "from the snapshot\n");
    snapshots.record("run", 0, None).await.unwrap();
    write(&ws, "sub/config.txt", "changed by the run\n");
    write(&ws, "sub/extra.txt", "made by the run\n");
    snapshots.record("run", 1, None).await.unwrap();

    // Something in the workspace swaps the folder for a link out of it.
    std::fs::remove_dir_all(ws.join("sub")).unwrap();
    symlink(&outside, ws.join("sub")).unwrap();

    // The link is no file of the snapshot: changed outside Loom, so the
    // restore is refused until forced; forced, the link itself is removed
    // and a folder made in its place. Neither writes through it.
    match snapshots.restore("run", 0, None, false).await {
        Err(SnapshotError::ChangedOutside { files }) => assert!(files.contains(&"sub".to_string()), "{files:?}"),
        other => panic!("expected ChangedOutside, got {other:?}"),
    }
    assert_eq!(tree(&outside), outside_before, "nothing outside was written or removed");
    let forced = snapshots.restore("run", 0, None, true).await.unwrap();
    assert!(forced.remove.contains(&"sub".to_string()), "{forced:?}");
    assert_eq!(tree(&outside), outside_before, "nothing outside was written or removed");
    assert!(
        std::fs::symlink_metadata(ws.join("sub")).unwrap().is_dir(),
        "the link was replaced, not followed"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("sub/config.txt")).unwrap(),
        "from the snapshot\n"
    );

    // A fork into a folder that is a link is refused the same way.
    let linked_copy = dir.path().join("linked-copy");
    symlink(&outside, &linked_copy).unwrap();
    let forked = snapshots.restore("run", 0, Some(&linked_copy), false).await;
    match forked {
        Err(SnapshotError::Failed(why)) => assert!(why.contains("symbolic link"), "{why}"),
        other => panic!("a fork does not write through a link: {other:?}"),
    }
    assert_eq!(tree(&outside), outside_before);
}

#[tokio::test]
async fn a_file_changed_outside_loom_is_not_written_over_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshots, ws) = workspace(dir.path());
    write(&ws, "a.txt", "1\n");
    snapshots.record("run", 0, None).await.unwrap();
    write(&ws, "a.txt", "2\n");
    snapshots.record("run", 1, None).await.unwrap();
    // A person edits the file after the run's last step.
    write(&ws, "a.txt", "the person's edit\n");

    let plan = snapshots.plan("run", 0, None).await.unwrap();
    assert_eq!(plan.changed_outside, ["a.txt"]);
    match snapshots.restore("run", 0, None, false).await {
        Err(SnapshotError::ChangedOutside { .. }) => {}
        other => panic!("expected ChangedOutside, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "the person's edit\n"
    );
    snapshots.restore("run", 0, None, true).await.unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "1\n");
}

#[tokio::test]
async fn secrets_and_loom_and_git_files_are_never_held_nor_written() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshots, ws) = workspace(dir.path());
    write(&ws, "app.py", "print(1)\n");
    write(&ws, "creds.env", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\n");
    write(&ws, ".git/config", "[core]\n");
    write(&ws, "loom.toml", "max_steps = 5\n");
    write(&ws, ".loom/agents/helper.md", "---\nname: helper\n---\n");
    let recorded = snapshots.record("run", 0, None).await.unwrap();
    assert_eq!(recorded.changed, ["app.py"], "{recorded:?}");
    assert_eq!(recorded.skipped.len(), 1, "{recorded:?}");
    assert_eq!(recorded.skipped[0].path, "creds.env");
    assert_eq!(recorded.skipped[0].reason, SkipReason::Secret);
    for path in ["creds.env", ".git/config", "loom.toml", ".loom/agents/helper.md"] {
        assert_eq!(snapshots.file_at("run", 0, path).await.unwrap(), None, "{path}");
    }

    // The run changes all of them; a restore brings back only what the
    // snapshot holds, and never removes what it does not.
    write(&ws, "app.py", "print(2)\n");
    write(&ws, "creds.env", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLF\n");
    write(&ws, ".git/config", "[core]\nbare = true\n");
    write(&ws, "loom.toml", "max_steps = 50\n");
    snapshots.record("run", 1, None).await.unwrap();
    snapshots.restore("run", 0, None, false).await.unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("app.py")).unwrap(), "print(1)\n");
    assert_eq!(
        std::fs::read_to_string(ws.join("creds.env")).unwrap(),
        "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLF\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).unwrap(),
        "[core]\nbare = true\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("loom.toml")).unwrap(),
        "max_steps = 50\n"
    );
    assert!(ws.join(".loom/agents/helper.md").exists());

    // The database (and its write-ahead log) keeps no copy of the secret.
    let needle = b"AKIAIOSFODNN7EXAMPL";
    for file in snapshots.files() {
        let Ok(bytes) = std::fs::read(&file) else { continue };
        assert!(
            !bytes.windows(needle.len()).any(|window| window == needle),
            "{} holds the secret",
            file.display()
        );
    }
}
