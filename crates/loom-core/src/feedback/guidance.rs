//! Feedback between turns (seed 003): the tool results are analysed, the
//! first matching `TaskHandler` (or the default) writes guidance for the
//! next turn, and after turn 3 a depth hint says how far the run has come.

use crate::tool_result::{ToolResult, ToolStatus};

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
}

const DATA_WORDS: [&str; 6] = ["data", "found", "retrieved", "table", "schema", "rows"];
const ERROR_WORDS: [&str; 4] = ["error", "failed", "exception", "not found"];
const DONE_WORDS: [&str; 5] = ["complete", "finished", "done", "ready", "success"];
const ANALYSIS_WORDS: [&str; 4] = ["analysis", "summary", "conclusion", "insights"];

/// Analyses a turn's results by status and by the keywords of seed 003.
pub fn analyze(results: &[ToolResult]) -> ResultAnalysis {
    let mut analysis = ResultAnalysis {
        results: results.len(),
        ..ResultAnalysis::default()
    };
    let mut score: f64 = 0.0;
    for result in results {
        let text = result.content.to_lowercase();
        if result.status.is_failure()
            || ERROR_WORDS
                .iter()
                .any(|w| text.starts_with(w) || text.contains(&format!(" {w}")))
        {
            analysis.has_errors = true;
        }
        if result.status.is_failure() {
            analysis.failures += 1;
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

/// Seed 003's default guidance: finish, recover from errors, or continue.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultGuidance;

impl DefaultGuidance {
    /// The reason reported in `guidance.injected`.
    pub fn reason(analysis: &ResultAnalysis, depth: u32) -> &'static str {
        if analysis.suggests_completion || depth >= 6 {
            "completion"
        } else if analysis.has_errors {
            "error"
        } else {
            "continue"
        }
    }
}

impl TaskHandler for DefaultGuidance {
    fn can_handle(&self, _task: &str) -> bool {
        true
    }

    fn generate_guidance(&self, task: &str, analysis: &ResultAnalysis, depth: u32) -> Option<String> {
        Some(match Self::reason(analysis, depth) {
            "completion" => format!(
                "The tool calls are done. Complete the task based on the results above: {task}\n\nGive a complete, accurate final answer."
            ),
            "error" => format!(
                "A tool ran into a problem. Try again to complete the task: {task}\n\nSuggestions:\n- check that the tool's arguments are right\n- try a different tool or approach\n- if the problem persists, explain the error"
            ),
            _ => format!(
                "Continue with the task: {task}\n\nProgress so far: {:.0}%\nSuggestion: use more tools to gather what is missing, or work with the results you already have.",
                analysis.completeness_score * 100.0
            ),
        })
    }
}

/// Seed 003's depth hint, given after turn 3.
pub fn depth_hint(turn: u32, max_turns: u32) -> Option<String> {
    if turn <= 3 {
        return None;
    }
    let progress = if max_turns == 0 {
        100.0
    } else {
        turn as f64 * 100.0 / max_turns as f64
    };
    Some(format!(
        "🔄 Recursion status:\n- Depth: {turn}/{max_turns} ({progress:.0}% of maximum)\n- Remaining iterations: {}\n\nPlease review the tool results above and make meaningful progress towards completing the task.\nAvoid calling the same tool repeatedly with the same arguments unless necessary.\nIf you have enough information, please provide your final answer.",
        max_turns.saturating_sub(turn)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_and_default_guidance() {
        let ok = ToolResult::new("c", "t", ToolStatus::Success, "found 3 rows of data");
        let failed = ToolResult::new("c", "t", ToolStatus::Error, "Error: no such file");
        let done = ToolResult::new("c", "t", ToolStatus::Success, "Migration finished");
        let analysis = analyze(std::slice::from_ref(&ok));
        assert!(analysis.has_data && !analysis.has_errors);
        assert_eq!(DefaultGuidance::reason(&analysis, 1), "continue");
        assert_eq!(DefaultGuidance::reason(&analyze(&[ok, failed]), 1), "error");
        assert_eq!(DefaultGuidance::reason(&analyze(&[done]), 1), "completion");
        let text = DefaultGuidance.generate_guidance("fix the bug", &analysis, 1).unwrap();
        assert!(text.starts_with("Continue with the task: fix the bug"));
        assert_eq!(depth_hint(3, 10), None);
        assert!(depth_hint(4, 10).unwrap().contains("Depth: 4/10 (40% of maximum)"));
    }
}
