//! Permission rules: `allow` / `ask` / `deny` per tool, with optional
//! argument globs such as `write_file(path=docs/**)`.
//!
//! Precedence: rules given as overrides (the command line) are consulted
//! before the configured rules; within one layer the most specific matching
//! rule wins — more argument patterns first, then an exact tool name over a
//! tool glob, then longer literal text; on a tie the stricter decision wins
//! (deny over ask over allow). When no rule matches, `default` decides.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use globset::{GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a rule says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Run it.
    Allow,
    /// Ask a person first.
    Ask,
    /// Never run it.
    Deny,
}

impl Decision {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }
}

impl FromStr for Decision {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "allow" => Ok(Self::Allow),
            "ask" => Ok(Self::Ask),
            "deny" => Ok(Self::Deny),
            other => Err(PolicyError::BadDecision(other.to_string())),
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not allow, ask or deny.
    #[error("'{0}' is not a permission: use allow, ask or deny")]
    BadDecision(String),
    /// The rule text is malformed.
    #[error("permission rule '{rule}' is malformed: {reason}")]
    BadRule {
        /// The rule as written.
        rule: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Clone)]
struct ArgPattern {
    key: String,
    /// `*` stops at `/`, on the value as a normalized path: what an
    /// `allow` rule lets through is no more than it says.
    strict: GlobMatcher,
    /// `*` crosses `/`, on the value as written or as a path: a `deny` or
    /// `ask` rule on a command (`bash(command=rm *)`) also holds for
    /// `rm -rf /home/me`.
    generous: GlobMatcher,
}

impl ArgPattern {
    fn matches(&self, value: &Value, workspace: &Path, decision: Decision) -> bool {
        let normalized = comparable(value, workspace);
        match decision {
            Decision::Allow => self.strict.is_match(&normalized),
            Decision::Ask | Decision::Deny => {
                let raw = match value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                self.generous.is_match(&raw) || self.generous.is_match(&normalized)
            }
        }
    }
}

/// One rule: a tool pattern, optional argument patterns, and a decision.
#[derive(Debug, Clone)]
pub struct Rule {
    pattern: String,
    tool: GlobMatcher,
    tool_is_exact: bool,
    args: Vec<ArgPattern>,
    decision: Decision,
}

fn glob(text: &str, rule: &str) -> Result<GlobMatcher, PolicyError> {
    glob_with(text, rule, true)
}

fn glob_with(text: &str, rule: &str, literal_separator: bool) -> Result<GlobMatcher, PolicyError> {
    GlobBuilder::new(text)
        .literal_separator(literal_separator)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|err| PolicyError::BadRule {
            rule: rule.to_string(),
            reason: err.to_string(),
        })
}

impl Rule {
    /// Parses `tool` or `tool(key=glob, key=glob)`. The tool may be a glob (`*`, `mcp_*`).
    pub fn parse(pattern: &str, decision: Decision) -> Result<Self, PolicyError> {
        let bad = |reason: &str| PolicyError::BadRule {
            rule: pattern.to_string(),
            reason: reason.to_string(),
        };
        let text = pattern.trim();
        let (tool, inner) = match text.find('(') {
            Some(open) => {
                let inner = text[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| bad("an argument list must end with ')'"))?;
                (text[..open].trim(), Some(inner))
            }
            None => (text, None),
        };
        if tool.is_empty() {
            return Err(bad("the tool name is empty"));
        }
        let mut args = Vec::new();
        for part in inner.map(split_top_level).unwrap_or_default() {
            let (key, value) = part.split_once('=').ok_or_else(|| bad("write arguments as key=glob"))?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() {
                return Err(bad("write arguments as key=glob"));
            }
            args.push(ArgPattern {
                key: key.to_string(),
                strict: glob(value, pattern)?,
                generous: glob_with(value, pattern, false)?,
            });
        }
        if inner.is_some() && args.is_empty() {
            return Err(bad("the argument list is empty"));
        }
        Ok(Self {
            pattern: text.to_string(),
            tool: glob(tool, pattern)?,
            tool_is_exact: !tool.contains(['*', '?', '[', '{']),
            args,
            decision,
        })
    }

