//! Per-run counters reported in `agent.finish` and `lifecycle.end`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::llm::Usage;

/// What a run did, counted as it went. Fields missing from a stored copy
/// (written by an older Loom) read as zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
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
    /// Time spent waiting for the model, in milliseconds.
    #[serde(default)]
    pub llm_ms: u64,
    /// Tool calls by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolStats>,
    /// Times the history was compressed.
    #[serde(default)]
    pub compressions: u32,
    /// Tokens after compression over tokens before, over all compressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_ratio: Option<f64>,
    /// Errors by kind (tool error kinds, denials, timeouts, model errors).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u32>,
    /// Tokens before each compression, added up.
    #[serde(default)]
    pub compressed_from_tokens: u64,
    /// Tokens after each compression, added up.
    #[serde(default)]
    pub compressed_to_tokens: u64,
}

/// What one tool did in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ToolStats {
    /// Calls.
    pub calls: u32,
    /// Calls that did not succeed.
    pub failures: u32,
    /// `(calls - failures) / calls`.
    pub success_rate: f64,
    /// Mean duration in milliseconds.
    pub avg_ms: f64,
    /// Longest call in milliseconds.
    pub max_ms: u64,
    /// All calls together, in milliseconds.
    pub total_ms: u64,
}

impl RunMetrics {
    /// Counts one finished tool call.
    pub fn record_tool(&mut self, name: &str, failed: bool, error_kind: Option<&str>, duration_ms: u64) {
        self.tool_calls += 1;
        let stats = self.tools.entry(name.to_string()).or_default();
        stats.calls += 1;
        stats.total_ms += duration_ms;
        stats.max_ms = stats.max_ms.max(duration_ms);
        if failed {
            self.tool_failures += 1;
            stats.failures += 1;
            *self
                .errors
                .entry(error_kind.unwrap_or("tool_error").to_string())
                .or_default() += 1;
        }
        stats.success_rate = f64::from(stats.calls - stats.failures) / f64::from(stats.calls);
        stats.avg_ms = stats.total_ms as f64 / f64::from(stats.calls);
    }

    /// Counts one compression.
    pub fn record_compression(&mut self, tokens_before: usize, tokens_after: usize) {
        self.compressions += 1;
        self.compressed_from_tokens += tokens_before as u64;
        self.compressed_to_tokens += tokens_after as u64;
        if self.compressed_from_tokens > 0 {
            self.compression_ratio = Some(self.compressed_to_tokens as f64 / self.compressed_from_tokens as f64);
        }
    }

    /// Counts an error of `kind`.
    pub fn record_error(&mut self, kind: &str) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
    }

    /// Suggestions drawn from the metrics.
    pub fn suggestions(&self) -> Vec<String> {
        let mut out = Vec::new();
        let tokens = self.input_tokens + self.output_tokens;
        if tokens > 150_000 {
            out.push(format!(
                "High token use ({tokens} tokens): lower compression_threshold or keep fewer recent messages."
            ));
        }
        if self.tool_calls > 0 {
            let rate = f64::from(self.tool_calls - self.tool_failures) / f64::from(self.tool_calls);
            if rate < 0.8 {
                out.push(format!(
                    "Low tool success rate ({:.0}%): check the tools' argument schemas and error messages.",
                    rate * 100.0
                ));
            }
        }
        if let Some(ratio) = self.compression_ratio {
            if ratio < 0.5 {
                out.push(format!(
                    "Compression works well (history shrank to {:.0}%).",
                    ratio * 100.0
                ));
            } else if ratio > 0.8 {
                out.push(format!(
                    "Compression gains little (history only shrank to {:.0}%): keep fewer recent messages or use a stronger summarizer.",
                    ratio * 100.0
                ));
            }
        }
        let errors: u32 = self.errors.values().sum();
        let calls = self.tool_calls + self.llm_calls;
        if calls > 0 && f64::from(errors) / f64::from(calls) > 0.1 {
            if let Some((kind, count)) = self.errors.iter().max_by_key(|(_, count)| **count) {
                out.push(format!(
                    "High error rate ({:.0}% of calls); most frequent: {kind} ({count}).",
                    f64::from(errors) * 100.0 / f64::from(calls)
                ));
            }
        }
        if let Some((name, stats)) = self.tools.iter().max_by_key(|(_, s)| s.max_ms) {
            if stats.max_ms > 10_000 {
                out.push(format!(
                    "'{name}' took up to {:.1} s: give it a tighter tool timeout or make it concurrency-safe so it runs in parallel.",
                    stats.max_ms as f64 / 1000.0
                ));
            }
        }
        out
    }
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
        // Counts come from the provider: absurd ones must not overflow.
        self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
    }
}
