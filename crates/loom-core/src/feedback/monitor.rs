//! `RecursionMonitor` (seed 003): watches the turns for repeated tool
//! calls, loops and errors, warns at 80 % of a limit and ends the tool
//! phase of a run (one last call for the answer) when a limit is reached.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::message::ToolCall;
use crate::tool_result::ToolResult;

/// Thresholds of the monitor.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorConfig {
    /// The same tool with the same arguments this many turns in a row ends the tool phase (default 3).
    pub duplicate_threshold: u32,
    /// Turns looked at for a repeating pattern (default 5).
    pub loop_window: usize,
    /// Share of failed tool calls that ends the tool phase (default 0.5)…
    pub error_threshold: f64,
    /// …once at least this many calls were made (default 4).
    pub min_calls_for_error_rate: usize,
    /// Warn at this share of a limit (default 0.8).
    pub warning_ratio: f64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            duplicate_threshold: 3,
            loop_window: 5,
            error_threshold: 0.5,
            min_calls_for_error_rate: 4,
            warning_ratio: 0.8,
        }
    }
}

/// Why the monitor ends the tool phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// The same call, turn after turn.
    DuplicateTools,
    /// A repeating pattern of turns.
    LoopDetected,
    /// Too many failed calls.
    ErrorThreshold,
}

impl Termination {
    /// The reason as reported in `guidance.injected`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::DuplicateTools => "duplicate_tools",
            Self::LoopDetected => "loop_detected",
            Self::ErrorThreshold => "error_threshold",
        }
    }

    /// Seed 003's termination message.
    pub fn message(self) -> &'static str {
        match self {
            Self::DuplicateTools => "⚠️ Detected repeated tool calls. Please proceed with available information.",
            Self::LoopDetected => "⚠️ Detected execution loop. Please break the pattern and complete the task.",
            Self::ErrorThreshold => "⚠️ Too many errors occurred. Please complete the task with current information.",
        }
    }
}

/// The message when the step limit is reached (seed 003).
pub const MAX_ITERATIONS_MESSAGE: &str =
    "⚠️ Maximum iterations reached. Please provide the best answer with current information.";

/// What the monitor says before the next turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// End the tool phase for this reason.
    pub terminate: Option<Termination>,
    /// Early warnings: (reason, message).
    pub warnings: Vec<(&'static str, String)>,
}

/// Watches a run's turns. Its state is bounded: streaks per call of the
/// latest turn and the fingerprints of the last `loop_window` turns, so a
/// check costs the same at turn 10 and at turn 10 000.
#[derive(Debug, Default)]
pub struct RecursionMonitor {
    config: MonitorConfig,
    /// For each call of the latest turn: how many turns in a row made it.
    streaks: HashMap<String, usize>,
    fingerprints: VecDeque<u64>,
    tool_calls: usize,
    failures: usize,
    warned: HashSet<String>,
}

