//! What a snapshot may hold, and what a record read back from a store may
//! say before a restore writes anything (docs/rewind.md, "Safety"). A
//! store is not trusted to hold only what this workspace's scans wrote: a
//! cluster's Redis is shared, and whoever reaches it can write records. So
//! every record a restore would act on is judged here first — its path,
//! its kind and mode, and its content against the size and SHA-256 it
//! claims — and one that fails refuses the whole restore, naming it.
//!
//! The same rule decides which paths a scan takes in ([`crate::reserved`]),
//! so a snapshot this workspace recorded never names a path a restore
//! would refuse. A scan does hold a link that leads out of the workspace
//! (a rewind then removes one a step made), but a restore never makes
//! one: going back to a step that held one is refused, naming it.

use sha2::{Digest, Sha256};

use crate::filter::Filter;
use crate::manifest::{Entry, Manifest};
use crate::reserved::{is_reserved, reserved_name};

pub use crate::manifest::PERMISSION_BITS;

/// A record a restore refuses, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot record {path:?} refused: {why} (nothing was restored)")]
pub struct Refused {
    /// The path the record names.
    pub path: String,
    /// What is wrong with it.
    pub why: Why,
}

/// What is wrong with a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    /// Not a relative path of plain names (empty, absolute, `.` or `..`,
    /// an empty name, a NUL).
    #[error("not a plain relative path in the workspace")]
    NotPlain,
    /// A path no snapshot holds: `.git/` at any depth, the workspace's own
    /// `.loom/` and `loom.toml`, or one of Loom's files kept in it.
    #[error("a path no snapshot holds (.git/, .loom/, loom.toml or Loom's own files)")]
    Reserved,
    /// Bits beyond the permission bits.
    #[error("mode {0:#o} is more than read, write and execute (setuid, setgid, sticky or a file type)")]
    Mode(u32),
    /// Not a SHA-256 in lowercase hex.
    #[error("its hash is not a SHA-256 in hex")]
    Hash,
    /// The store has no content of its hash.
    #[error("its content is not in the snapshot store")]
    Missing,
    /// The content is not as long as the record says.
    #[error("its content is {actual} bytes, the record says {recorded}")]
    Size {
        /// The record's size.
        recorded: u64,
        /// The content's.
        actual: u64,
    },
    /// The content does not hash to what the record says.
    #[error("its content does not hash to the record's SHA-256")]
    Content,
    /// A link whose target is absolute, climbs out of the workspace, or
    /// leads into a path no snapshot holds.
    #[error("a link to {0:?}, which leads out of the workspace or into .git/, .loom/ or loom.toml")]
    LinkOut(String),
}

impl Refused {
    fn new(path: &str, why: Why) -> Self {
        Self {
            path: path.to_string(),
            why,
        }
    }
}

/// Whether `path` is a relative path of plain names.
fn is_plain(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\0')
        && path
            .split('/')
            .all(|name| !name.is_empty() && name != "." && name != "..")
}

/// Whether a link at `path` whose target is `target` (as the link holds
/// it) resolves inside the workspace, whatever the other links in it are:
/// a relative target of `..` names first — no more than the folders above
/// the link — then plain names, never into a reserved path. A `..` after a
/// plain name is refused, since that name may itself be a link (the kernel
/// would climb from where that link leads, not from where it is).
pub(crate) fn link_stays_inside(path: &str, target: &[u8]) -> bool {
    if target.is_empty() || target.contains(&0) || target.starts_with(b"/") {
        return false;
    }
    let mut resolved: Vec<&[u8]> = path.split('/').map(str::as_bytes).collect();
    resolved.pop();
    let mut named = false;
    for part in target.split(|byte| *byte == b'/') {
        match part {
            b"" | b"." => {}
            b".." if named => return false,
            b".." => {
                if resolved.pop().is_none() {
                    return false;
                }
            }
            name => {
                named = true;
                resolved.push(name);
            }
        }
    }
    !resolved
        .iter()
        .enumerate()
        .any(|(at, name)| std::str::from_utf8(name).is_ok_and(|name| reserved_name(name, at + 1)))
}

/// Judges one record by what it says: its path, hash and mode.
pub fn record(path: &str, entry: &Entry) -> Result<(), Refused> {
    if !is_plain(path) {
        return Err(Refused::new(path, Why::NotPlain));
    }
    if is_reserved(path) {
        return Err(Refused::new(path, Why::Reserved));
    }
    let hex = |byte: u8| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte);
    if entry.hash.len() != 64 || !entry.hash.bytes().all(hex) {
        return Err(Refused::new(path, Why::Hash));
    }
    if entry.mode & !PERMISSION_BITS != 0 {
        return Err(Refused::new(path, Why::Mode(entry.mode)));
    }
    Ok(())
}

/// Judges a record's content: as long as the record says, hashing to its
/// SHA-256, and — for a link — a target that stays inside.
pub fn content(path: &str, entry: &Entry, content: &[u8]) -> Result<(), Refused> {
    let actual = content.len() as u64;
    if actual != entry.size {
        return Err(Refused::new(
            path,
            Why::Size {
                recorded: entry.size,
                actual,
            },
        ));
    }
    if crate::scan::hex(&Sha256::digest(content)) != entry.hash {
        return Err(Refused::new(path, Why::Content));
    }
    if entry.link && !link_stays_inside(path, content) {
        return Err(Refused::new(
            path,
            Why::LinkOut(String::from_utf8_lossy(content).into_owned()),
        ));
    }
    Ok(())
}

