//! Loom on Redis: [`RedisStore`], the [`loom_core::Store`] that processes
//! on several machines share, and the leases with which `loom worker`
//! processes take runs ([`loom_core::RunLeases`]; docs/cluster.md), and
//! [`RedisSnapshots`], where the runs' workspace snapshots are kept
//! (docs/rewind.md); [`redacted_url`], a Redis URL as it may be shown.

mod appender;
mod errors;
mod jobs;
mod leases;
mod nudges;
mod scripts;
mod snapshots;
mod store;
mod tail;
mod url;

pub use snapshots::RedisSnapshots;
pub use store::RedisStore;
pub use tail::RedisTail;
pub use url::redacted_url;
