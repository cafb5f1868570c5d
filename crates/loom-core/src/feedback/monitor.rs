//! `RecursionMonitor` (docs/context.md): watches the turns for repeated tool
//! calls, loops and errors, warns at 80 % of a limit and ends the tool
//! phase of a run (one last call for the answer) when a limit is reached.
//!
//! The defaults are set against real agents: a model exploring a codebase
//! misses files and mistypes arguments, and recovers (codex and Claude Code
//! let it). So the error rule looks at the latest calls only, needs most of
//! them to fail, and the failures to span several turns (one parallel batch
//! of wrong guesses is one mistake); and repetition means the same call
//! getting the same result turn after turn — polling something that
//! changes is progress.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::feedback::GuidanceReason;
use crate::message::ToolCall;
use crate::tool_result::{ToolResult, ToolStatus};

/// Thresholds of the monitor.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorConfig {
    /// Whether the monitor watches at all (default true). Off, a run ends
    /// only by its answer, its step limit, its deadlines or a cancel.
    pub enabled: bool,
    /// The same call with the same result this many turns in a row ends the tool phase (default 3, at least 2).
    pub duplicate_threshold: u32,
    /// Turns looked at for a repeating pattern (default 6, at least 4: a
    /// pattern must be seen twice).
    pub loop_window: usize,
    /// Share of the latest `error_window` calls that, failing, ends the tool
    /// phase (default 0.8, in (0, 1]: 8 failed calls of the latest 10), once
    /// the failures span at least 3 turns.
    pub error_threshold: f64,
    /// How many of the latest calls the error rule looks at (default 10, at least 1).
    pub error_window: usize,
    /// Warn at this share of a limit (default 0.8, in (0, 1]).
    pub warning_ratio: f64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            duplicate_threshold: 3,
            loop_window: 6,
            error_threshold: 0.8,
            error_window: 10,
            warning_ratio: 0.8,
        }
    }
}

impl MonitorConfig {
    /// Checks the thresholds; the error names the setting and the rule.
    pub fn validate(&self) -> Result<(), String> {
        let in_unit = |value: f64| value > 0.0 && value <= 1.0;
        if !in_unit(self.error_threshold) {
            return Err(format!(
                "error_threshold must be more than 0 and at most 1 (got {})",
                self.error_threshold
            ));
        }
        if !in_unit(self.warning_ratio) {
            return Err(format!(
                "warning_ratio must be more than 0 and at most 1 (got {})",
                self.warning_ratio
            ));
        }
        if self.duplicate_threshold < 2 {
            return Err(format!(
                "duplicate_threshold must be at least 2 (got {})",
                self.duplicate_threshold
            ));
        }
        if self.loop_window < 4 {
            return Err(format!(
                "loop_window must be at least 4 turns (got {})",
                self.loop_window
            ));
        }
        if self.error_window == 0 {
            return Err("error_window must be at least 1 call (got 0)".to_string());
        }
        Ok(())
    }
}

crate::wire::wire_enum! {
    /// Why the monitor ends the tool phase. The wire name is the reason
    /// reported in events (`guidance.injected`, `llm.start`'s `finalAnswer`).
    pub enum Termination {
        /// The same call, with the same result, turn after turn.
        DuplicateTools = "duplicate_tools",
        /// A repeating pattern of turns.
        LoopDetected = "loop_detected",
        /// Most of the latest calls failed.
        ErrorThreshold = "error_threshold",
    }
}

impl Termination {
    /// The reason as reported in events.
    pub fn reason(self) -> &'static str {
        self.as_str()
    }

    /// The same, as a guidance reason.
    pub fn guidance_reason(self) -> GuidanceReason {
        match self {
            Self::DuplicateTools => GuidanceReason::DuplicateTools,
            Self::LoopDetected => GuidanceReason::LoopDetected,
            Self::ErrorThreshold => GuidanceReason::ErrorThreshold,
        }
    }

    /// The termination message the model reads.
    pub fn message(self) -> &'static str {
        match self {
            Self::DuplicateTools => "⚠️ Detected repeated tool calls. Please proceed with available information.",
            Self::LoopDetected => "⚠️ Detected execution loop. Please break the pattern and complete the task.",
            Self::ErrorThreshold => "⚠️ Too many errors occurred. Please complete the task with current information.",
        }
    }
}

