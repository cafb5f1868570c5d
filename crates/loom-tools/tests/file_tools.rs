//! The file tools through their public `Tool` interface, on real files.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use loom_core::{CancellationToken, Tool, ToolContext, ToolError};
use loom_tools::{EditFile, Glob, Grep, ListDir, ReadFile, WriteFile};
use serde_json::json;

fn ctx(root: &Path) -> ToolContext {
    ToolContext::new("c1", "r1".into(), Arc::from(root), CancellationToken::new())
}

fn args<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn read_file_pages_through_large_files() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (1..=50).map(|n| format!("line {n}\n")).collect();
    std::fs::write(dir.path().join("big.txt"), text).unwrap();

    let all = ReadFile
        .call(args(json!({"path": "big.txt"})), ctx(dir.path()))
        .await
        .unwrap();
    assert!(all.content.contains("     1\tline 1\n"));
    assert!(all.content.contains("    50\tline 50\n"));
    assert!(!all.content.contains("offset="));

    let part = ReadFile
        .call(
            args(json!({"path": "big.txt", "offset": 10, "limit": 5})),
            ctx(dir.path()),
        )
        .await
        .unwrap();
    assert!(part.content.starts_with("    10\tline 10\n"));
    assert!(part.content.contains("    14\tline 14\n"));
    assert!(!part.content.contains("line 15\n"));
    assert!(part
        .content
        .contains("[lines 10-14 of 50 in 'big.txt'; call read_file with offset=15 to read more]"));

    let past = ReadFile
        .call(args(json!({"path": "big.txt", "offset": 99})), ctx(dir.path()))
        .await
        .unwrap_err();
    assert!(past.to_string().contains("past the end"));

    let missing = ReadFile
        .call(args(json!({"path": "nope.txt"})), ctx(dir.path()))
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("does not exist"), "{missing}");
}

#[tokio::test]
async fn write_then_edit_with_unique_match() {
    let dir = tempfile::tempdir().unwrap();
    let out = WriteFile
        .call(
            args(json!({"path": "notes/a.txt", "content": "alpha\nbeta\nalpha\n"})),
            ctx(dir.path()),
        )
        .await
        .unwrap();
    assert!(out.content.starts_with("Created 'notes/a.txt'"), "{}", out.content);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/a.txt")).unwrap(),
        "alpha\nbeta\nalpha\n"
    );

    let ambiguous = EditFile
        .call(
            args(json!({"path": "notes/a.txt", "old_string": "alpha", "new_string": "gamma"})),
            ctx(dir.path()),
        )
        .await
        .unwrap_err();
    assert!(ambiguous.to_string().contains("occurs 2 times"), "{ambiguous}");

    let missing = EditFile
        .call(
            args(json!({"path": "notes/a.txt", "old_string": "delta", "new_string": "x"})),
            ctx(dir.path()),
        )
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("not found"));

    let edited = EditFile
        .call(
            args(json!({"path": "notes/a.txt", "old_string": "beta\n", "new_string": "BETA\n"})),
            ctx(dir.path()),
        )
        .await
        .unwrap();
    assert!(edited.content.contains("lines 2-3"), "{}", edited.content);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/a.txt")).unwrap(),
        "alpha\nBETA\nalpha\n"
    );
}

#[tokio::test]
async fn write_file_appends_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    for (line, expected) in [("one\n", "Created"), ("two\n", "Appended to")] {
        let out = WriteFile
            .call(
                args(json!({"path": "log/steps.txt", "content": line, "append": true})),
                ctx(dir.path()),
            )
            .await
            .unwrap();
        assert!(out.content.starts_with(expected), "{}", out.content);
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("log/steps.txt")).unwrap(),
        "one\ntwo\n"
    );
    WriteFile
        .call(
            args(json!({"path": "log/steps.txt", "content": "new\n"})),
            ctx(dir.path()),
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("log/steps.txt")).unwrap(),
        "new\n"
    );
}

