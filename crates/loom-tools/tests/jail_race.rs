//! The file tools against a directory swapped, in a tight loop, with a
//! symbolic link to the outside (`renameat2(RENAME_EXCHANGE)`), as a process
//! left behind by a sandboxed shell can do: no call may ever read, list,
//! create or change anything outside the workspace. Also: files with more
//! than one hard link and read-only paths are never changed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{CancellationToken, Tool, ToolContext};
use loom_testkit::symlink_race::{changes, snapshot, Swapper};
use loom_tools::{EditFile, Glob, Grep, ListDir, ReadFile, WriteFile};
use serde_json::json;

const SECRET: &str = "OUTSIDE-SECRET-7f3a";
const OUTSIDE_NAME: &str = "outside-only-name.txt";

fn ctx(root: &Path) -> ToolContext {
    ToolContext::new("c1", "r1".into(), Arc::from(root), CancellationToken::new())
}

fn args<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// An outside directory holding a secret, names of its own and files with
/// the names the tools use, so that any escape shows.
fn outside_dir() -> tempfile::TempDir {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::write(outside.path().join("edit.txt"), "alpha\nALPHA\n").unwrap();
    std::fs::write(outside.path().join(OUTSIDE_NAME), format!("{SECRET} too\n")).unwrap();
    std::fs::create_dir(outside.path().join("nested")).unwrap();
    std::fs::write(outside.path().join("nested/secret.txt"), format!("{SECRET}\n")).unwrap();
    outside
}