    /// The rule as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// What the rule decides.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the rule constrains arguments (not just the tool).
    pub fn has_arguments(&self) -> bool {
        !self.args.is_empty()
    }

    fn matches(&self, tool: &str, args: &Value, workspace: &Path) -> bool {
        self.tool.is_match(tool)
            && self.args.iter().all(|pattern| {
                args.get(&pattern.key)
                    .is_some_and(|value| pattern.matches(value, workspace, self.decision))
            })
    }

    fn specificity(&self) -> (usize, bool, usize, Decision) {
        let literal = self.pattern.chars().filter(|c| !"*?[]{}".contains(*c)).count();
        (self.args.len(), self.tool_is_exact, literal, self.decision)
    }
}

/// Splits on commas that are not inside `{…}` alternations.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (index, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The form of an argument value that rules are matched against. Strings are
/// normalized as paths (`./` dropped, `..` resolved, absolute paths inside the
/// workspace made relative), so `docs/../secrets/key` is judged as
/// `secrets/key` and cannot slip past a rule.
fn comparable(value: &Value, workspace: &Path) -> String {
    let Value::String(text) = value else {
        return value.to_string();
    };
    let path = Path::new(text);
    let relative = if path.is_absolute() {
        path.strip_prefix(workspace).unwrap_or(path)
    } else {
        path
    };
    let mut parts: Vec<String> = Vec::new();
    let mut absolute = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.last().is_some_and(|p| p != "..") {
                    parts.pop();
                } else {
                    parts.push("..".to_string());
                }
            }
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::RootDir | Component::Prefix(_) => absolute.push(component.as_os_str()),
        }
    }
    let joined = parts.join("/");
    if absolute.as_os_str().is_empty() {
        if joined.is_empty() {
            text.clone()
        } else {
            joined
        }
    } else {
        format!("{}{joined}", absolute.to_string_lossy())
    }
}

/// What the policy decided and which rule decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The decision.
    pub decision: Decision,
    /// The rule that decided, or `None` for the default.
    pub rule: Option<String>,
    /// Whether that rule constrains arguments.
    pub rule_has_arguments: bool,
    /// True when the mode decided (no rule matched and the mode allows the
    /// tool by default).
    pub by_mode: bool,
}

/// A set of rules with a default.
#[derive(Debug, Clone)]
pub struct PermissionPolicy {
    overrides: Vec<Rule>,
    rules: Vec<Rule>,
    default: Decision,
    mode: super::Mode,
}

impl Default for PermissionPolicy {
    /// Everything is allowed: an embedding application decides what its tools may do.
    fn default() -> Self {
        Self::new(Decision::Allow)
    }
}

impl PermissionPolicy {
    /// A policy with no rules and the given default.
    pub fn new(default: Decision) -> Self {
        Self {
            overrides: Vec::new(),
            rules: Vec::new(),
            default,
            mode: super::Mode::Default,
        }
    }

    /// Sets the permission mode: what it allows replaces the default's
    /// decision for those tools; every rule still decides first.
    pub fn set_mode(&mut self, mode: super::Mode) {
        self.mode = mode;
    }

    /// The permission mode.
    pub fn mode(&self) -> super::Mode {
        self.mode
    }

    /// Changes the default.
    pub fn set_default(&mut self, default: Decision) {
        self.default = default;
    }

    /// The default decision.
    pub fn default_decision(&self) -> Decision {
        self.default
    }

    /// Adds a configured rule (`tool` or `tool(key=glob)`).
    pub fn add_rule(&mut self, pattern: &str, decision: Decision) -> Result<(), PolicyError> {
        self.rules.push(Rule::parse(pattern, decision)?);
        Ok(())
    }

    /// Adds a rule that is consulted before every configured rule (the command line).
    pub fn add_override(&mut self, pattern: &str, decision: Decision) -> Result<(), PolicyError> {
        self.overrides.push(Rule::parse(pattern, decision)?);
        Ok(())
    }