#[tokio::test]
async fn list_glob_and_grep_honour_gitignore() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n*.log\n").unwrap();
    std::fs::write(root.join("src/main.rs"), "fn main() {\n    println!(\"needle\");\n}\n").unwrap();
    std::fs::write(root.join("src/deep/lib.rs"), "// NEEDLE here\n").unwrap();
    std::fs::write(root.join("target/out.rs"), "needle in build output\n").unwrap();
    std::fs::write(root.join("debug.log"), "needle in a log\n").unwrap();

    let listing = ListDir.call(args(json!({})), ctx(root)).await.unwrap().content;
    assert!(listing.contains("src/\n"), "{listing}");
    assert!(listing.contains("debug.log ("), "{listing}");

    let globbed = Glob
        .call(args(json!({"pattern": "**/*.rs"})), ctx(root))
        .await
        .unwrap()
        .content;
    assert_eq!(globbed, "src/deep/lib.rs\nsrc/main.rs\n");
    let shallow = Glob
        .call(args(json!({"pattern": "*.rs", "path": "src"})), ctx(root))
        .await
        .unwrap()
        .content;
    assert_eq!(shallow, "src/main.rs\n");

    let found = Grep
        .call(args(json!({"pattern": "needle", "case_insensitive": true})), ctx(root))
        .await
        .unwrap()
        .content;
    assert!(found.contains("src/main.rs:2:     println!(\"needle\");"), "{found}");
    assert!(found.contains("src/deep/lib.rs:1: // NEEDLE here"), "{found}");
    assert!(!found.contains("target/"), "ignored dir searched: {found}");
    assert!(!found.contains("debug.log"), "ignored file searched: {found}");
    assert!(found.contains("[2 matching lines in 2 files]"), "{found}");

    let filtered = Grep
        .call(args(json!({"pattern": "needle", "glob": "main.rs"})), ctx(root))
        .await
        .unwrap()
        .content;
    assert!(filtered.starts_with("src/main.rs:2:"), "{filtered}");

    let bad = Grep
        .call(args(json!({"pattern": "(unclosed"})), ctx(root))
        .await
        .unwrap_err();
    assert!(matches!(bad, ToolError::InvalidArguments(_)));
}

