//! What a person's "always" grants for the rest of a session.

/// What an "always" answer covers from then on in its session: later calls
/// it covers run without asking (`Authority::Session`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionGrant {
    /// Every call of the tool.
    Tool(String),
    /// The calls a rule that constrains arguments matches (its pattern, as
    /// written): asked by that rule, "always" grants the rule, not the tool.
    Rule(String),
    /// The calls of the tool a hook asks about for the same reason.
    Hook {
        /// The tool.
        tool: String,
        /// The hook's reason, if it gave one.
        reason: Option<String>,
    },
}

impl std::fmt::Display for SessionGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tool(tool) => write!(f, "tool {tool}"),
            Self::Rule(rule) => write!(f, "rule {rule}"),
            Self::Hook { tool, reason: None } => write!(f, "hook on {tool}"),
            Self::Hook {
                tool,
                reason: Some(reason),
            } => write!(f, "hook on {tool} ({reason})"),
        }
    }
}
