//! Feedback between turns (docs/context.md): the tool results are analysed and the
//! first matching `TaskHandler` (or the default) writes guidance for the
//! next request. The default speaks only when there is a signal — a call
//! failed — and never invents progress figures: a model does not need to be
//! told to continue after every tool turn, and each reminder costs tokens.

use crate::tool_result::{ToolResult, ToolStatus};

crate::wire::wire_enum! {
    /// Why guidance was written, as reported in `guidance.injected`.
    pub enum GuidanceReason {
        /// A call of the last turn failed (the default feedback).
        Error = "error",
        /// A task handler's feedback.
        TaskHandler = "task_handler",
        /// The same call kept getting the same result.
        RepetitionWarning = "repetition_warning",
        /// Many of the latest calls failed.
        ErrorRateWarning = "error_rate_warning",
        /// The step limit is near.
        IterationWarning = "iteration_warning",
        /// The final-answer call at the step limit.
        MaxSteps = "max_steps",
        /// The final-answer call after the monitor saw repetition.
        DuplicateTools = "duplicate_tools",
        /// The final-answer call after the monitor saw a loop.
        LoopDetected = "loop_detected",
        /// The final-answer call after too many errors.
        ErrorThreshold = "error_threshold",
        /// An answer cut off by the output limit is continued.
        ContinueAnswer = "continue_answer",
        /// An empty answer is asked for once more.
        EmptyAnswer = "empty_answer",
        /// An answer that only repeated an error is asked for once more.
        ErrorEcho = "error_echo",
        /// An answer that described the work without using a tool is asked for once more.
        DescribedWork = "described_work",
        /// An answer given without touching the files the task names (reading
        /// those there, writing those not) is asked for once more.
        UntouchedFiles = "untouched_files",
    }
}

impl GuidanceReason {
    /// Whether this guidance sends an answer back for work the model did
    /// not do (an error echoed, work described, files the task names never
    /// touched): the retry must then call a tool.
    pub fn asks_for_action(self) -> bool {
        matches!(self, Self::ErrorEcho | Self::DescribedWork | Self::UntouchedFiles)
    }
}

/// What a turn's tool results say about progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultAnalysis {
    /// Some result carries data.
    pub has_data: bool,
    /// Some result failed or reports an error.
    pub has_errors: bool,
    /// The results suggest the task is done.
    pub suggests_completion: bool,
    /// A rough 0–1 score of how complete the task looks.
    pub completeness_score: f64,
    /// Results analysed.
    pub results: usize,
    /// Of which failed.
    pub failures: usize,
    /// The tools whose calls failed, in call order, each once.
    pub failed_tools: Vec<String>,
}

const DATA_WORDS: [&str; 6] = ["data", "found", "retrieved", "table", "schema", "rows"];
const ERROR_WORDS: [&str; 4] = ["error", "failed", "exception", "not found"];
const DONE_WORDS: [&str; 5] = ["complete", "finished", "done", "ready", "success"];
const ANALYSIS_WORDS: [&str; 4] = ["analysis", "summary", "conclusion", "insights"];

/// Whether `word` occurs in `text` at its start or after a space (any
/// occurrence, overlapping ones included).
fn starts_a_word(text: &str, word: &str) -> bool {
    let word = word.as_bytes();
    text.as_bytes().starts_with(word)
        || text
            .as_bytes()
            .windows(word.len() + 1)
            .any(|window| window[0] == b' ' && &window[1..] == word)
}