#[tokio::test]
async fn every_tool_refuses_paths_outside_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    let secret = outside.path().join("secret.txt");
    let secret = secret.to_str().unwrap();

    let refused = |err: ToolError| {
        let text = err.to_string();
        assert!(text.contains("is refused"), "{text}");
    };
    refused(
        ReadFile
            .call(args(json!({"path": secret})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );
    refused(
        ReadFile
            .call(args(json!({"path": "../x"})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );
    refused(
        WriteFile
            .call(args(json!({"path": "../escaped.txt", "content": "x"})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );
    assert!(!dir.path().parent().unwrap().join("escaped.txt").exists());
    refused(
        ListDir
            .call(args(json!({"path": "/"})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );
    refused(
        Glob.call(args(json!({"pattern": "*", "path": ".."})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );
    refused(
        Grep.call(args(json!({"pattern": "s", "path": "/etc"})), ctx(dir.path()))
            .await
            .unwrap_err(),
    );

    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        refused(
            ReadFile
                .call(args(json!({"path": "out/secret.txt"})), ctx(dir.path()))
                .await
                .unwrap_err(),
        );
        refused(
            WriteFile
                .call(
                    args(json!({"path": "out/planted.txt", "content": "x"})),
                    ctx(dir.path()),
                )
                .await
                .unwrap_err(),
        );
        refused(
            EditFile
                .call(
                    args(json!({"path": "out/secret.txt", "old_string": "secret", "new_string": "owned"})),
                    ctx(dir.path()),
                )
                .await
                .unwrap_err(),
        );
        assert!(!outside.path().join("planted.txt").exists());
        // Listed by its own name, never looked through.
        let listing = ListDir.call(args(json!({})), ctx(dir.path())).await.unwrap().content;
        assert!(listing.contains("out (link outside the workspace)"), "{listing}");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
            "secret"
        );
    }
}

/// Makes `levels` directories `d/d/d/…` under `root` through directory
/// descriptors (their path is far longer than `PATH_MAX`), with a file
/// `f.txt` holding "needle" in each of the first `with_files` levels.
fn nest(root: &Path, levels: usize, with_files: usize) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut current = OwnedFd::from(std::fs::File::open(root).unwrap());
    for level in 0..levels {
        if level < with_files {
            let dir = format!("/proc/self/fd/{}/f.txt", current.as_raw_fd());
            std::fs::write(dir, "needle\n").unwrap();
        }
        let name = c"d";
        assert_eq!(unsafe { libc::mkdirat(current.as_raw_fd(), name.as_ptr(), 0o755) }, 0);
        let fd = unsafe { libc::openat(current.as_raw_fd(), name.as_ptr(), libc::O_DIRECTORY | libc::O_CLOEXEC) };
        assert!(fd >= 0);
        current = unsafe { OwnedFd::from_raw_fd(fd) };
    }
}

/// Removes what [`nest`] made one level at a time: the second level is
/// moved up in place of the first, so no path ever gets long (a recursive
/// removal would hold a descriptor per level).
fn unnest(root: &Path) {
    let top = root.join("d");
    let spare = root.join("d-next");
    while top.exists() {
        let _ = std::fs::remove_file(top.join("f.txt"));
        if top.join("d").exists() {
            std::fs::rename(top.join("d"), &spare).unwrap();
        }
        std::fs::remove_dir(&top).unwrap();
        if spare.exists() {
            std::fs::rename(&spare, &top).unwrap();
        }
    }
}

#[tokio::test]
async fn glob_and_grep_survive_thousands_of_nested_directories() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    nest(root, 3000, 200);
    let started = std::time::Instant::now();

    let found = Grep
        .call(args(json!({"pattern": "needle"})), ctx(root))
        .await
        .unwrap()
        .content;
    assert!(found.contains("\nf.txt:1: needle\n"), "{found}");
    assert!(found.contains("[129 matching lines in 129 files"), "{found}");
    assert!(found.contains("deeper than 128 levels"), "{found}");

    let globbed = Glob
        .call(args(json!({"pattern": "**/f.txt"})), ctx(root))
        .await
        .unwrap()
        .content;
    let files = globbed.lines().filter(|line| line.ends_with("f.txt")).count();
    assert_eq!(files, 129, "{globbed}");
    assert!(globbed.contains("deeper than 128 levels"), "{globbed}");

    let none = Glob
        .call(args(json!({"pattern": "**/*.rs"})), ctx(root))
        .await
        .unwrap()
        .content;
    assert!(
        none.contains("No files match") && none.contains("deeper than 128 levels"),
        "{none}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    unnest(root);
}

#[tokio::test]
async fn list_dir_reveals_nothing_of_a_protected_link_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join(".loom")).unwrap();
    std::fs::write(root.join(".loom/loom.db"), "x".repeat(12345)).unwrap();
    std::os::unix::fs::symlink(".loom/loom.db", root.join("peek")).unwrap();
    std::os::unix::fs::symlink(".loom", root.join("peek_dir")).unwrap();
    std::fs::write(root.join("plain.txt"), "abc").unwrap();
    let mut ctx = ctx(root);
    ctx.protected = vec![root.canonicalize().unwrap().join(".loom")].into();

    let listing = ListDir.call(args(json!({})), ctx).await.unwrap().content;
    assert!(!listing.contains("12345"), "{listing}");
    assert!(!listing.contains("peek_dir/"), "{listing}");
    assert!(listing.contains("peek (link"), "{listing}");
    assert!(listing.contains("plain.txt (3 bytes)"), "{listing}");
}

/// The right tool on the wrong kind of path is answered with what the model
/// needs to go on (docs/tools.md, "Near misses") — and a file's content
/// only ever by read_file, so read_file's permission rules still decide it.
#[tokio::test]
async fn near_misses_answer_with_what_is_there_and_list_dir_never_reads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/calc.py"), "SECRET = 'hunter2'\n").unwrap();

    let read_dir = ReadFile
        .call(args(json!({"path": "src"})), ctx(dir.path()))
        .await
        .unwrap();
    assert!(read_dir.content.contains("is a directory"), "{}", read_dir.content);
    assert!(read_dir.content.contains("calc.py (19 bytes)"), "{}", read_dir.content);
    assert!(!read_dir.content.contains("hunter2"));

    let list_file = ListDir
        .call(args(json!({"path": "src/calc.py"})), ctx(dir.path()))
        .await
        .unwrap();
    assert!(
        list_file.content.starts_with("src/calc.py (19 bytes)\n"),
        "{}",
        list_file.content
    );
    assert!(list_file.content.contains("read_file shows what it holds"));
    assert!(!list_file.content.contains("hunter2"), "list_dir never shows content");

    let missing = ReadFile
        .call(args(json!({"path": "src/lib/calc.rs"})), ctx(dir.path()))
        .await
        .unwrap_err()
        .to_string();
    assert!(missing.contains("does not exist. What 'src' holds:"), "{missing}");
    assert!(missing.contains("calc.py"), "{missing}");
    assert!(!missing.contains("hunter2"));
}
