//! A tool that does nothing, for measuring what Loom itself costs.

use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

/// `noop`'s arguments: none.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The `noop` tool: answers "ok" at once. Concurrency-safe (read-only) or
/// not, as the benchmark needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopTool {
    concurrency_safe: bool,
}

impl NoopTool {
    /// A no-op that counts as side-effecting (runs alone, is journaled).
    pub fn serial() -> Self {
        Self {
            concurrency_safe: false,
        }
    }

    /// A no-op that counts as read-only (runs in parallel, not journaled).
    pub fn concurrent() -> Self {
        Self { concurrency_safe: true }
    }
}

impl Tool for NoopTool {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "noop"
    }
    fn description(&self) -> &str {
        "Does nothing."
    }
    fn concurrency_safe(&self) -> bool {
        self.concurrency_safe
    }

    /// The concurrency-safe no-op is also read-only; the other one stands
    /// for a tool with side effects.
    fn read_only(&self) -> bool {
        self.concurrency_safe
    }
    async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok("ok".into())
    }
}
