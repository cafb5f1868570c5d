//! Agents and skills defined in files (docs/agents.md): Markdown with YAML
//! front matter, found in the workspace's `.loom/` and the user's
//! `~/.config/loom/`.
//!
//! - an agent, `agents/NAME.md`: `name`, `description`, `tools`, `model`,
//!   `max_steps`; the body is its instructions;
//! - a skill, `skills/NAME/SKILL.md` (the agentskills.io format): `name`,
//!   `description`; the body is what the model loads when it needs it, and
//!   the files beside it are the skill's to read.
//!
//! Parsing is pure ([`AgentDefinition::parse`], [`SkillDefinition::parse`]);
//! [`discover`] reads the folders, beneath each base so that a link cannot
//! lead out of it, and keeps what is wrong with a broken file (its line and
//! key) beside what loaded.

mod agent;
mod discover;
mod front_matter;
mod name;
mod skill;

pub use agent::AgentDefinition;
pub(crate) use discover::read_beneath;
pub use discover::{discover, Definitions, Found, Kind, Place, Problem, MAX_FILE_BYTES};
pub use skill::SkillDefinition;

/// Why a definition file was not loaded, and where in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}{}", line.map(|n| format!("line {n}: ")).unwrap_or_default(), key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default())]
pub struct DefinitionError {
    /// The file's line, counted from 1, when known.
    pub line: Option<usize>,
    /// The front matter's key concerned, when known.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl DefinitionError {
    pub(crate) fn at(line: usize, key: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            line: Some(line),
            key: key.map(str::to_string),
            message: message.into(),
        }
    }

    pub(crate) fn of_key(key: &str, message: impl Into<String>) -> Self {
        Self {
            line: None,
            key: Some(key.to_string()),
            message: message.into(),
        }
    }
}
