//! A custom tool written as a plain Rust struct, run by an agent whose model
//! is scripted (no API key needed). Prints every event as a JSON line, then
//! the outcome.
//!
//!     cargo run -p loom --example custom_tool

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::{Agent, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

/// The arguments the model must send; the doc comments become the schema's
/// descriptions.
#[derive(Debug, Deserialize, JsonSchema)]
struct WordCountArgs {
    /// The text whose words to count.
    text: String,
}

/// Counts the words of a text.
struct WordCount;

impl Tool for WordCount {
    type Args = WordCountArgs;

    fn name(&self) -> &str {
        "word_count"
    }

    fn description(&self) -> &str {
        "Count the words in a text."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: WordCountArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        Ok(format!("{} words", args.text.split_whitespace().count()).into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // What a real model would answer: first a tool call, then the answer.
    let model = ScriptedModel::new(vec![
        ScriptTurn {
            tool_calls: vec![ScriptToolCall {
                name: "word_count".into(),
                arguments: json!({"text": "the quick brown fox jumps over the lazy dog"}),
                id: None,
            }],
            ..ScriptTurn::default()
        },
        ScriptTurn {
            content: Some("The sentence has 9 words.".into()),
            ..ScriptTurn::default()
        },
    ]);

    let agent = Agent::builder().model(model).tool(WordCount).max_steps(5).build()?;
    let mut run = agent.run("How many words are in 'the quick brown fox jumps over the lazy dog'?");
    while let Some(event) = run.next_event().await {
        println!("{}", serde_json::to_string(&event)?);
    }
    let outcome = run.outcome().await;
    eprintln!(
        "status: {}, answer: {}",
        outcome.status.as_str(),
        outcome.content.unwrap_or_default()
    );
    Ok(())
}
