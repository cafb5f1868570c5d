//! Redaction of secrets in tool output (seed 002's output sanitization).

use std::borrow::Cow;

use regex::Regex;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Shapes of credentials that must never reach the model or the logs.
const SECRET_SHAPES: &[&str] = &[
    // OpenAI (sk-, sk-proj-) and Anthropic (sk-ant-) API keys.
    r"sk-[A-Za-z0-9_\-]{20,}",
    // GitHub tokens.
    r"gh[pousr]_[A-Za-z0-9]{36,}",
    r"github_pat_[A-Za-z0-9_]{22,}",
    // Bearer tokens in headers or logs.
    r"(?i)bearer\s+[A-Za-z0-9\-._~+/]+=*",
    // AWS access key ids.
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    // Slack tokens.
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    // Google API keys.
    r"AIza[0-9A-Za-z_\-]{35}",
    // PEM private keys.
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
];

/// Environment variables whose values are secrets, by name suffix.
const SECRET_ENV_SUFFIXES: &[&str] = &["_KEY", "_TOKEN", "_SECRET"];

/// Values shorter than this are not redacted by value (too likely to be ordinary text).
const MIN_SECRET_VALUE_LEN: usize = 8;

/// Replaces secrets in text with `[REDACTED]`.
#[derive(Debug, Clone)]
pub struct Redactor {
    pattern: Option<Regex>,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::from_env()
    }
}

impl Redactor {
    /// Known secret shapes plus the values of this process's environment
    /// variables whose names end in `_KEY`, `_TOKEN` or `_SECRET`.
    pub fn from_env() -> Self {
        let values = std::env::vars().filter_map(|(name, value)| {
            let upper = name.to_ascii_uppercase();
            SECRET_ENV_SUFFIXES
                .iter()
                .any(|suffix| upper.ends_with(suffix))
                .then_some(value)
        });
        Self::with_secrets(values)
    }

    /// Known secret shapes plus the given literal values.
    pub fn with_secrets(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|value| value.trim().len() >= MIN_SECRET_VALUE_LEN)
            .collect();
        // Longest first, so a value containing another is removed whole.
        values.sort_by_key(|value| std::cmp::Reverse(value.len()));
        values.dedup();
        let alternatives: Vec<String> = values
            .iter()
            .map(|value| regex::escape(value))
            .chain(SECRET_SHAPES.iter().map(|shape| shape.to_string()))
            .collect();
        Self {
            pattern: Regex::new(&alternatives.join("|")).ok(),
        }
    }

    /// A redactor that changes nothing.
    pub fn disabled() -> Self {
        Self { pattern: None }
    }

    /// `text` with every secret replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.pattern {
            Some(pattern) => pattern.replace_all(text, REDACTED),
            None => Cow::Borrowed(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_known_shapes_and_given_values() {
        let redactor = Redactor::with_secrets(vec!["hunter2-but-longer".to_string(), "short".to_string()]);
        let text = format!(
            "openai sk-{} github ghp_{} auth: Bearer abc.def-ghi== aws AKIAABCDEFGHIJKLMNOP pw hunter2-but-longer short",
            "a".repeat(48),
            "b".repeat(36)
        );
        let out = redactor.redact(&text);
        assert!(!out.contains("sk-aaaa"), "{out}");
        assert!(!out.contains("ghp_bbbb"), "{out}");
        assert!(!out.contains("abc.def"), "{out}");
        assert!(!out.contains("AKIAABCD"), "{out}");
        assert!(!out.contains("hunter2"), "{out}");
        assert!(out.contains("short"), "short values are left alone: {out}");
        assert_eq!(out.matches(REDACTED).count(), 5, "{out}");
        let pem = "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----\ny";
        assert_eq!(redactor.redact(pem), format!("x\n{REDACTED}\ny"));
        assert_eq!(redactor.redact("nothing secret"), "nothing secret");
    }
}