impl RecursionMonitor {
    /// A monitor with `config`.
    pub fn new(config: MonitorConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Records a turn that called tools.
    pub fn observe(&mut self, text: &str, calls: &[ToolCall], results: &[ToolResult]) {
        // Several calls of one tool in one batch count once: a parallel
        // batch is not a repetition.
        let signatures: BTreeSet<String> = calls.iter().map(|c| format!("{}:{}", c.name, c.arguments)).collect();
        let mut hasher = DefaultHasher::new();
        text.trim().hash(&mut hasher);
        signatures.hash(&mut hasher);
        for result in results {
            result.status.as_str().hash(&mut hasher);
        }
        self.tool_calls += results.len();
        self.failures += results.iter().filter(|r| r.status.is_failure()).count();
        self.streaks = signatures
            .into_iter()
            .map(|signature| {
                let streak = self.streaks.get(&signature).copied().unwrap_or(0) + 1;
                (signature, streak)
            })
            .collect();
        self.fingerprints.push_back(hasher.finish());
        while self.fingerprints.len() > self.config.loop_window.max(2) {
            self.fingerprints.pop_front();
        }
    }

    /// The verdict before turn `next_turn` of at most `max_turns`.
    pub fn check(&mut self, next_turn: u32, max_turns: u32) -> Verdict {
        let mut verdict = Verdict::default();
        let limit = self.config.duplicate_threshold.max(1) as usize;
        let (streak, repeated) = self.longest_repeat();
        if streak >= limit {
            verdict.terminate = Some(Termination::DuplicateTools);
            return verdict;
        }
        if self.loop_detected() {
            verdict.terminate = Some(Termination::LoopDetected);
            return verdict;
        }
        let rate = if self.tool_calls == 0 {
            0.0
        } else {
            self.failures as f64 / self.tool_calls as f64
        };
        let enough_calls = self.tool_calls >= self.config.min_calls_for_error_rate;
        if enough_calls && rate >= self.config.error_threshold {
            verdict.terminate = Some(Termination::ErrorThreshold);
            return verdict;
        }

        let ratio = self.config.warning_ratio;
        let warn_streak = ((limit as f64) * ratio).floor().max(1.0) as usize;
        if streak >= warn_streak && streak >= 2 {
            if let Some(tool) = repeated {
                self.warn(
                    &mut verdict,
                    "repetition_warning",
                    &format!("repeat:{tool}:{streak}"),
                    format!("⚠️ You've called '{tool}' multiple times with the same arguments. Consider trying a different approach or completing the task."),
                );
            }
        }
        if enough_calls && rate >= self.config.error_threshold * ratio {
            self.warn(
                &mut verdict,
                "error_rate_warning",
                "errors",
                format!(
                    "⚠️ {:.0}% of tool calls have failed. Check the errors above and fix the arguments, or complete the task with what you have.",
                    rate * 100.0
                ),
            );
        }
        let warn_turn = ((max_turns as f64) * ratio).ceil() as u32;
        if max_turns > 1 && next_turn >= warn_turn && next_turn < max_turns {
            let remaining = max_turns - next_turn;
            self.warn(
                &mut verdict,
                "iteration_warning",
                "iterations",
                format!(
                    "⚠️ Approaching iteration limit ({remaining} remaining). Please work towards completing the task."
                ),
            );
        }
        verdict
    }

    fn warn(&mut self, verdict: &mut Verdict, reason: &'static str, key: &str, message: String) {
        if self.warned.insert(key.to_string()) {
            verdict.warnings.push((reason, message));
        }
    }

    /// The longest run of latest turns sharing a call, and that call's tool.
    fn longest_repeat(&self) -> (usize, Option<String>) {
        self.streaks
            .iter()
            .max_by_key(|(_, streak)| **streak)
            .map(|(signature, streak)| (*streak, signature.split_once(':').map(|(name, _)| name.to_string())))
            .unwrap_or((0, None))
    }

    /// A pattern of two or more turns repeating back to back within the window.
    fn loop_detected(&self) -> bool {
        let prints: Vec<u64> = self.fingerprints.iter().copied().collect();
        let window = self.config.loop_window.min(prints.len());
        (2..=window / 2).any(|period| {
            let n = prints.len();
            let cycle = &prints[n.saturating_sub(period)..];
            // A constant run is repetition, the duplicate rule's business.
            let varied = cycle.iter().any(|p| *p != cycle[0]);
            n >= 2 * period && varied && prints[n - period..] == prints[n - 2 * period..n - period]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_result::ToolStatus;
    use serde_json::json;

    fn call(name: &str, arg: i64) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: json!({"x": arg}),
        }
    }

    fn ok(n: usize) -> Vec<ToolResult> {
        (0..n)
            .map(|_| ToolResult::new("c", "t", ToolStatus::Success, "ok"))
            .collect()
    }

    #[test]
    fn repetition_is_by_name_and_arguments() {
        let mut monitor = RecursionMonitor::default();
        for arg in 0..5 {
            monitor.observe("", &[call("search", arg)], &ok(1));
            assert_eq!(
                monitor.check(arg as u32 + 1, 50).terminate,
                None,
                "different arguments are progress"
            );
        }
        let mut monitor = RecursionMonitor::default();
        monitor.observe("", &[call("search", 1)], &ok(1));
        assert!(monitor.check(1, 50).warnings.is_empty());
        monitor.observe("", &[call("search", 1)], &ok(1));
        let verdict = monitor.check(2, 50);
        assert_eq!(verdict.terminate, None);
        assert_eq!(
            verdict.warnings[0].0, "repetition_warning",
            "warned at 80 % of the limit"
        );
        monitor.observe("", &[call("search", 1)], &ok(1));
        assert_eq!(monitor.check(3, 50).terminate, Some(Termination::DuplicateTools));
    }

    #[test]
    fn a_parallel_batch_is_not_a_repetition() {
        let mut monitor = RecursionMonitor::default();
        monitor.observe(
            "",
            &[call("read", 1), call("read", 1), call("read", 1), call("read", 1)],
            &ok(4),
        );
        let verdict = monitor.check(1, 50);
        assert_eq!(verdict.terminate, None);
        assert!(verdict.warnings.is_empty());
    }

    #[test]
    fn loops_errors_and_the_iteration_warning() {
        let mut monitor = RecursionMonitor::default();
        for turn in 0..4 {
            monitor.observe("", &[call(if turn % 2 == 0 { "a" } else { "b" }, 0)], &ok(1));
        }
        assert_eq!(monitor.check(4, 50).terminate, Some(Termination::LoopDetected));

        let mut monitor = RecursionMonitor::new(MonitorConfig {
            duplicate_threshold: 10,
            ..MonitorConfig::default()
        });
        for turn in 0..6 {
            monitor.observe("", &[call("same", 0)], &ok(1));
            assert_eq!(monitor.check(turn + 1, 50).terminate, None, "repetition is not a loop");
        }

        let mut monitor = RecursionMonitor::default();
        let failed = vec![ToolResult::new("c", "t", ToolStatus::Error, "bad"); 2];
        monitor.observe("", &[call("a", 1), call("b", 2)], &failed);
        monitor.observe("", &[call("c", 3), call("d", 4)], &ok(2));
        assert_eq!(monitor.check(2, 50).terminate, Some(Termination::ErrorThreshold));

        let mut monitor = RecursionMonitor::default();
        assert!(monitor.check(7, 10).warnings.is_empty());
        let verdict = monitor.check(8, 10);
        assert_eq!(
            verdict.warnings[0].1,
            "⚠️ Approaching iteration limit (2 remaining). Please work towards completing the task."
        );
        assert!(monitor.check(9, 10).warnings.is_empty(), "warned once");
    }
}
