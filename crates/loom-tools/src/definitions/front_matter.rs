//! A Markdown file that starts with YAML front matter between two `---`
//! lines (the format of Claude Code's agent files and of agentskills.io's
//! `SKILL.md`): the front matter read into a typed value, the rest kept as
//! the body. Errors name the file's line and, when known, the key.

use serde::de::DeserializeOwned;

use super::DefinitionError;

/// The front matter read as `T`, and the body after it.
#[derive(Debug)]
pub(crate) struct Document<T> {
    pub(crate) fields: T,
    /// The front matter's keys, as written.
    pub(crate) keys: Vec<String>,
    /// Everything after the closing `---` line, trimmed.
    pub(crate) body: String,
}

impl<T> Document<T> {
    /// The front matter's keys that are none of `known` (kept, not an
    /// error: other tools' files have keys of their own).
    pub(crate) fn unknown_keys(&self, known: &[&str]) -> Vec<String> {
        self.keys
            .iter()
            .filter(|key| !known.contains(&key.as_str()))
            .cloned()
            .collect()
    }
}

/// Reads `text`: `---`, YAML, `---`, then the body.
pub(crate) fn read<T: DeserializeOwned>(text: &str) -> Result<Document<T>, DefinitionError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err(DefinitionError::at(
            1,
            None,
            "the file must start with a line `---`, then the front matter (name, description, …) and a closing `---`",
        ));
    }
    // Find the closing line; the YAML is what lies between.
    let yaml_start = first.len();
    let mut offset = yaml_start;
    let mut closing = None;
    for line in lines {
        if line.trim_end() == "---" {
            closing = Some((offset, offset + line.len()));
            break;
        }
        offset += line.len();
    }
    let Some((yaml_end, body_start)) = closing else {
        return Err(DefinitionError::at(
            1,
            None,
            "the front matter is not closed: add a line `---` after it",
        ));
    };
    let yaml = text.get(yaml_start..yaml_end).unwrap_or_default();
    limits(yaml)?;
    let body = text.get(body_start..).unwrap_or_default().trim().to_string();
    // An empty front matter is an empty mapping, so a missing key is named
    // as missing.
    let yaml = if yaml.trim().is_empty() { "{}" } else { yaml };
    let keys = match serde_yaml::from_str::<serde_yaml::Value>(yaml).map_err(|err| located(&err, yaml))? {
        serde_yaml::Value::Mapping(mapping) => mapping
            .keys()
            .map(|key| match key {
                serde_yaml::Value::String(key) => key.clone(),
                other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
            })
            .collect(),
        _ => {
            return Err(DefinitionError::at(
                2,
                None,
                "the front matter must be keys and values (`name: …`)",
            ))
        }
    };
    let fields = serde_yaml::from_str::<T>(yaml).map_err(|err| located(&err, yaml))?;
    Ok(Document { fields, keys, body })
}

/// The most bytes of front matter read: far above any real one.
pub(crate) const MAX_FRONT_MATTER_BYTES: usize = 32 * 1024;

/// The deepest nesting of `[` and `{` read. The YAML parser's time grows
/// with the square of the depth before it gives up at its own limit, so a
/// file of brackets could hold a listing (or a run's start) for minutes.
const MAX_FLOW_DEPTH: usize = 64;

