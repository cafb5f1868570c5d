//! Workspace snapshots: the state of a workspace's files after each step
//! of a run, so that a person can return to it or branch from it (rewind
//! and fork, docs/rewind.md; its cost is measured in bench/README.md,
//! "Snapshots per turn"). [`Snapshots`] is the engine's
//! [`loom_core::WorkspaceSnapshots`] for one workspace.
//!
//! A snapshot is a [`Manifest`] — each file's path, content hash, size and
//! mode — stored as the [`Delta`] from the snapshot before it, with the
//! contents kept once per hash ([`store`]). A [`Scanner`] makes the next
//! manifest by looking only at what changed since the last one (a file
//! whose size, modification time, inode and mode are the same is not read
//! again), so a turn costs in proportion to what it changed.

#![warn(missing_docs)]

mod filter;
pub mod manifest;
mod reserved;
pub mod restore;
pub mod scan;
pub mod store;
pub mod validate;
mod walk;
mod watch;
pub mod workspace;

pub use filter::{Filter, FilterSpec};
pub use manifest::{Delta, Entry, Manifest};
pub use restore::{apply, changed_outside, Plan, RestoreError};
pub use scan::{ScanError, Scanned, Scanner, Skipped};
pub use store::{NewPoint, Point, Rebased, SnapshotStore, SnapshotStoreError, SqliteSnapshots};
pub use validate::{Refused, Why};
pub use workspace::{database_files, runs_lock_of, Snapshots, KEYFRAME_DEPTH};
