//! An agent from a file: `agents/NAME.md` (docs/agents.md).

use serde::Deserialize;

use super::{front_matter, name, DefinitionError};

/// A sub-agent the `task` tool can run: who it is, what it may use, and
/// its instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDefinition {
    /// What a `task` call names it by.
    pub name: String,
    /// What it is for: the model reads it to choose.
    pub description: String,
    /// The tools it may use, by name (MCP tools as `SERVER__tool`); `None`:
    /// the parent's. Always within the parent's tools and policy.
    pub tools: Option<Vec<String>>,
    /// Its model, when not the parent's.
    pub model: Option<String>,
    /// Its step limit, when not the parent's.
    pub max_steps: Option<u32>,
    /// The body of the file: its system prompt.
    pub instructions: String,
    /// Keys of the front matter Loom does not read (from files written for
    /// other tools, like Claude Code's `color`); shown, never an error.
    pub ignored: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Fields {
    name: String,
    description: String,
    #[serde(default)]
    tools: Option<ToolList>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_steps: Option<u32>,
}

/// The keys Loom reads; any other is kept in [`AgentDefinition::ignored`].
const KEYS: &[&str] = &["name", "description", "tools", "model", "max_steps"];

/// `tools: [read_file, grep]`, or as Claude Code writes it, `tools: read_file, grep`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ToolList {
    List(Vec<String>),
    Text(String),
}

/// The providers an agent's model may name (as `--model` takes them; a
/// scripted model is a file path, which a project's file must not choose).
const PROVIDERS: &[&str] = &["openai", "anthropic"];

/// Checks `model` as `PROVIDER:NAME`.
fn check_model(model: &str) -> Result<(), DefinitionError> {
    let well_formed = model.split_once(':').is_some_and(|(provider, name)| {
        PROVIDERS.contains(&provider) && !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c.is_control())
    });
    if well_formed {
        return Ok(());
    }
    Err(DefinitionError::of_key(
        "model",
        format!(
            "{model:?} is not a model: write PROVIDER:NAME with {} (like \"openai:gpt-4o-mini\"), or leave the key out for the parent's",
            PROVIDERS.join(" or ")
        ),
    ))
}

impl AgentDefinition {
    /// Reads an agent file's text.
    pub fn parse(text: &str) -> Result<Self, DefinitionError> {
        let document = front_matter::read::<Fields>(text)?;
        let ignored = document.unknown_keys(KEYS);
        let fields = document.fields;
        name::check(&fields.name)?;
        name::check_description(&fields.description)?;
        let tools = match fields.tools {
            None => None,
            Some(ToolList::List(list)) => Some(list),
            Some(ToolList::Text(text)) => Some(
                text.split(',')
                    .map(str::trim)
                    .filter(|tool| !tool.is_empty())
                    .map(str::to_string)
                    .collect(),
            ),
        };
        if let Some(tools) = &tools {
            if let Some(bad) = tools
                .iter()
                .find(|tool| tool.trim().is_empty() || tool.chars().any(char::is_whitespace))
            {
                return Err(DefinitionError::of_key("tools", format!("{bad:?} is not a tool name")));
            }
        }
        if let Some(model) = &fields.model {
            check_model(model)?;
        }
        if fields.max_steps == Some(0) {
            return Err(DefinitionError::of_key("max_steps", "max_steps must be at least 1"));
        }
        if document.body.is_empty() {
            return Err(DefinitionError::of_key(
                "instructions",
                "the file has no instructions: write them after the front matter",
            ));
        }
        Ok(Self {
            name: fields.name,
            description: fields.description.trim().to_string(),
            tools,
            model: fields.model,
            max_steps: fields.max_steps,
            instructions: document.body,
            ignored,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_file_is_read() {
        let agent = AgentDefinition::parse(
            "---\nname: reviewer\ndescription: Reviews a diff for bugs.\ntools: [read_file, grep, files__search]\n\
             model: openai:gpt-4o-mini\nmax_steps: 8\ncolor: blue\n---\nYou review code.\n",
        )
        .unwrap();
        assert_eq!(agent.name, "reviewer");
        assert_eq!(
            agent.tools.as_deref(),
            Some(&["read_file".to_string(), "grep".into(), "files__search".into()][..])
        );
        assert_eq!(agent.model.as_deref(), Some("openai:gpt-4o-mini"));
        assert_eq!(agent.max_steps, Some(8));
        assert_eq!(agent.instructions, "You review code.");
        assert_eq!(agent.ignored, ["color"]);
    }

    #[test]
    fn tools_written_as_claude_code_writes_them_are_read() {
        let agent = AgentDefinition::parse("---\nname: a\ndescription: d\ntools: read_file, grep\n---\nGo.").unwrap();
        assert_eq!(agent.tools.unwrap(), ["read_file", "grep"]);
        let agent = AgentDefinition::parse("---\nname: a\ndescription: d\n---\nGo.").unwrap();
        assert_eq!(agent.tools, None);
    }

    #[test]
    fn what_is_wrong_names_the_key() {
        let cases = [
            ("---\nname: Code Reviewer\ndescription: d\n---\nGo.", "name"),
            ("---\nname: a\n---\nGo.", "description"),
            ("---\nname: a\ndescription: \"  \"\n---\nGo.", "description"),
            ("---\nname: a\ndescription: d\nmax_steps: 0\n---\nGo.", "max_steps"),
            ("---\nname: a\ndescription: d\nmax_steps: -1\n---\nGo.", "max_steps"),
            (
                "---\nname: a\ndescription: d\ntools: [\"read file\"]\n---\nGo.",
                "tools",
            ),
            ("---\nname: a\ndescription: d\n---\n", "instructions"),
            (
                "---\nname: a\ndescription: d\nmodel: scripted:/etc/passwd\n---\nGo.",
                "model",
            ),
            ("---\nname: a\ndescription: d\nmodel: \" \"\n---\nGo.", "model"),
            ("---\nname: a\ndescription: d\nmodel: foo:bar\n---\nGo.", "model"),
            (
                "---\nname: a\ndescription: d\nmodel: \"openai:gpt 4\"\n---\nGo.",
                "model",
            ),
        ];
        for (text, key) in cases {
            let err = AgentDefinition::parse(text).unwrap_err();
            assert_eq!(err.key.as_deref(), Some(key), "{text}: {err}");
        }
    }
}
