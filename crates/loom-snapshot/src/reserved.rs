//! The names a workspace's snapshot never holds and a restore never
//! writes, whatever a filter says: one rule for the walk of a scan
//! (`walk.rs`), the filter (`filter.rs`) and the records a restore judges
//! (`validate.rs`).

/// Whether an entry named `name`, `depth` folders down (1: in the
/// workspace's own folder), is never in a snapshot nor written by a
/// restore: `.git` anywhere (its hooks and config run as whoever runs
/// `git` next; any case, for file systems that fold it), and the
/// workspace's own `.loom/` and `loom.toml` (a rewind never takes a
/// person's configuration back).
pub(crate) fn reserved_name(name: &str, depth: usize) -> bool {
    // Any case: a file system that folds case opens `.LOOM` as `.loom`.
    name.eq_ignore_ascii_case(".git")
        || (depth == 1 && (name.eq_ignore_ascii_case(".loom") || name.eq_ignore_ascii_case("loom.toml")))
}

/// Whether `path` (`/`-separated, relative) is, or is beneath, a reserved
/// name ([`reserved_name`]).
pub(crate) fn is_reserved(path: &str) -> bool {
    path.split('/')
        .enumerate()
        .any(|(at, name)| reserved_name(name, at + 1))
}