/// Whether a tool's answer (success or error) shows anything of the outside.
fn leaks(text: &str) -> bool {
    text.contains(SECRET) || text.contains(OUTSIDE_NAME)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_tool_escapes_through_a_swapped_symlink() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    let outside = outside_dir();
    std::fs::create_dir_all(root.join("swap/nested")).unwrap();
    std::fs::write(root.join("swap/secret.txt"), "inside text\n").unwrap();
    std::fs::write(root.join("swap/edit.txt"), "alpha\n").unwrap();
    std::fs::write(root.join("swap/nested/secret.txt"), "inside text\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
    let before = snapshot(outside.path());

    let swapper = Swapper::start(&root.join("swap"), &root.join("link"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut escapes = Vec::new();
    let mut escapes_by_tool = BTreeMap::new();
    let mut inside_reads = 0usize;
    let mut attempts = 0usize;
    for round in 0..2500 {
        if Instant::now() > deadline {
            break;
        }
        let ctx = ctx(root);
        let calls = [
            (
                "read_file",
                ReadFile
                    .call(args(json!({"path": "swap/secret.txt"})), ctx.clone())
                    .await,
            ),
            (
                "read_file",
                ReadFile
                    .call(args(json!({"path": "link/nested/secret.txt"})), ctx.clone())
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": format!("swap/new-{}.txt", round % 20), "content": "x"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": "swap/nested/deeper/new.txt", "content": "x"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": "link/edit.txt", "content": "alpha\n"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": "swap/secret.txt", "content": "inside text\n", "append": round % 2 == 0})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "edit_file",
                EditFile
                    .call(
                        args(json!({"path": "swap/edit.txt", "old_string": "alpha\n", "new_string": "beta\n"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "edit_file",
                EditFile
                    .call(
                        args(json!({"path": "swap/edit.txt", "old_string": "beta\n", "new_string": "alpha\n"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "list_dir",
                ListDir.call(args(json!({"path": "swap"})), ctx.clone()).await,
            ),
            (
                "list_dir",
                ListDir.call(args(json!({"path": "link/nested"})), ctx.clone()).await,
            ),
            ("glob", Glob.call(args(json!({"pattern": "**/*"})), ctx.clone()).await),
            (
                "glob",
                Glob.call(args(json!({"pattern": "**", "path": "swap"})), ctx.clone())
                    .await,
            ),
            (
                "grep",
                Grep.call(args(json!({"pattern": "SECRET|text"})), ctx.clone()).await,
            ),
            (
                "grep",
                Grep.call(args(json!({"pattern": "SECRET|text", "path": "link"})), ctx.clone())
                    .await,
            ),
        ];
        for (tool, result) in calls {
            attempts += 1;
            let text = match result {
                Ok(output) => {
                    if tool == "read_file" && output.content.contains("inside text") {
                        inside_reads += 1;
                    }
                    output.content
                }
                Err(err) => err.to_string(),
            };
            if leaks(&text) {
                *escapes_by_tool.entry(tool).or_insert(0usize) += 1;
                if escapes.len() < 10 {
                    escapes.push(format!("round {round}, {tool}: {text}"));
                }
            }
        }
    }
    let swaps = swapper.swaps();
    drop(swapper);

    let after = snapshot(outside.path());
    let changed = changes(&before, &after);
    assert!(
        escapes_by_tool.is_empty() && changed.is_empty(),
        "calls that showed the outside, by tool: {escapes_by_tool:?}\n\
         created or changed outside ({}): {:?}\nfirst escapes:\n{}",
        changed.len(),
        &changed[..changed.len().min(10)],
        escapes.join("\n")
    );
    assert!(swaps > 1000, "the swapper hardly ran ({swaps} swaps)");
    assert!(
        inside_reads > 0,
        "read_file never read the inside file in {attempts} calls"
    );
    eprintln!("{attempts} calls, {swaps} swaps, {inside_reads} inside reads, no escape");
}

/// The same race with a link to Loom's own state inside the workspace: the
/// state is judged on what was opened, so it is never read, listed or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_tool_reaches_loom_state_through_a_swapped_symlink() {
    const STATE: &str = "LOOM-STATE-9b2e";
    const STATE_NAME: &str = "state-only-name.db";
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join(".loom/nested")).unwrap();
    std::fs::write(root.join(".loom/secret.txt"), format!("{STATE}\n")).unwrap();
    std::fs::write(root.join(".loom/edit.txt"), "alpha\nALPHA\n").unwrap();
    std::fs::write(root.join(".loom").join(STATE_NAME), format!("{STATE}\n")).unwrap();
    std::fs::write(root.join(".loom/nested/secret.txt"), format!("{STATE}\n")).unwrap();
    std::fs::create_dir_all(root.join("swap/nested")).unwrap();
    std::fs::write(root.join("swap/secret.txt"), "inside text\n").unwrap();
    std::fs::write(root.join("swap/edit.txt"), "alpha\n").unwrap();
    std::fs::write(root.join("swap/nested/secret.txt"), "inside text\n").unwrap();
    std::os::unix::fs::symlink(".loom", root.join("state")).unwrap();
    let mut ctx = ctx(&root);
    ctx.protected = vec![root.join(".loom")].into();
    let before = snapshot(&root.join(".loom"));

    let swapper = Swapper::start(&root.join("swap"), &root.join("state"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut escapes = Vec::new();
    let mut attempts = 0usize;
    for round in 0..800 {
        if Instant::now() > deadline {
            break;
        }
        let calls = [
            (
                "read_file",
                ReadFile
                    .call(args(json!({"path": "swap/secret.txt"})), ctx.clone())
                    .await,
            ),
            (
                "read_file",
                ReadFile
                    .call(args(json!({"path": "state/nested/secret.txt"})), ctx.clone())
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": format!("swap/new-{}.txt", round % 10), "content": "x"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "write_file",
                WriteFile
                    .call(
                        args(json!({"path": "state/nested/deeper/new.txt", "content": "x"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "edit_file",
                EditFile
                    .call(
                        args(json!({"path": "swap/edit.txt", "old_string": "alpha\n", "new_string": "beta\n"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "edit_file",
                EditFile
                    .call(
                        args(json!({"path": "swap/edit.txt", "old_string": "beta\n", "new_string": "alpha\n"})),
                        ctx.clone(),
                    )
                    .await,
            ),
            (
                "list_dir",
                ListDir.call(args(json!({"path": "swap"})), ctx.clone()).await,
            ),
            ("glob", Glob.call(args(json!({"pattern": "**/*"})), ctx.clone()).await),
            (
                "grep",
                Grep.call(args(json!({"pattern": "STATE|text", "path": "state"})), ctx.clone())
                    .await,
            ),
        ];
        for (tool, result) in calls {
            attempts += 1;
            let text = match result {
                Ok(output) => output.content,
                Err(err) => err.to_string(),
            };
            if text.contains(STATE) || text.contains(STATE_NAME) {
                escapes.push(format!("round {round}, {tool}: {text}"));
            }
        }
    }
    let swaps = swapper.swaps();
    drop(swapper);
    let changed = changes(&before, &snapshot(&root.join(".loom")));
    assert!(
        escapes.is_empty() && changed.is_empty(),
        "{} calls showed Loom's state: {:?}\nchanged in it ({}): {:?}",
        escapes.len(),
        &escapes[..escapes.len().min(5)],
        changed.len(),
        &changed[..changed.len().min(10)]
    );
    assert!(swaps > 1000, "the swapper hardly ran ({swaps} swaps)");
    eprintln!("{attempts} calls, {swaps} swaps, Loom's state untouched");
}

#[tokio::test]
async fn files_with_more_than_one_hard_link_are_never_changed() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    // The outside file must be on the same file system for a hard link.
    let outside = tempfile::tempdir_in(root.parent().unwrap()).unwrap();
    let target = outside.path().join("victim.txt");
    std::fs::write(&target, "alpha\n").unwrap();
    std::fs::hard_link(&target, root.join("linked.txt")).unwrap();
    let before = snapshot(outside.path());

    for call in [
        WriteFile
            .call(args(json!({"path": "linked.txt", "content": "owned\n"})), ctx(root))
            .await,
        WriteFile
            .call(
                args(json!({"path": "linked.txt", "content": "owned\n", "append": true})),
                ctx(root),
            )
            .await,
        EditFile
            .call(
                args(json!({"path": "linked.txt", "old_string": "alpha", "new_string": "owned"})),
                ctx(root),
            )
            .await,
    ] {
        let err = call.unwrap_err().to_string();
        assert!(err.contains("is refused") && err.contains("hard links"), "{err}");
    }
    assert_eq!(snapshot(outside.path()), before, "the outside file was changed");

    // Reading is allowed: the content is already in the workspace, for the
    // shell too; it is changing it that would reach outside.
    let read = ReadFile
        .call(args(json!({"path": "linked.txt"})), ctx(root))
        .await
        .unwrap();
    assert!(read.content.contains("alpha"), "{}", read.content);

    // Once the link is the file's only name, it is an ordinary file again.
    std::fs::remove_file(&target).unwrap();
    WriteFile
        .call(args(json!({"path": "linked.txt", "content": "mine\n"})), ctx(root))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(root.join("linked.txt")).unwrap(), "mine\n");
}

#[tokio::test]
async fn read_only_paths_can_be_read_but_not_changed() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path().canonicalize().unwrap();
    std::fs::write(root.join("loom.toml"), "[tools.bash]\nenabled = true\n").unwrap();
    std::fs::create_dir(root.join("conf")).unwrap();
    std::fs::write(root.join("conf/settings.toml"), "enabled = true\n").unwrap();
    std::os::unix::fs::symlink("loom.toml", root.join("alias.toml")).unwrap();
    std::os::unix::fs::symlink("conf", root.join("conf_alias")).unwrap();
    let mut ctx = ctx(&root);
    ctx.read_only = vec![root.join("loom.toml"), root.join("conf")].into();

    for (path, tool) in [
        ("loom.toml", "write"),
        ("loom.toml", "append"),
        ("loom.toml", "edit"),
        ("alias.toml", "write"),
        ("alias.toml", "edit"),
        ("conf/settings.toml", "write"),
        ("conf/new.toml", "write"),
        ("conf_alias/settings.toml", "edit"),
        ("conf_alias/new.toml", "write"),
        ("conf_alias/deeper/new.toml", "write"),
    ] {
        let result = match tool {
            "edit" => {
                EditFile
                    .call(
                        args(json!({"path": path, "old_string": "enabled = true", "new_string": "enabled = false"})),
                        ctx.clone(),
                    )
                    .await
            }
            _ => {
                WriteFile
                    .call(
                        args(json!({"path": path, "content": "enabled = false\n", "append": tool == "append"})),
                        ctx.clone(),
                    )
                    .await
            }
        };
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("is refused") && err.contains("may read but not change"),
            "{tool} {path}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(root.join("loom.toml")).unwrap(),
        "[tools.bash]\nenabled = true\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("conf/settings.toml")).unwrap(),
        "enabled = true\n"
    );
    assert!(!root.join("conf/new.toml").exists());
    assert!(!root.join("conf/deeper").exists());

    for path in ["loom.toml", "alias.toml", "conf_alias/settings.toml"] {
        let read = ReadFile.call(args(json!({"path": path})), ctx.clone()).await.unwrap();
        assert!(read.content.contains("enabled = true"), "{path}: {}", read.content);
    }
    // What is beside them stays writable.
    WriteFile
        .call(args(json!({"path": "notes.toml", "content": "x\n"})), ctx.clone())
        .await
        .unwrap();
}
