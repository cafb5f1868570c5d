//! Per-run counters reported in `agent.finish` and `lifecycle.end`.

use serde::{Deserialize, Serialize};

use crate::llm::Usage;

/// What a run did, counted as it went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Money spent on the model, in US dollars, when the model's prices are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// A model's prices, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    /// Per million prompt tokens.
    pub input_per_mtok: f64,
    /// Per million completion tokens.
    pub output_per_mtok: f64,
}

impl Pricing {
    /// What `usage` costs.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input_per_mtok + usage.output_tokens as f64 * self.output_per_mtok) / 1e6
    }
}

impl RunMetrics {
    /// Adds one call's usage.
    pub fn add_usage(&mut self, usage: &Usage) {
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
    }
}
