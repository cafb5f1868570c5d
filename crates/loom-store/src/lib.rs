//! Durable storage behind [`loom_core::Store`]: SQLite, embedded, in WAL
//! mode with a busy timeout, every call on tokio's blocking pool (the
//! frequent writes of all runs committed in groups by one writer thread,
//! `group_commit.rs`; the log moved into the database by a thread of its
//! own, `wal_checkpointer.rs`), and a
//! versioned schema migrated forward on open (never backward: a database
//! from a newer Loom is refused, not rewritten).

#![warn(missing_docs)]

mod group_commit;
mod schema;
mod sqlite;
mod wal_checkpointer;

pub use schema::{MIGRATIONS, SCHEMA_VERSION};
pub use sqlite::SqliteStore;