/// Refuses front matter too big or too deeply nested to be real, before
/// the YAML parser sees it.
fn limits(yaml: &str) -> Result<(), DefinitionError> {
    if yaml.len() > MAX_FRONT_MATTER_BYTES {
        return Err(DefinitionError::at(
            2,
            None,
            format!(
                "the front matter has {} bytes; at most {MAX_FRONT_MATTER_BYTES}",
                yaml.len()
            ),
        ));
    }
    let mut depth = 0usize;
    for (index, byte) in yaml.bytes().enumerate() {
        match byte {
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > MAX_FLOW_DEPTH {
            let line = yaml.get(..index).map_or(0, |before| before.matches('\n').count()) + 2;
            return Err(DefinitionError::at(
                line,
                None,
                format!("the front matter nests brackets more than {MAX_FLOW_DEPTH} deep"),
            ));
        }
    }
    Ok(())
}

/// `err` with the file's line (the YAML starts on line 2) and the key
/// written on that line or named in the message.
fn located(err: &serde_yaml::Error, yaml: &str) -> DefinitionError {
    let message = err.to_string();
    // serde_yaml appends " at line L column C"; the line is given apart.
    let message = message.split(" at line ").next().unwrap_or(&message).trim().to_string();
    // Counted from the error's byte offset in newlines, not from the YAML
    // parser's line, which also counts a lone carriage return.
    let line_in_yaml = err.location().map(|location| {
        let before = yaml.get(..location.index().min(yaml.len())).unwrap_or(yaml);
        before.matches('\n').count() + 1
    });
    // A missing key is named in the message (its location is the mapping's
    // start); any other error's key is the one written on its line.
    let key = named_in(&message).or_else(|| {
        line_in_yaml
            .and_then(|n| yaml.split('\n').nth(n.saturating_sub(1)))
            .and_then(|written| written.split_once(':'))
            .map(|(key, _)| key.trim().trim_start_matches("- ").trim().to_string())
            .filter(|key| !key.is_empty())
    });
    // serde_yaml starts a nested error with its path ("max_steps: …"),
    // which the key already says.
    let message = match &key {
        Some(key) => message
            .strip_prefix(key.as_str())
            .and_then(|rest| rest.strip_prefix(": "))
            .map_or(message.clone(), str::to_string),
        None => message,
    };
    DefinitionError {
        line: line_in_yaml.map(|n| n + 1),
        key,
        message,
    }
}

/// The field a message like "missing field `description`" names.
fn named_in(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("missing field ")
        .or_else(|| message.strip_prefix("duplicate field "))?;
    let (_, rest) = rest.split_once('`')?;
    let (key, _) = rest.split_once('`')?;
    Some(key.to_string())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Fields {
        name: String,
        #[serde(default)]
        count: Option<u32>,
    }

    #[test]
    fn front_matter_and_body_are_apart() {
        let doc: Document<Fields> = read("---\nname: reviewer\ncount: 3\n---\n\nReview the diff.\n").unwrap();
        assert_eq!(doc.fields.name, "reviewer");
        assert_eq!(doc.fields.count, Some(3));
        assert_eq!(doc.body, "Review the diff.");
        assert_eq!(doc.keys, ["name", "count"]);
    }

    #[test]
    fn windows_line_ends_and_a_byte_order_mark_are_read() {
        let doc: Document<Fields> = read("\u{feff}---\r\nname: a\r\n---\r\nbody\r\n").unwrap();
        assert_eq!(doc.fields.name, "a");
        assert_eq!(doc.body, "body");
    }

    #[test]
    fn a_wrong_type_names_the_file_line_and_key() {
        let err = read::<Fields>("---\nname: a\ncount: many\n---\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert_eq!(err.key.as_deref(), Some("count"), "{err}");
    }

    #[test]
    fn a_lone_carriage_return_does_not_move_the_line() {
        let err = read::<Fields>("---\n\r\r\rname: a\ncount: x\n---\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
    }

    #[test]
    fn deep_or_huge_front_matter_is_refused_before_parsing() {
        let deep = format!(
            "---\nname: a\nx: {}{}\n---\nbody",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        // Refused by the check, not by the parser's own recursion limit
        // (which it reaches only after seconds of work).
        let err = read::<Fields>(&deep).unwrap_err();
        assert!(err.message.contains("more than 64 deep"), "{err}");
        assert_eq!(err.line, Some(3));
        let huge = format!("---\nname: a\nx: \"{}\"\n---\nbody", "y".repeat(40_000));
        assert!(read::<Fields>(&huge).unwrap_err().message.contains("at most"));
        // Brackets as YAML uses them pass.
        let doc: Document<Fields> = read("---\nname: a\ncount: 2\nx: [[1, 2], {a: [3]}]\n---\nbody").unwrap();
        assert_eq!(doc.fields.name, "a");
    }

    #[test]
    fn a_missing_key_is_named() {
        let err = read::<Fields>("---\ncount: 1\n---\n").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("name"), "{err}");
        let err = read::<Fields>("---\n---\nbody").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("name"), "{err}");
    }

    #[test]
    fn a_file_without_front_matter_or_its_end_is_refused() {
        assert_eq!(read::<Fields>("# Reviewer\n").unwrap_err().line, Some(1));
        let err = read::<Fields>("---\nname: a\n").unwrap_err();
        assert!(err.message.contains("not closed"), "{err}");
        assert_eq!(read::<Fields>("---\n- a\n- b\n---\n").unwrap_err().line, Some(2));
    }
}
