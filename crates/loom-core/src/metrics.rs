//! Per-run counters reported in `agent.finish` and `lifecycle.end`.

use serde::{Deserialize, Serialize};

use crate::llm::Usage;

/// What a run did, counted as it went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunMetrics {
    /// Turns started.
    pub iterations: u32,
    /// Model calls made (including the final-answer call).
    pub llm_calls: u32,
    /// Tool calls finished.
    pub tool_calls: u32,
    /// Tool calls that ended in error, denied, timeout or cancelled.
    pub tool_failures: u32,
    /// Prompt tokens reported by the model.
    pub input_tokens: u64,
    /// Completion tokens reported by the model.
    pub output_tokens: u64,
    /// Wall time of the run so far, in milliseconds.
    pub duration_ms: u64,
}

impl RunMetrics {
    /// Adds one call's usage.
    pub fn add_usage(&mut self, usage: &Usage) {
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
    }
}
