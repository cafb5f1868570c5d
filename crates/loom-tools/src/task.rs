//! `task`: hands part of the work to a sub-agent — a run of its own with a
//! fresh conversation, a subset of this run's tools, its own step limit,
//! and what is left of this run's budgets. Its answer (or how it stopped)
//! is the result. Several `task` calls of one turn run in parallel.

use std::sync::Arc;

use loom_core::{
    ChildAgent, ChildEnd, ChildReport, ChildRequest, RunMetrics, Tool, ToolContext, ToolError, ToolOutput,
};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::definitions::AgentDefinition;

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
    /// One of the agents this tool's description lists: the sub-agent
    /// gets its instructions, tools and model.
    #[serde(default)]
    pub agent: Option<String>,
}

/// The most characters of agent listing in the tool's description: it is
/// sent with every request, and the agents come with a project.
const MAX_LISTING_CHARS: usize = 16_000;

/// An agent's description as listed, at most.
const MAX_AGENT_DESCRIPTION_CHARS: usize = 300;

/// What the tool says of itself with no agents defined.
const DESCRIPTION: &str =
    "Hand a self-contained part of the work to a sub-agent; returns its answer and how it ended. \
                           It sees only `prompt`. Calls in one answer run in parallel.";

/// Starts a sub-agent and returns its answer.
#[derive(Debug, Clone)]
pub struct Task {
    /// Agents defined in files, by name (docs/agents.md).
    agents: Arc<[AgentDefinition]>,
    /// The description, with the agents listed.
    description: Arc<str>,
}

impl Default for Task {
    fn default() -> Self {
        Self::new()
    }
}

impl Task {
    /// The tool with no agents defined.
    pub fn new() -> Self {
        Self::with_agents(Vec::new())
    }

    /// The tool offering `agents` by name; its description lists each
    /// one's name and description so the model can choose.
    pub fn with_agents(agents: Vec<AgentDefinition>) -> Self {
        let mut description = DESCRIPTION.to_string();
        if !agents.is_empty() {
            description
                .push_str("\n\nAgents you can name in `agent` (each with its own instructions, tools and model):");
            for (listed, agent) in agents.iter().enumerate() {
                if description.len() > MAX_LISTING_CHARS {
                    description.push_str(&format!(
                        "\n(and {} more agents, not listed here)",
                        agents.len() - listed
                    ));
                    break;
                }
                let about = loom_core::text::clip(&agent.description, MAX_AGENT_DESCRIPTION_CHARS, "…");
                description.push_str(&format!("\n- {}: {about}", agent.name));
            }
        }
        Self {
            agents: agents.into(),
            description: description.into(),
        }
    }

    /// What a call asks for, with its agent's settings: the call's
    /// `tools` must be among the agent's; its `max_steps` overrides the
    /// agent's.
    fn request(&self, args: TaskArgs, call_id: String) -> Result<ChildRequest, ToolError> {
        let Some(name) = args.agent else {
            return Ok(ChildRequest {
                call_id,
                description: args.description,
                prompt: args.prompt,
                tools: args.tools,
                max_steps: args.max_steps,
                agent: None,
            });
        };
        let Some(agent) = self.agents.iter().find(|agent| agent.name == name) else {
            let known: Vec<&str> = self.agents.iter().map(|agent| agent.name.as_str()).collect();
            return Err(ToolError::InvalidArguments(if known.is_empty() {
                format!("there is no agent {name:?}: no agents are defined; leave out `agent`")
            } else {
                format!("there is no agent {name:?}; the agents are: {}", known.join(", "))
            }));
        };
        let tools = match (args.tools, &agent.tools) {
            (Some(asked), Some(own)) => {
                if let Some(outside) = asked.iter().find(|tool| !own.contains(tool)) {
                    return Err(ToolError::InvalidArguments(format!(
                        "the agent {name} may not use {outside}; its tools are: {}",
                        own.join(", ")
                    )));
                }
                Some(asked)
            }
            (asked, own) => asked.or_else(|| own.clone()),
        };
        Ok(ChildRequest {
            call_id,
            description: args.description,
            prompt: args.prompt,
            max_steps: args.max_steps.or(agent.max_steps),
            agent: Some(ChildAgent {
                name: agent.name.clone(),
                instructions: agent.instructions.clone(),
                model: agent.model.clone(),
                all_tools: tools.is_none(),
            }),
            tools,
        })
    }
}

impl Tool for Task {
    type Args = TaskArgs;

    fn name(&self) -> &str {
        loom_core::delegate::TASK_TOOL
    }

    fn description(&self) -> &str {
        &self.description
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
        let description = args.description.clone();
        let request = self.request(args, ctx.call_id.clone())?;
        let report = sub_agents
            .run_child(request, ctx.cancel.clone())
            .await
            .map_err(|err| ToolError::Failed(format!("the sub-agent could not start: {err}")))?;
        let text = describe(&description, &report);
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
    fn the_agent_listing_is_bounded() {
        let agents: Vec<AgentDefinition> = (0..3_000)
            .map(|n| {
                AgentDefinition::parse(&format!(
                    "---\nname: agent-{n}\ndescription: {}\n---\nGo.",
                    "d".repeat(1_000)
                ))
                .unwrap()
            })
            .collect();
        let task = Task::with_agents(agents);
        let description = task.description();
        assert!(description.len() < MAX_LISTING_CHARS + 1_000, "{}", description.len());
        assert!(
            description.ends_with("more agents, not listed here)"),
            "{}",
            &description[description.len() - 80..]
        );
    }

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