/// Judges every record of a snapshot by what it says ([`record`]), and
/// refuses those naming a path `filter` never holds (a run database kept
/// in the workspace).
pub fn manifest(target: &Manifest, filter: &Filter) -> Result<(), Refused> {
    for (path, entry) in &target.0 {
        record(path, entry)?;
        if filter.never_holds(path) {
            return Err(Refused::new(path, Why::Reserved));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_of(content: &[u8], mode: u32, link: bool) -> Entry {
        Entry {
            hash: crate::scan::hex(&Sha256::digest(content)),
            size: content.len() as u64,
            mode,
            link,
        }
    }

    fn why(path: &str, entry: &Entry) -> Option<Why> {
        record(path, entry).err().map(|refused| refused.why)
    }

    #[test]
    fn paths_of_git_loom_and_other_than_plain_names_are_refused() {
        let entry = entry_of(b"#!/bin/sh\n", 0o755, false);
        for path in [
            ".git/hooks/pre-commit",
            ".git",
            "vendor/lib/.git/hooks/post-checkout",
            ".GIT/config",
            ".loom/agents/evil.md",
            ".loom",
            "loom.toml",
        ] {
            assert_eq!(why(path, &entry), Some(Why::Reserved), "{path}");
        }
        for path in ["", "/etc/passwd", "../out", "a/../../b", "a//b", "./a", "a/", "a\0b"] {
            assert_eq!(why(path, &entry), Some(Why::NotPlain), "{path:?}");
        }
        // A project below may have its own: not the workspace's.
        for path in [
            "src/main.rs",
            "sub/.loom/notes",
            "sub/loom.toml",
            ".gitignore",
            ".github/ci.yml",
        ] {
            assert_eq!(why(path, &entry), None, "{path}");
        }
    }

    #[test]
    fn modes_beyond_read_write_and_execute_are_refused() {
        for mode in [0o644, 0o755, 0o600, 0o777, 0o000] {
            assert_eq!(why("a", &entry_of(b"x", mode, false)), None, "{mode:o}");
        }
        for mode in [0o4755, 0o2755, 0o6755, 0o1777, 0o010_644, 0o020_644, 0o140_644] {
            assert_eq!(
                why("a", &entry_of(b"x", mode, false)),
                Some(Why::Mode(mode)),
                "{mode:o}"
            );
        }
    }

    #[test]
    fn a_hash_that_is_not_a_sha256_is_refused() {
        for hash in [
            "",
            "abc",
            &"A".repeat(64),
            &format!("{}/", "a".repeat(63)),
            &"a".repeat(65),
        ] {
            let entry = Entry {
                hash: hash.to_string(),
                ..entry_of(b"x", 0o644, false)
            };
            assert_eq!(why("a", &entry), Some(Why::Hash), "{hash}");
        }
    }

    #[test]
    fn content_must_have_the_recorded_size_and_hash() {
        let entry = entry_of(b"echo hi\n", 0o644, false);
        assert_eq!(content("a", &entry, b"echo hi\n"), Ok(()));
        assert_eq!(
            content("a", &entry, b"echo pwned\n").unwrap_err().why,
            Why::Size {
                recorded: 8,
                actual: 11
            }
        );
        assert_eq!(content("a", &entry, b"echo ho\n").unwrap_err().why, Why::Content);
    }

    #[test]
    fn links_only_to_inside_the_workspace_and_never_into_git() {
        let inside: &[(&str, &[u8])] = &[
            ("link", b"target"),
            ("a/b/link", b"../../c"),
            ("a/link", b"./b/c"),
            ("a/link", b".."),
            ("a/link", b"b//c"),
        ];
        for (path, target) in inside {
            assert!(link_stays_inside(path, target), "{path} -> {target:?}");
            assert_eq!(content(path, &entry_of(target, 0o777, true), target), Ok(()));
        }
        let outside: &[(&str, &[u8])] = &[
            ("link", b"/etc/passwd"),
            ("link", b".."),
            ("a/link", b"../.."),
            ("a/link", b"b/../.."),
            ("a/link", b"x/.."),
            ("link", b".git/hooks/pre-commit"),
            ("a/link", b"../.loom"),
            ("link", b"loom.toml"),
            ("link", b""),
            ("link", b"a\0b"),
        ];
        for (path, target) in outside {
            assert!(!link_stays_inside(path, target), "{path} -> {target:?}");
            let refused = content(path, &entry_of(target, 0o777, true), target).unwrap_err();
            assert!(matches!(refused.why, Why::LinkOut(_)), "{refused}");
        }
    }

    #[test]
    fn a_manifest_is_refused_for_one_bad_record_and_the_refusal_names_it() {
        let good = entry_of(b"x", 0o644, false);
        let target = Manifest(
            [
                ("a.txt".to_string(), good.clone()),
                ("run.sh".to_string(), entry_of(b"x", 0o6755, false)),
            ]
            .into(),
        );
        let refused = manifest(&target, &Filter::default()).unwrap_err();
        assert_eq!(refused.path, "run.sh");
        assert!(refused.to_string().contains("\"run.sh\""), "{refused}");
        assert!(refused.to_string().contains("0o6755"), "{refused}");
        let kept = Manifest([("data/loom.db".to_string(), good)].into());
        assert_eq!(manifest(&kept, &Filter::default()), Ok(()));
        let never = Filter::default().never(["data/loom.db".to_string()]);
        assert_eq!(manifest(&kept, &never).unwrap_err().why, Why::Reserved);
    }
}
