//! The names agents and skills may have (agentskills.io's rule): 1 to 64
//! lowercase letters, digits and hyphens, not starting or ending with a
//! hyphen, no two hyphens together. Names are what a model writes in a
//! `task` or `skill` call and what a folder is called, so they stay plain.

use super::DefinitionError;

/// The most characters a description may have (agentskills.io).
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 1024;

/// Checks `name` as the value of the key `name`.
pub(crate) fn check(name: &str) -> Result<(), DefinitionError> {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if name.is_empty()
        || name.len() > 64
        || !plain
        || name.starts_with('-')
        || name.ends_with('-')
        || name.contains("--")
    {
        return Err(DefinitionError::of_key(
            "name",
            format!(
                "{name:?} is not a name: use 1 to 64 lowercase letters, digits and single hyphens (like \"code-reviewer\")"
            ),
        ));
    }
    Ok(())
}

/// Checks a description: present, and not longer than the format allows.
pub(crate) fn check_description(description: &str) -> Result<(), DefinitionError> {
    if description.trim().is_empty() {
        return Err(DefinitionError::of_key(
            "description",
            "the description is empty: say what it is for and when to use it",
        ));
    }
    let chars = description.chars().count();
    if chars > MAX_DESCRIPTION_CHARS {
        return Err(DefinitionError::of_key(
            "description",
            format!("the description has {chars} characters; at most {MAX_DESCRIPTION_CHARS}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_others_are_refused() {
        for good in ["reviewer", "code-reviewer", "a1", "x"] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Reviewer",
            "code_reviewer",
            "-a",
            "a-",
            "a--b",
            "../x",
            "a b",
            &"a".repeat(65),
        ] {
            assert_eq!(check(bad).unwrap_err().key.as_deref(), Some("name"), "{bad}");
        }
    }
}
