//! A skill from a file: `skills/NAME/SKILL.md`, the agentskills.io format
//! (docs/agents.md, "Skills").

use serde::Deserialize;

use super::{front_matter, name, DefinitionError};

/// A skill: only its name and description enter the system prompt; the
/// model loads the body when it decides to, and reads the files beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillDefinition {
    /// Its name, the same as its folder's.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// The body of `SKILL.md`: the instructions the model loads.
    pub body: String,
    /// Keys of the front matter Loom does not read; shown, never an error.
    pub ignored: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Fields {
    name: String,
    description: String,
}

/// Keys the format defines that Loom reads or accepts as they are
/// (`license`, `compatibility`, `metadata`, `allowed-tools`).
const KEYS: &[&str] = &[
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
];

impl SkillDefinition {
    /// Reads a `SKILL.md`'s text; `folder` is the name of the folder it is
    /// in, which the format requires to be the skill's name.
    pub fn parse(text: &str, folder: &str) -> Result<Self, DefinitionError> {
        let document = front_matter::read::<Fields>(text)?;
        let ignored = document.unknown_keys(KEYS);
        let fields = document.fields;
        name::check(&fields.name)?;
        if fields.name != folder {
            return Err(DefinitionError::of_key(
                "name",
                format!("the name {:?} is not its folder's, {folder:?}", fields.name),
            ));
        }
        name::check_description(&fields.description)?;
        if document.body.is_empty() {
            return Err(DefinitionError::of_key(
                "instructions",
                "SKILL.md has nothing after the front matter: write the skill's instructions there",
            ));
        }
        Ok(Self {
            name: fields.name,
            description: fields.description.trim().to_string(),
            body: document.body,
            ignored,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skill_file_is_read() {
        let skill = SkillDefinition::parse(
            "---\nname: pdf-forms\ndescription: Fills PDF forms. Use when asked to fill a PDF.\nlicense: MIT\n\
             metadata:\n  author: someone\n---\n# Filling forms\n\nRun scripts/fill.py.\n",
            "pdf-forms",
        )
        .unwrap();
        assert_eq!(skill.name, "pdf-forms");
        assert!(skill.body.starts_with("# Filling forms"));
        assert!(skill.ignored.is_empty());
    }

    #[test]
    fn a_name_that_is_not_its_folders_is_refused() {
        let err = SkillDefinition::parse("---\nname: pdf\ndescription: d\n---\nGo.", "pdf-forms").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("name"));
    }

    #[test]
    fn a_long_description_is_refused() {
        let text = format!("---\nname: a\ndescription: {}\n---\nGo.", "x".repeat(1025));
        assert_eq!(
            SkillDefinition::parse(&text, "a").unwrap_err().key.as_deref(),
            Some("description")
        );
    }
}
