//! Loom on Redis: [`RedisStore`], the [`loom_core::Store`] that processes
//! on several machines share (docs/cluster.md).

mod appender;
mod scripts;
mod store;

pub use store::RedisStore;
