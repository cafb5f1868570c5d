//! An agent file (`agents/NAME.md`) and a skill file (`SKILL.md`): YAML
//! front matter and a body, through the parsers `loom` reads them with
//! (`loom_tools::definitions`). What loads keeps the rules of the format;
//! what does not says where.

use loom_tools::definitions::{AgentDefinition, DefinitionError, SkillDefinition};

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match AgentDefinition::parse(text) {
        Ok(agent) => {
            plain_name(&agent.name);
            described(&agent.description);
            assert!(
                !agent.instructions.is_empty() && text.contains(&agent.instructions),
                "instructions invented"
            );
            assert!(agent.max_steps != Some(0), "max_steps 0 loaded");
            for tool in agent.tools.iter().flatten() {
                assert!(
                    !tool.is_empty() && !tool.contains(char::is_whitespace),
                    "tool {tool:?} loaded"
                );
            }
        }
        Err(err) => located(&err, text),
    }
    // A skill's folder is its name; try the name the text would give.
    let folder = text
        .lines()
        .find_map(|line| line.strip_prefix("name:"))
        .map(|name| name.trim().trim_matches('"'))
        .unwrap_or("skill");
    match SkillDefinition::parse(text, folder) {
        Ok(skill) => {
            plain_name(&skill.name);
            assert_eq!(skill.name, folder, "a skill loaded under another folder's name");
            described(&skill.description);
            assert!(!skill.body.is_empty() && text.contains(&skill.body), "body invented");
        }
        Err(err) => located(&err, text),
    }
}

fn plain_name(name: &str) {
    assert!(
        (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.starts_with('-')
            && !name.ends_with('-')
            && !name.contains("--"),
        "name {name:?} loaded"
    );
}

fn described(description: &str) {
    assert!(!description.trim().is_empty(), "an empty description loaded");
    assert!(
        description.chars().count() <= 1024,
        "a description over 1024 characters loaded"
    );
}

/// An error names a line of the text (or none) and a key that is not empty.
fn located(err: &DefinitionError, text: &str) {
    if let Some(line) = err.line {
        assert!(
            line >= 1 && line <= text.split('\n').count() + 1,
            "line {line} of {}: {err}",
            text.lines().count()
        );
    }
    if let Some(key) = &err.key {
        assert!(!key.is_empty(), "an empty key: {err}");
    }
    assert!(!err.message.is_empty(), "an error without a message");
}
