//! `task`: hands part of the work to a sub-agent — a run of its own with a
//! fresh conversation, a subset of this run's tools, its own step limit,
//! and what is left of this run's budgets. Its answer (or how it stopped)
//! is the result. Several `task` calls of one turn run in parallel.

use loom_core::{ChildEnd, ChildReport, ChildRequest, RunMetrics, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

/// The longest answer passed back whole; a longer one keeps its head and
/// tail (the pipeline's output limit still applies on top).
const ANSWER_MAX_CHARS: usize = 16_000;

/// Arguments of `task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    /// A few words for people.
    pub description: String,
    /// The whole task: the sub-agent sees nothing else.
    pub prompt: String,
    /// Tools it may use, from yours (default: your read-only ones).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Its step limit (default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub max_steps: Option<u32>,
}

/// Starts a sub-agent and returns its answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Task;

impl Tool for Task {
    type Args = TaskArgs;

    fn name(&self) -> &str {
        loom_core::delegate::TASK_TOOL
    }

    fn description(&self) -> &str {
        "Hand a self-contained part of the work to a sub-agent; returns its answer and how it ended. \
         It sees only `prompt`. Calls in one answer run in parallel."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    /// Made again after a crash, the call finds its sub-agent (the child's
    /// run id comes from the call's) and resumes it from its checkpoint, or
    /// reports how it ended.
    fn resumable(&self) -> bool {
        true
    }

    /// The sub-agent runs under its own time limit (no more than this run
    /// has left), not the default timeout of one tool call.
    fn bounds_own_time(&self) -> bool {
        true
    }

    async fn call(&self, args: TaskArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if args.prompt.trim().is_empty() {
            return Err(ToolError::InvalidArguments("prompt must not be empty".into()));
        }
        let Some(sub_agents) = ctx.sub_agents.clone() else {
            return Err(ToolError::Failed(
                "sub-agents cannot be started here (the nesting limit is reached)".into(),
            ));
        };
        let request = ChildRequest {
            call_id: ctx.call_id.clone(),
            description: args.description.clone(),
            prompt: args.prompt,
            tools: args.tools,
            max_steps: args.max_steps,
        };
        let report = sub_agents
            .run_child(request, ctx.cancel.clone())
            .await
            .map_err(|err| ToolError::Failed(format!("the sub-agent could not start: {err}")))?;
        let text = describe(&args.description, &report);
        match report.end {
            ChildEnd::Completed => Ok(text.into()),
            _ => Err(ToolError::Failed(text)),
        }
    }
}

/// The result the model reads: how the child ended, its answer or why it
/// has none, what it used.
fn describe(description: &str, report: &ChildReport) -> String {
    let mut text = format!("sub-agent {} ({description}): {}\n", report.run_id, report.end.as_str());
    match (&report.answer, &report.reason) {
        (Some(answer), _) => {
            text.push_str("answer:\n");
            text.push_str(&capped(answer));
            text.push('\n');
        }
        (None, Some(reason)) => text.push_str(&format!("no answer: {reason}\n")),
        (None, None) => text.push_str("no answer\n"),
    }
    text.push_str(&usage(&report.metrics));
    text
}

fn usage(metrics: &RunMetrics) -> String {
    let mut line = format!(
        "usage: {} input + {} output tokens, {} model calls, {} tool calls",
        metrics.input_tokens, metrics.output_tokens, metrics.llm_calls, metrics.tool_calls
    );
    if let Some(cost) = metrics.cost_usd {
        line.push_str(&format!(", ${cost:.4}"));
    }
    line
}

fn capped(answer: &str) -> String {
    let chars = answer.chars().count();
    if chars <= ANSWER_MAX_CHARS {
        return answer.to_string();
    }
    let half = ANSWER_MAX_CHARS / 2;
    let head: String = answer.chars().take(half).collect();
    let tail: String = answer.chars().skip(chars - half).collect();
    format!(
        "{head}\n[… {} characters of the answer left out …]\n{tail}",
        chars - 2 * half
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_answer_keeps_its_head_and_tail() {
        let answer = format!("{}{}", "a".repeat(ANSWER_MAX_CHARS), "z".repeat(10));
        let kept = capped(&answer);
        assert!(kept.starts_with('a') && kept.ends_with('z'));
        assert!(kept.contains("10 characters of the answer left out"));
    }

    #[test]
    fn only_a_completed_child_shows_an_answer() {
        let report = ChildReport {
            run_id: "r.1".into(),
            end: ChildEnd::BudgetExhausted,
            answer: None,
            reason: Some("its tokens budget was used up".into()),
            metrics: RunMetrics::default(),
        };
        let text = describe("count", &report);
        assert!(text.starts_with("sub-agent r.1 (count): budget exhausted\nno answer: its tokens budget"));
    }
}
