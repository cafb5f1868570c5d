//! A file's text into [`FileConfig`], or an error that says where.

use thiserror::Error;

use crate::FileConfig;

/// Why a text is not a configuration, and where in it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}{message}{}", line.map(|n| format!("{n}: ")).unwrap_or_default(), key.as_ref().map(|k| format!(" ({k})")).unwrap_or_default())]
pub struct ParseError {
    /// The line the parser stopped at, counted from 1, when it knows.
    pub line: Option<usize>,
    /// The key written on that line, when the line has one.
    pub key: Option<String>,
    /// What is wrong, on one line.
    pub message: String,
}

/// Parses `text` as loom.toml. Unknown keys are errors, so a typo does not
/// pass silently.
pub fn parse(text: &str) -> Result<FileConfig, ParseError> {
    toml::from_str(text).map_err(|err| {
        let line = err
            .span()
            .and_then(|span| text.get(..span.start))
            .map(|before| before.matches('\n').count() + 1);
        let key = line
            .and_then(|n| text.lines().nth(n - 1))
            .and_then(|written| written.split_once('='))
            .map(|(key, _)| key.trim().to_string());
        ParseError {
            line,
            key,
            message: err.message().trim().to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let err = parse("model = \"scripted:x.yaml\"\nmax_stpes = 3\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert_eq!(err.key.as_deref(), Some("max_stpes"));
        assert!(err.message.contains("unknown field"), "{err}");
        assert!(err.to_string().starts_with("2: unknown field"), "{err}");
    }

    #[test]
    fn a_wrong_type_is_named_in_its_section() {
        let err = parse("[server]\nmax_runs = \"many\"\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert_eq!(err.key.as_deref(), Some("max_runs"));
    }

    #[test]
    fn the_sections_are_read() {
        let file = parse(
            "model = \"openai:gpt-4o-mini\"\nmax_steps = 7\n[tools.bash]\nsandbox = \"landlock\"\n\
             [cluster]\nredis = \"redis://127.0.0.1:6379/0\"\n[prices.\"gpt-4o-mini\"]\n\
             input_per_mtok = 0.15\noutput_per_mtok = 0.6\n",
        )
        .unwrap();
        assert_eq!(file.max_steps, Some(7));
        assert_eq!(file.cluster_redis(), Some("redis://127.0.0.1:6379/0"));
        assert_eq!(file.prices["gpt-4o-mini"].output_per_mtok, 0.6);
        let bash = file.tools.and_then(|tools| tools.bash).unwrap();
        assert_eq!(bash.sandbox.as_deref(), Some("landlock"));
    }
}
