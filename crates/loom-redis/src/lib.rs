//! Loom on Redis: [`RedisStore`], the [`loom_core::Store`] that processes
//! on several machines share, and the leases with which `loom worker`
//! processes take runs ([`loom_core::RunLeases`]; docs/cluster.md).

mod appender;
mod leases;
mod nudges;
mod scripts;
mod store;
mod tail;

pub use store::RedisStore;
pub use tail::RedisTail;
