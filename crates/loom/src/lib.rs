//! Loom: an agent runtime that drives a model through a think–act loop with
//! tools, streams every step as typed events, and lets you steer, cancel and
//! inspect a run.
//!
//! ```no_run
//! use loom::{Agent, models::ScriptedModel, tools::file_tools};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = Agent::builder()
//!     .model(ScriptedModel::from_path("script.json")?)
//!     .tools(file_tools())
//!     .workspace(".")
//!     .build()?;
//! let mut run = agent.run("Summarize the workspace");
//! while let Some(event) = run.next_event().await {
//!     println!("{}", serde_json::to_string(&event)?);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub use loom_core::*;

/// Model providers: the scripted model and `provider:model` parsing.
pub mod models {
    pub use loom_llm::*;
}

/// Durable storage: SQLite, and Redis with the `redis` feature.
pub mod stores {
    #[cfg(feature = "redis")]
    pub use loom_redis::{redacted_url, RedisSnapshots, RedisStore};
    pub use loom_store::*;
}

/// Runs as OpenTelemetry traces in the GenAI conventions, exported over
/// OTLP (docs/telemetry.md): [`telemetry::Telemetry`](loom_telemetry::Telemetry),
/// given to [`AgentBuilder::observer`].
#[cfg(feature = "telemetry")]
pub mod telemetry {
    pub use loom_telemetry::*;
}

/// Workspace snapshots for rewind and fork (docs/rewind.md):
/// [`workspace::Snapshots`](loom_snapshot::Snapshots), given to
/// [`AgentBuilder::snapshots`].
pub mod workspace {
    pub use loom_snapshot::*;
}

/// Built-in tools.
pub mod tools {
    pub use loom_tools::*;
}