/// Analyses a turn's results by status and by the keywords below.
pub fn analyze(results: &[ToolResult]) -> ResultAnalysis {
    let mut analysis = ResultAnalysis {
        results: results.len(),
        ..ResultAnalysis::default()
    };
    let mut score: f64 = 0.0;
    for result in results {
        let text = result.content.to_lowercase();
        if result.status.is_failure() || ERROR_WORDS.iter().any(|w| starts_a_word(&text, w)) {
            analysis.has_errors = true;
        }
        if result.status.is_failure() {
            analysis.failures += 1;
            if !analysis.failed_tools.contains(&result.name) {
                analysis.failed_tools.push(result.name.clone());
            }
            continue;
        }
        if result.status == ToolStatus::Success
            && (!text.trim().is_empty() && (DATA_WORDS.iter().any(|w| text.contains(w)) || text.len() > 40))
        {
            analysis.has_data = true;
            score += 0.3;
        }
        if DONE_WORDS.iter().any(|w| text.contains(w)) {
            analysis.suggests_completion = true;
            score += 0.5;
        }
        if ANALYSIS_WORDS.iter().any(|w| text.contains(w)) {
            score += 0.4;
        }
    }
    analysis.completeness_score = score.min(1.0);
    analysis
}

/// Writes guidance for a kind of task.
pub trait TaskHandler: Send + Sync {
    /// Whether this handler knows the task.
    fn can_handle(&self, task: &str) -> bool;

    /// The guidance for the next turn, or `None` for none.
    fn generate_guidance(&self, task: &str, analysis: &ResultAnalysis, depth: u32) -> Option<String>;
}

/// The default guidance: when a call failed, a short pointer to the errors;
/// nothing otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultGuidance;

impl DefaultGuidance {
    /// The reason reported in `guidance.injected`: `error` when a call
    /// failed, `None` (no guidance) otherwise.
    pub fn reason(analysis: &ResultAnalysis) -> Option<GuidanceReason> {
        (analysis.failures > 0).then_some(GuidanceReason::Error)
    }
}

impl TaskHandler for DefaultGuidance {
    fn can_handle(&self, _task: &str) -> bool {
        true
    }

    fn generate_guidance(&self, _task: &str, analysis: &ResultAnalysis, _depth: u32) -> Option<String> {
        Self::reason(analysis)?;
        let tools = analysis.failed_tools.join(", ");
        let count = if analysis.results == 1 {
            "The tool call failed".to_string()
        } else {
            format!("{} of the {} tool calls failed", analysis.failures, analysis.results)
        };
        // Not "say so in your answer": a small model takes that as leave
        // to stop at the first failure; the monitor ends real loops.
        Some(format!(
            "{count} ({tools}). The error in the result says what went wrong: fix the arguments and call again, \
             or try another tool."
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_word_counts_at_the_start_or_after_a_space_only() {
        for (text, found) in [
            ("error: no such file", true),
            ("the call failed", true),
            ("1 item not found here", true),
            ("errors", true),
            ("terror", false),
            ("unfailed\nexception", false),
            ("", false),
        ] {
            assert_eq!(ERROR_WORDS.iter().any(|w| starts_a_word(text, w)), found, "{text:?}");
        }
        // After a space, even where an earlier occurrence overlaps it.
        assert!(starts_a_word("xno no no", "no no"));
    }

    #[test]
    fn analysis_and_default_guidance() {
        let ok = ToolResult::new("c", "t", ToolStatus::Success, "found 3 rows of data");
        let failed = ToolResult::new("c", "t", ToolStatus::Error, "Error: no such file");
        let done = ToolResult::new("c", "t", ToolStatus::Success, "Migration finished");
        let analysis = analyze(std::slice::from_ref(&ok));
        assert!(analysis.has_data && !analysis.has_errors);
        // Success, even one that suggests the task is done, needs no guidance.
        assert_eq!(DefaultGuidance::reason(&analysis), None);
        assert_eq!(DefaultGuidance.generate_guidance("fix the bug", &analysis, 7), None);
        assert_eq!(DefaultGuidance::reason(&analyze(std::slice::from_ref(&done))), None);
        let mixed = analyze(&[ok, failed, done]);
        assert_eq!(mixed.failed_tools, vec!["t".to_string()]);
        assert_eq!(
            DefaultGuidance::reason(&mixed).map(GuidanceReason::as_str),
            Some("error")
        );
        let text = DefaultGuidance.generate_guidance("fix the bug", &mixed, 1).unwrap();
        assert!(text.starts_with("1 of the 3 tool calls failed (t)."), "{text}");
        assert!(!text.contains('%'), "no invented progress figures: {text}");
    }
}