/// The monitor's decision to end the tool phase, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stop {
    /// Which rule.
    pub termination: Termination,
    /// What it saw, for people (e.g. "8 of the last 10 tool calls failed").
    pub detail: String,
}

/// Turns the failures must span before the error rule stops the tools: the
/// model has had two chances to correct itself.
pub(super) const MIN_FAILING_TURNS: usize = 3;

/// The message when the step limit is reached (docs/context.md).
pub const MAX_ITERATIONS_MESSAGE: &str =
    "⚠️ Maximum iterations reached. Please provide the best answer with current information.";

/// What the monitor says before the next turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MonitorReport {
    /// End the tool phase.
    pub terminate: Option<Stop>,
    /// Early warnings: (reason, message).
    pub warnings: Vec<(GuidanceReason, String)>,
}

/// Feeds what is written into a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Watches a run's turns. Its state is bounded: streaks per call of the
/// latest turn, the fingerprints of the last `loop_window` turns and the
/// outcomes of the last `error_window` calls, so a check costs the same at
/// turn 10 and at turn 10 000. It is part of a run's checkpointed state
/// (without its configuration, which comes from the agent that resumes).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecursionMonitor {
    #[serde(skip)]
    config: MonitorConfig,
    /// For each call of the latest turn (name, arguments and result): how
    /// many turns in a row made it. Keyed `name:hash` (older checkpoints
    /// kept the arguments whole: their streaks start again).
    streaks: BTreeMap<String, usize>,
    fingerprints: VecDeque<u64>,
    /// The latest calls, newest last: the turn each came in, and whether it failed.
    recent: VecDeque<(u64, bool)>,
    /// Turns observed.
    turns: u64,
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

    /// The same observations judged by `config` (a resumed run's monitor
    /// takes the resuming agent's thresholds).
    pub fn with_config(mut self, config: MonitorConfig) -> Self {
        self.config = config;
        self
    }

    /// Records a turn that called tools.
    pub fn observe(&mut self, text: &str, calls: &[ToolCall], results: &[ToolResult]) {
        if !self.config.enabled {
            return;
        }
        // A call is its name, arguments and what it returned. Several equal
        // calls in one batch count once: a parallel batch is not a repetition.
        let signatures: BTreeSet<String> = calls
            .iter()
            .map(|call| {
                let mut hasher = DefaultHasher::new();
                // The arguments' JSON goes straight into the hash: no string
                // of them per call per turn.
                let _ = serde_json::to_writer(HashWriter(&mut hasher), &call.arguments);
                if let Some(result) = results.iter().find(|r| r.call_id == call.id) {
                    result.status.as_str().hash(&mut hasher);
                    result.content.hash(&mut hasher);
                }
                format!("{}:{:x}", call.name, hasher.finish())
            })
            .collect();
        let mut hasher = DefaultHasher::new();
        text.trim().hash(&mut hasher);
        signatures.hash(&mut hasher);
        // A cancelled call says nothing about the model's work.
        self.turns += 1;
        for result in results.iter().filter(|r| r.status != ToolStatus::Cancelled) {
            self.recent.push_back((self.turns, result.status.is_failure()));
            if self.recent.len() > self.config.error_window.max(1) {
                self.recent.pop_front();
            }
        }
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

    /// The report before turn `next_turn` of at most `max_turns`.
    pub fn check(&mut self, next_turn: u32, max_turns: u32) -> MonitorReport {
        let mut report = MonitorReport::default();
        if !self.config.enabled {
            // The step limit is not the monitor's: its warning stays.
            self.warn_of_the_step_limit(&mut report, next_turn, max_turns);
            return report;
        }
        let limit = self.config.duplicate_threshold.max(2) as usize;
        let (streak, repeated) = self.longest_repeat();
        if streak >= limit {
            report.terminate = Some(Stop {
                termination: Termination::DuplicateTools,
                detail: format!(
                    "'{}' was called with the same arguments and got the same result {streak} turns in a row",
                    repeated.unwrap_or_default()
                ),
            });
            return report;
        }
        if let Some(period) = self.loop_period() {
            report.terminate = Some(Stop {
                termination: Termination::LoopDetected,
                detail: format!("the same {period} turns repeated back to back"),
            });
            return report;
        }
        let window = self.config.error_window.max(1);
        let failed: Vec<u64> = self
            .recent
            .iter()
            .filter(|(_, failed)| *failed)
            .map(|(turn, _)| *turn)
            .collect();
        let failures = failed.len();
        let failing_turns = failed.iter().collect::<BTreeSet<_>>().len();
        let seen = self.recent.len();
        // Counts, so a run whose calls all fail is judged before the window fills.
        let stop_at = ((window as f64) * self.config.error_threshold).ceil().max(1.0) as usize;
        if failures >= stop_at && failing_turns >= MIN_FAILING_TURNS {
            report.terminate = Some(Stop {
                termination: Termination::ErrorThreshold,
                detail: format!("{failures} of the last {seen} tool calls failed, over {failing_turns} turns"),
            });
            return report;
        }

        let ratio = self.config.warning_ratio;
        let warn_streak = ((limit as f64) * ratio).floor().max(2.0) as usize;
        if streak >= warn_streak {
            if let Some(tool) = repeated {
                self.warn(
                    &mut report,
                    GuidanceReason::RepetitionWarning,
                    &format!("repeat:{tool}:{streak}"),
                    // Concrete, for a small model: what not to do, and
                    // what the next step may be instead.
                    format!("⚠️ You called '{tool}' {streak} times in a row with the same arguments and got the same result; it is above. Do not call it again. Take the next step of the task with that result: write or edit the files the task asks for, run a command, or give your final answer."),
                );
            }
        }
        let warn_at = ((window as f64) * self.config.error_threshold * ratio).ceil().max(1.0) as usize;
        if failures >= warn_at {
            self.warn(
                &mut report,
                GuidanceReason::ErrorRateWarning,
                "errors",
                format!(
                    "⚠️ {failures} of your last {seen} tool calls failed. Check the errors above and fix the arguments, or complete the task with what you have."
                ),
            );
        } else {
            // A later bad stretch warns again.
            self.warned.remove("errors");
        }
        self.warn_of_the_step_limit(&mut report, next_turn, max_turns);
        report
    }

    /// The warning at `warning_ratio` of the step limit, once.
    fn warn_of_the_step_limit(&mut self, report: &mut MonitorReport, next_turn: u32, max_turns: u32) {
        let warn_turn = ((max_turns as f64) * self.config.warning_ratio).ceil() as u32;
        if max_turns > 1 && next_turn >= warn_turn && next_turn < max_turns {
            let remaining = max_turns - next_turn;
            self.warn(
                report,
                GuidanceReason::IterationWarning,
                "iterations",
                format!(
                    "⚠️ Approaching iteration limit ({remaining} remaining). Please work towards completing the task."
                ),
            );
        }
    }

    fn warn(&mut self, report: &mut MonitorReport, reason: GuidanceReason, key: &str, message: String) {
        if self.warned.insert(key.to_string()) {
            report.warnings.push((reason, message));
        }
    }

    /// The longest run of latest turns sharing a call, and that call's tool.
    fn longest_repeat(&self) -> (usize, Option<String>) {
        self.streaks
            .iter()
            .max_by_key(|(_, streak)| **streak)
            .map(|(signature, streak)| (*streak, signature.rsplit_once(':').map(|(name, _)| name.to_string())))
            .unwrap_or((0, None))
    }

    /// The period of a pattern of two or more turns repeating back to back
    /// within the window.
    fn loop_period(&self) -> Option<usize> {
        let prints: Vec<u64> = self.fingerprints.iter().copied().collect();
        let window = self.config.loop_window.min(prints.len());
        (2..=window / 2).find(|&period| {
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

    fn failed(n: usize) -> Vec<ToolResult> {
        (0..n)
            .map(|_| ToolResult::new("c", "t", ToolStatus::Error, "Error: no such file"))
            .collect()
    }

    #[test]
    fn repetition_is_by_name_arguments_and_result() {
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
        for turn in 0..5 {
            let result = ToolResult::new("c", "t", ToolStatus::Success, format!("build {turn}% done"));
            monitor.observe("", &[call("status", 1)], &[result]);
            assert_eq!(
                monitor.check(turn + 1, 50).terminate,
                None,
                "polling something that changes"
            );
        }
        let mut monitor = RecursionMonitor::default();
        monitor.observe("", &[call("search", 1)], &ok(1));
        assert!(monitor.check(1, 50).warnings.is_empty());
        monitor.observe("", &[call("search", 1)], &ok(1));
        let report = monitor.check(2, 50);
        assert_eq!(report.terminate, None);
        assert_eq!(
            report.warnings[0].0.as_str(),
            "repetition_warning",
            "warned at 80 % of the limit"
        );
        monitor.observe("", &[call("search", 1)], &ok(1));
        let stop = monitor.check(3, 50).terminate.unwrap();
        assert_eq!(stop.termination, Termination::DuplicateTools);
        assert!(
            stop.detail.contains("'search'") && stop.detail.contains("3 turns"),
            "{}",
            stop.detail
        );
    }

    #[test]
    fn a_parallel_batch_is_not_a_repetition() {
        let mut monitor = RecursionMonitor::default();
        monitor.observe(
            "",
            &[call("read", 1), call("read", 1), call("read", 1), call("read", 1)],
            &ok(4),
        );
        let report = monitor.check(1, 50);
        assert_eq!(report.terminate, None);
        assert!(report.warnings.is_empty());
    }

    #[test]
    fn loops_and_the_iteration_warning() {
        let mut monitor = RecursionMonitor::default();
        for turn in 0..4 {
            monitor.observe("", &[call(if turn % 2 == 0 { "a" } else { "b" }, 0)], &ok(1));
        }
        let stop = monitor.check(4, 50).terminate.unwrap();
        assert_eq!(stop.termination, Termination::LoopDetected);
        assert_eq!(stop.detail, "the same 2 turns repeated back to back");

        let mut monitor = RecursionMonitor::new(MonitorConfig {
            duplicate_threshold: 10,
            ..MonitorConfig::default()
        });
        for turn in 0..6 {
            monitor.observe("", &[call("same", 0)], &ok(1));
            assert_eq!(monitor.check(turn + 1, 50).terminate, None, "repetition is not a loop");
        }

        let mut monitor = RecursionMonitor::default();
        assert!(monitor.check(7, 10).warnings.is_empty());
        let report = monitor.check(8, 10);
        assert_eq!(
            report.warnings[0].1,
            "⚠️ Approaching iteration limit (2 remaining). Please work towards completing the task."
        );
        assert!(monitor.check(9, 10).warnings.is_empty(), "warned once");
    }

    #[test]
    fn failures_while_exploring_are_normal_work() {
        // Two failed reads of four calls: the old rule stopped here.
        let mut monitor = RecursionMonitor::default();
        monitor.observe("", &[call("read", 1), call("read", 2)], &failed(2));
        monitor.observe("", &[call("read", 3), call("read", 4)], &ok(2));
        assert_eq!(monitor.check(2, 50), MonitorReport::default());
        // Half of many calls failing is still work going on.
        let mut monitor = RecursionMonitor::default();
        for turn in 0..10 {
            let results = if turn % 2 == 0 { failed(1) } else { ok(1) };
            monitor.observe("", &[call("read", turn)], &results);
            assert_eq!(monitor.check(turn as u32 + 1, 50).terminate, None);
        }
    }

    #[test]
    fn most_of_the_latest_calls_failing_stops_the_tools() {
        let mut monitor = RecursionMonitor::default();
        for turn in 0..5 {
            monitor.observe("", &[call("read", turn)], &ok(1));
        }
        // 7 of the last 10 failed: a warning; 8 of 10: the stop.
        for turn in 5..12 {
            monitor.observe("", &[call("read", turn)], &failed(1));
        }
        let report = monitor.check(12, 50);
        assert_eq!(report.terminate, None);
        assert_eq!(report.warnings[0].0.as_str(), "error_rate_warning");
        assert!(
            report.warnings[0].1.contains("7 of your last 10"),
            "{:?}",
            report.warnings
        );
        monitor.observe("", &[call("read", 12)], &failed(1));
        let stop = monitor.check(13, 50).terminate.unwrap();
        assert_eq!(stop.termination, Termination::ErrorThreshold);
        assert_eq!(stop.detail, "8 of the last 10 tool calls failed, over 8 turns");

        // Every call failing: warned at 7, stopped at 8, before the window fills.
        let mut monitor = RecursionMonitor::default();
        for turn in 0..6 {
            monitor.observe("", &[call("read", turn)], &failed(1));
            assert_eq!(monitor.check(turn as u32 + 1, 50), MonitorReport::default());
        }
        monitor.observe("", &[call("read", 6)], &failed(1));
        assert_eq!(monitor.check(7, 50).warnings[0].0.as_str(), "error_rate_warning");
        monitor.observe("", &[call("read", 7)], &failed(1));
        assert_eq!(
            monitor.check(8, 50).terminate.unwrap().detail,
            "8 of the last 8 tool calls failed, over 8 turns"
        );
    }

    #[test]
    fn one_batch_of_wrong_guesses_is_one_mistake() {
        let mut monitor = RecursionMonitor::default();
        let guesses: Vec<ToolCall> = (0..10).map(|i| call("read", i)).collect();
        monitor.observe("", &guesses, &failed(10));
        let report = monitor.check(1, 50);
        assert_eq!(report.terminate, None, "one turn of failures");
        assert_eq!(report.warnings[0].0.as_str(), "error_rate_warning", "but a warning");
        monitor.observe("", &[call("read", 11), call("read", 12)], &failed(2));
        assert_eq!(monitor.check(2, 50).terminate, None, "two turns");
        monitor.observe("", &[call("read", 13)], &failed(1));
        assert!(monitor.check(3, 50).terminate.is_some(), "three turns of failures");
    }

    #[test]
    fn a_disabled_monitor_says_nothing() {
        let mut monitor = RecursionMonitor::new(MonitorConfig {
            enabled: false,
            ..MonitorConfig::default()
        });
        for turn in 0..15 {
            monitor.observe("", &[call("same", 0)], &failed(1));
            assert_eq!(monitor.check(turn + 1, 50), MonitorReport::default());
        }
        // The step limit's warning is not the monitor's: it stays.
        assert_eq!(monitor.check(40, 50).warnings[0].0.as_str(), "iteration_warning");
    }

    #[test]
    fn thresholds_are_validated() {
        assert!(MonitorConfig::default().validate().is_ok());
        for (config, words) in [
            (
                MonitorConfig {
                    error_threshold: 0.0,
                    ..MonitorConfig::default()
                },
                "error_threshold",
            ),
            (
                MonitorConfig {
                    error_threshold: 1.5,
                    ..MonitorConfig::default()
                },
                "error_threshold",
            ),
            (
                MonitorConfig {
                    warning_ratio: -0.1,
                    ..MonitorConfig::default()
                },
                "warning_ratio",
            ),
            (
                MonitorConfig {
                    loop_window: 1,
                    ..MonitorConfig::default()
                },
                "loop_window",
            ),
            (
                MonitorConfig {
                    error_window: 0,
                    ..MonitorConfig::default()
                },
                "error_window",
            ),
            (
                MonitorConfig {
                    duplicate_threshold: 1,
                    ..MonitorConfig::default()
                },
                "duplicate_threshold",
            ),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.starts_with(words), "{err}");
        }
    }
}