    /// Builder form of [`PermissionPolicy::add_rule`].
    pub fn rule(mut self, pattern: &str, decision: Decision) -> Result<Self, PolicyError> {
        self.add_rule(pattern, decision)?;
        Ok(self)
    }

    /// Decides about one call. `workspace` makes absolute paths comparable.
    pub fn evaluate(&self, tool: &str, args: &Value, workspace: &Path) -> Verdict {
        for layer in [&self.overrides, &self.rules] {
            let best = layer
                .iter()
                .filter(|rule| rule.matches(tool, args, workspace))
                .max_by_key(|rule| rule.specificity());
            if let Some(rule) = best {
                return Verdict {
                    decision: rule.decision,
                    rule: Some(rule.pattern.clone()),
                    rule_has_arguments: rule.has_arguments(),
                    by_mode: false,
                };
            }
        }
        let by_mode = self.mode.allows_by_default(tool);
        Verdict {
            decision: if by_mode { Decision::Allow } else { self.default },
            rule: None,
            rule_has_arguments: false,
            by_mode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deny_and_ask_rules_on_commands_match_across_slashes_but_allow_rules_do_not() {
        let workspace = Path::new("/ws");
        let policy = PermissionPolicy::new(Decision::Ask)
            .rule("bash(command=rm *)", Decision::Deny)
            .unwrap()
            .rule("bash(command=curl *)", Decision::Ask)
            .unwrap()
            .rule("bash(command=ls *)", Decision::Allow)
            .unwrap()
            .rule("write_file(path=docs/*)", Decision::Allow)
            .unwrap();
        let bash = |command: &str| {
            policy
                .evaluate("bash", &json!({ "command": command }), workspace)
                .decision
        };
        assert_eq!(bash("rm -rf /home/me"), Decision::Deny);
        assert_eq!(bash("rm -rf ../../x"), Decision::Deny);
        assert_eq!(bash("curl https://example.com/a"), Decision::Ask);
        assert_eq!(bash("ls src"), Decision::Allow);
        assert_eq!(bash("ls /etc"), Decision::Ask, "an allow rule's `*` stops at `/`");
        let write = |path: &str| {
            policy
                .evaluate("write_file", &json!({ "path": path }), workspace)
                .decision
        };
        assert_eq!(write("docs/a.md"), Decision::Allow);
        assert_eq!(write("docs/deep/a.md"), Decision::Ask);
    }

    #[test]
    fn a_mode_changes_only_what_the_default_decides() {
        let workspace = Path::new("/ws");
        let mut policy = PermissionPolicy::new(Decision::Ask)
            .rule("edit_file(path=secret/**)", Decision::Deny)
            .unwrap()
            .rule("bash(command=rm *)", Decision::Ask)
            .unwrap()
            .rule("*(path=*.pem)", Decision::Deny)
            .unwrap();
        let write = |path: &str| json!({"path": path, "content": "x"});
        policy.set_mode(super::super::Mode::AcceptEdits);
        assert_eq!(
            policy.evaluate("write_file", &write("a.txt"), workspace).decision,
            Decision::Allow
        );
        assert_eq!(
            policy.evaluate("edit_file", &write("secret/a"), workspace).decision,
            Decision::Deny
        );
        assert_eq!(
            policy.evaluate("write_file", &write("key.pem"), workspace).decision,
            Decision::Deny
        );
        assert_eq!(
            policy.evaluate("bash", &json!({"command": "ls"}), workspace).decision,
            Decision::Ask
        );
        policy.set_mode(super::super::Mode::Bypass);
        assert_eq!(
            policy.evaluate("bash", &json!({"command": "ls"}), workspace).decision,
            Decision::Allow
        );
        assert_eq!(
            policy
                .evaluate("bash", &json!({"command": "rm -rf x"}), workspace)
                .decision,
            Decision::Ask
        );
        assert_eq!(
            policy.evaluate("write_file", &write("key.pem"), workspace).decision,
            Decision::Deny
        );
        policy.set_mode(super::super::Mode::Plan);
        assert_eq!(
            policy.evaluate("write_file", &write("a.txt"), workspace).decision,
            Decision::Ask
        );
    }

    fn policy() -> PermissionPolicy {
        PermissionPolicy::new(Decision::Ask)
            .rule("read_file", Decision::Allow)
            .unwrap()
            .rule("write_file", Decision::Ask)
            .unwrap()
            .rule("write_file(path=docs/**)", Decision::Allow)
            .unwrap()
            .rule("write_file(path=docs/secret/**)", Decision::Deny)
            .unwrap()
            .rule("bash", Decision::Deny)
            .unwrap()
            .rule("*(path=*.pem)", Decision::Deny)
            .unwrap()
    }

    fn decide(tool: &str, args: Value) -> Decision {
        policy().evaluate(tool, &args, Path::new("/ws")).decision
    }

    #[test]
    fn most_specific_rule_wins() {
        assert_eq!(decide("write_file", json!({"path": "docs/a.md"})), Decision::Allow);
        assert_eq!(decide("write_file", json!({"path": "docs/deep/a.md"})), Decision::Allow);
        assert_eq!(decide("write_file", json!({"path": "src/a.rs"})), Decision::Ask);
        assert_eq!(decide("write_file", json!({"path": "docs/secret/k"})), Decision::Deny);
        assert_eq!(decide("read_file", json!({"path": "x"})), Decision::Allow);
        assert_eq!(
            decide("read_file", json!({"path": "key.pem"})),
            Decision::Deny,
            "an argument rule beats a tool rule"
        );
        assert_eq!(decide("bash", json!({})), Decision::Deny);
        assert_eq!(decide("other", json!({})), Decision::Ask, "the default");
    }

    #[test]
    fn paths_are_normalized_before_matching() {
        assert_eq!(decide("write_file", json!({"path": "./docs/a.md"})), Decision::Allow);
        assert_eq!(
            decide("write_file", json!({"path": "docs/../src/a.rs"})),
            Decision::Ask,
            "no escape through docs/.."
        );
        assert_eq!(
            decide("write_file", json!({"path": "docs/x/../secret/k"})),
            Decision::Deny
        );
        assert_eq!(decide("write_file", json!({"path": "/ws/docs/a.md"})), Decision::Allow);
        assert_eq!(decide("write_file", json!({"path": "/etc/docs/a.md"})), Decision::Ask);
    }

    #[test]
    fn overrides_come_before_configured_rules() {
        let mut policy = policy();
        policy.add_override("bash", Decision::Allow).unwrap();
        policy.add_override("write_file", Decision::Deny).unwrap();
        let ws = Path::new("/ws");
        assert_eq!(policy.evaluate("bash", &json!({}), ws).decision, Decision::Allow);
        assert_eq!(
            policy.evaluate("write_file", &json!({"path": "docs/a"}), ws).decision,
            Decision::Deny
        );
    }

    #[test]
    fn ties_go_to_the_stricter_decision_and_bad_rules_are_refused() {
        let policy = PermissionPolicy::new(Decision::Allow)
            .rule("t", Decision::Allow)
            .unwrap()
            .rule("t", Decision::Deny)
            .unwrap();
        assert_eq!(
            policy.evaluate("t", &json!({}), Path::new("/")).decision,
            Decision::Deny
        );
        assert!(Rule::parse("write_file(path=docs/**", Decision::Allow).is_err());
        assert!(Rule::parse("write_file()", Decision::Allow).is_err());
        assert!(Rule::parse("write_file(path)", Decision::Allow).is_err());
        assert!("maybe".parse::<Decision>().is_err());
        let braces = Rule::parse("edit_file(path={a,b}/*, old_string=*)", Decision::Allow).unwrap();
        assert!(braces.matches("edit_file", &json!({"path": "b/x", "old_string": "y"}), Path::new("/")));
    }
}
