//! `loom.toml` (docs/cli.md, "Configuration"): the keys the `loom` command
//! reads, and [`parse`], which turns a file's text into them or into an
//! error naming the line and the key.
//!
//! Finding the file, trusting it and merging it under the command line
//! stay with the command; this crate only says what a text means, so the
//! same parser is what the fuzz target drives (bench/fuzz).

mod keys;
mod parse;
mod schema;
mod server;

pub use keys::{
    BashConfig, ClusterConfig, FeedbackConfig, FileConfig, McpConfig, PriceConfig, ProviderConfig, RetrievalConfig,
    SchedulerConfig, SnapshotsConfig, TelemetryConfig, ToolsConfig,
};
pub use parse::{parse, ParseError};
pub use schema::{keys, schema, ANY};
pub use server::{Role, ServerSettings, TokenEntry};
