//! What a snapshot holds: each file's content hash, size and mode, by its
//! path in the workspace (`/`-separated, relative), and the change from one
//! snapshot to the next.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// SHA-256 of its content (for a symbolic link: of its target), hex.
    pub hash: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits (`0o644`, `0o755`).
    pub mode: u32,
    /// A symbolic link: its content is where it points.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub link: bool,
}

/// The files of a workspace at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest(pub BTreeMap<String, Entry>);

/// What changed from one manifest to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// Files added or changed, as they are now.
    pub changed: BTreeMap<String, Entry>,
    /// Files gone.
    pub removed: BTreeSet<String>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

impl Manifest {
    /// What changed from `self` to `next`.
    pub fn delta(&self, next: &Manifest) -> Delta {
        let changed = next
            .0
            .iter()
            .filter(|(path, entry)| self.0.get(*path) != Some(entry))
            .map(|(path, entry)| (path.clone(), entry.clone()))
            .collect();
        let removed = self
            .0
            .keys()
            .filter(|path| !next.0.contains_key(*path))
            .cloned()
            .collect();
        Delta { changed, removed }
    }

    /// `self` with `delta` applied.
    pub fn apply(&mut self, delta: &Delta) {
        for path in &delta.removed {
            self.0.remove(path);
        }
        for (path, entry) in &delta.changed {
            self.0.insert(path.clone(), entry.clone());
        }
    }
}

/// The permission bits a record's mode holds, and a restored file may
/// have: read, write and execute for its owner, group and others — never
/// setuid, setgid or sticky, and no file type (a restore makes regular
/// files and links only).
pub const PERMISSION_BITS: u32 = 0o777;

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: &str) -> Entry {
        Entry {
            hash: hash.to_string(),
            size: 1,
            mode: 0o644,
            link: false,
        }
    }

    #[test]
    fn a_delta_applied_to_the_first_manifest_gives_the_second() {
        let first = Manifest(BTreeMap::from([
            ("a".to_string(), entry("1")),
            ("b".to_string(), entry("2")),
            ("c".to_string(), entry("3")),
        ]));
        let second = Manifest(BTreeMap::from([
            ("a".to_string(), entry("1")),
            ("b".to_string(), entry("9")),
            ("d".to_string(), entry("4")),
        ]));
        let delta = first.delta(&second);
        assert_eq!(delta.changed.len(), 2);
        assert_eq!(delta.removed, BTreeSet::from(["c".to_string()]));
        let mut replayed = first;
        replayed.apply(&delta);
        assert_eq!(replayed, second);
        assert!(second.delta(&second).is_empty());
    }
}
