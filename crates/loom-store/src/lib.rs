//! Durable storage behind [`loom_core::Store`]: SQLite, embedded, in WAL
//! mode with a busy timeout, every call on tokio's blocking pool, and a
//! versioned schema migrated forward on open (never backward: a database
//! from a newer Loom is refused, not rewritten).

#![warn(missing_docs)]

mod schema;
mod sqlite;

pub use schema::{MIGRATIONS, SCHEMA_VERSION};
pub use sqlite::SqliteStore;
